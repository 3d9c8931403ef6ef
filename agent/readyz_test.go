package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/internal/testkit"
)

// TestReadyzFollowsTheDatastore: /readyz says "ok" once the agent is up;
// with etcd stopped it turns 503 "datastore unreachable" within the bound
// (two thirds of the lease TTL and a second, after etcd's last answer) and
// comes back once etcd returns (a new lease, after the client's backoff).
func TestReadyzFollowsTheDatastore(t *testing.T) {
	etcd := storetest.Etcd(t)
	a := newFakeAgent(t, etcd.Endpoints(), "node1", "198.18.0.11/24", testLogger())
	a.cfg.LeaseTTL = 3 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-a.wired:
	case err := <-done:
		t.Fatalf("agent stopped: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("agent never came up")
	}
	h := a.httpHandler()
	readyz := func() (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	ready := func() error {
		if code, body := readyz(); code != http.StatusOK {
			return &readyzErr{code, body}
		}
		return nil
	}
	testkit.Eventually(t, 20*time.Second, "ready with etcd up", ready)

	bound := a.lease.unreachableAfter() // 3 s for a TTL of 3 s
	if err := etcd.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	took := testkit.Eventually(t, bound+5*time.Second, "unready with etcd stopped", func() error {
		code, body := readyz()
		if code == http.StatusServiceUnavailable && strings.Contains(body, "datastore unreachable") {
			return nil
		}
		return &readyzErr{code, body}
	})
	t.Logf("unready %v after etcd stopped (bound %v after its last answer)", time.Since(stopped).Round(100*time.Millisecond), bound)
	if took > bound+3*time.Second {
		t.Errorf("unready only after %v, bound %v", took, bound)
	}
	if err := etcd.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	back := testkit.Eventually(t, 30*time.Second, "ready again with etcd back", ready)
	t.Logf("ready %v after etcd restarted", back.Round(100*time.Millisecond))
}

type readyzErr struct {
	code int
	body string
}

func (e *readyzErr) Error() string { return http.StatusText(e.code) + ": " + strings.TrimSpace(e.body) }
