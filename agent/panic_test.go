package agent

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/internal/testkit"
)

// A CNI step that panics fails the ADD with ErrInternal and its plan is
// undone (no endpoint, no address left), the agent goes on serving, and
// /healthz turns 503 naming the step, so that the kubelet restarts an
// agent whose state the panic may have left half-changed.
func TestStepPanicEndsLiveness(t *testing.T) {
	etcd := storetest.Etcd(t)
	routes := fake.NewRoutes()
	a := runAgent(t, newFakeAgentOn(t, etcd.Endpoints(), "node1", "198.18.0.11/24", testLogger(),
		Deps{Workloads: fake.NewWorkloads(routes), Routes: routes, Speaker: newFakeSpeaker(),
			CNIFault: func(step string) error {
				if step == "routes" {
					panic("injected")
				}
				return nil
			}}))
	ctx := t.Context()
	healthz := func() (int, string) {
		rec := httptest.NewRecorder()
		a.httpHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := healthz(); code != http.StatusOK {
		t.Fatalf("/healthz before the panic: %d %s", code, body)
	}
	testkit.Eventually(t, 20*time.Second, "the view synced", func() error {
		if !a.view.Synced() {
			return errors.New("not synced")
		}
		return nil
	})
	req, conf, args := addReq("panics")
	_, err := a.handler.Add(ctx, req, conf, args)
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrInternal || !strings.Contains(te.Msg, "routes panicked") {
		t.Fatalf("ADD: %v, want ErrInternal naming the routes step", err)
	}
	objs, _, err := a.store.List(ctx, api.KindWorkloadEndpoint, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 0 {
		t.Errorf("%d endpoints left after the panicking ADD", len(objs))
	}
	if got, err := a.ipam.Allocations(ctx); err != nil || len(got) != 0 {
		t.Errorf("allocations after the panicking ADD: %v (%v), want none", got, err)
	}
	if code, body := healthz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "step routes panicked: injected") {
		t.Errorf("/healthz after the panic: %d %s, want 503 naming the step", code, body)
	}
}
