package cni

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/tabbynet/tabby/internal/testkit"
)

func TestServerSocketPermissions(t *testing.T) {
	sock, _ := startServer(t, &fakeHandler{})
	for _, tc := range []struct {
		path string
		want fs.FileMode
	}{
		{filepath.Dir(sock), fs.ModeDir | 0o700},
		{sock, fs.ModeSocket | 0o600},
	} {
		fi, err := os.Stat(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != tc.want {
			t.Errorf("%s has mode %s, want %s", tc.path, fi.Mode(), tc.want)
		}
	}
}

func TestServerReplacesStaleSocket(t *testing.T) {
	path := filepath.Join(shortTempDir(t), "cni.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false) // an agent that crashed leaves its socket behind
	ln.Close()

	h := &fakeHandler{}
	srv := NewServer(path, h, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	select {
	case <-srv.Ready():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	if _, err := runShim(context.Background(), "ADD", "c1", "", netconf(t, "1.0.0", path, nil)); err != nil {
		t.Errorf("ADD via the replaced socket: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket left behind after shutdown: %v", err)
	}
}

func TestServerRefusesToReplaceOtherFiles(t *testing.T) {
	path := filepath.Join(shortTempDir(t), "cni.sock")
	if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := NewServer(path, &fakeHandler{}, nil).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Errorf("Run over a regular file: %v, want an error saying it is not a socket", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "precious" {
		t.Errorf("file was touched: %q", b)
	}
}

func TestServerRunTwice(t *testing.T) {
	_, srv := startServer(t, &fakeHandler{})
	if err := srv.Run(context.Background()); err == nil {
		t.Error("second Run succeeded")
	}
}

func TestServerMalformedRequest(t *testing.T) {
	sock, _ := startServer(t, &fakeHandler{})
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, `{"command": "ADD", "stdinData": 12`); err != nil {
		t.Fatal(err)
	}
	conn.(*net.UnixConn).CloseWrite()
	raw, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"error":{"code":6,"msg":"decoding the request","details":"unexpected EOF"}}`; string(raw) != want {
		t.Errorf("response %s, want %s", raw, want)
	}
}

func TestServerGracefulShutdown(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	h := &fakeHandler{add: func(context.Context, *Request) (*current.Result, error) {
		close(entered)
		<-release
		return testResult("eth0", "10.244.0.8"), nil
	}}
	path := filepath.Join(shortTempDir(t), "cni.sock")
	srv := NewServer(path, h, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	<-srv.Ready()

	type shimOut struct {
		out []byte
		err error
	}
	client := make(chan shimOut, 1)
	go func() {
		out, err := runShim(context.Background(), "ADD", "c1", "", netconf(t, "1.0.0", path, nil))
		client <- shimOut{out, err}
	}()
	<-entered
	cancel()
	// The listener goes away at once …
	testkit.Eventually(t, 10*time.Second, "the socket to be removed", testkit.Cond(func() bool {
		_, err := os.Lstat(path)
		return errors.Is(err, fs.ErrNotExist)
	}))
	if _, err := runShim(context.Background(), "DEL", "c2", "", netconf(t, "1.0.0", path, nil)); err == nil {
		t.Error("a new request was accepted after shutdown began")
	}
	// … but the request in flight finishes before Run returns.
	select {
	case err := <-done:
		t.Fatalf("Run returned while a request was in flight: %v", err)
	default:
	}
	close(release)
	got := <-client
	if got.err != nil {
		t.Fatalf("in-flight ADD: %v", got.err)
	}
	if _, err := version.NewResult("1.0.0", got.out); err != nil {
		t.Errorf("in-flight ADD result: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// Two requests for one container never overlap: the second waits on the
// container's lock until the first is done.
func TestServerSerialisesPerContainer(t *testing.T) {
	var active, overlaps atomic.Int32
	entered := make(chan string, 2)
	release := make(chan struct{})
	h := &fakeHandler{
		add: func(_ context.Context, req *Request) (*current.Result, error) {
			if active.Add(1) > 1 {
				overlaps.Add(1)
			}
			defer active.Add(-1)
			entered <- req.Command
			<-release
			return testResult("eth0", "10.244.0.5"), nil
		},
		del: func(_ context.Context, req *Request) error {
			if active.Add(1) > 1 {
				overlaps.Add(1)
			}
			defer active.Add(-1)
			entered <- req.Command
			<-release
			return nil
		},
	}
	sock, srv := startServer(t, h)
	stdin := netconf(t, "1.0.0", sock, nil)
	errs := make(chan error, 2)
	go func() { _, err := runShim(context.Background(), "ADD", "same", "", stdin); errs <- err }()
	first := <-entered
	go func() { _, err := runShim(context.Background(), "DEL", "same", "", stdin); errs <- err }()
	// The second request is at the lock, not in the handler.
	testkit.Eventually(t, 10*time.Second, "the second request to wait for the lock", testkit.Cond(func() bool { return srv.locks.waiters("same") == 2 }))
	select {
	case cmd := <-entered:
		t.Fatalf("%s entered the handler while %s was running", cmd, first)
	default:
	}
	release <- struct{}{}
	if second := <-entered; second == first {
		t.Errorf("%s ran twice", first)
	}
	release <- struct{}{}
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if n := overlaps.Load(); n != 0 {
		t.Errorf("%d overlapping requests for one container", n)
	}
	if n := srv.locks.waiters("same"); n != 0 {
		t.Errorf("lock still has %d holders", n)
	}
}

// Requests for different containers run at the same time: each handler
// waits until both are inside, which would time out if they were serialised.
func TestServerParallelAcrossContainers(t *testing.T) {
	var mu sync.Mutex
	inside := 0
	both := make(chan struct{})
	h := &fakeHandler{add: func(ctx context.Context, req *Request) (*current.Result, error) {
		mu.Lock()
		inside++
		if inside == 2 {
			close(both)
		}
		mu.Unlock()
		select {
		case <-both:
			return testResult("eth0", "10.244.0.5"), nil
		case <-ctx.Done():
			return nil, types.NewError(types.ErrInternal, "requests for different containers were serialised", "")
		}
	}}
	sock, _ := startServer(t, h)
	stdin := netconf(t, "1.0.0", sock, map[string]any{"timeout_seconds": 10})
	errs := make(chan error, 2)
	for _, id := range []string{"pod-a", "pod-b"} {
		go func() { _, err := runShim(context.Background(), "ADD", id, "", stdin); errs <- err }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestKeyedLocksHonourContext(t *testing.T) {
	var k KeyedLocks
	unlock, err := k.Lock(context.Background(), "c1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := k.Lock(ctx, "c1"); !errors.Is(err, context.Canceled) {
		t.Errorf("lock with a cancelled context: %v", err)
	}
	if n := k.waiters("c1"); n != 1 {
		t.Errorf("%d holders after the failed wait, want 1", n)
	}
	unlock()
	if n := len(k.locks); n != 0 {
		t.Errorf("%d locks left in the map", n)
	}
}

func TestKeyedLocksSerialisePerKey(t *testing.T) {
	var k KeyedLocks
	ctx := context.Background()
	unlock, err := k.Lock(ctx, "cali1")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 2)
	go func() {
		u, _ := k.Lock(ctx, "cali1")
		got <- "same"
		u()
	}()
	go func() {
		u, _ := k.Lock(ctx, "cali2")
		got <- "other"
		u()
	}()
	if first := <-got; first != "other" {
		t.Fatalf("%s key ran while cali1 was held", first)
	}
	testkit.Eventually(t, 10*time.Second, "the second holder of cali1 to wait", testkit.Cond(func() bool { return k.waiters("cali1") == 2 }))
	select {
	case s := <-got:
		t.Fatalf("%s key ran while cali1 was held", s)
	default:
	}
	unlock()
	if s := <-got; s != "same" {
		t.Fatalf("got %s", s)
	}
	testkit.Eventually(t, 10*time.Second, "every lock entry to go", testkit.Cond(func() bool { return k.waiters("cali1") == 0 && k.waiters("cali2") == 0 }))
}
