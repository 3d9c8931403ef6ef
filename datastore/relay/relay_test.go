package relay_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tabbynet/tabby/datastore/embedded"
	"github.com/tabbynet/tabby/datastore/relay"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/internal/testkit"
)

// fixture is an embedded etcd, a client of it, and a relay in front of it
// serving on a local port.
type fixture struct {
	etcd   *embedded.Etcd
	client *clientv3.Client
	conn   *grpc.ClientConn // the agent's, to the relay
	relay  *relay.Relay
}

func start(t *testing.T, window time.Duration) *fixture {
	t.Helper()
	return startBatching(t, window, nil)
}

// startBatching is start with a relay that batches only the keys under
// batched (relay.BatchOnly; nil: every key).
func startBatching(t *testing.T, window time.Duration, batched []string) *fixture {
	t.Helper()
	e := storetest.Etcd(t)
	c, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(relay.ServerOptions()...)
	r := relay.New(c, "/tabby", window, nil).BatchOnly(batched)
	r.Register(srv)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &fixture{etcd: e, client: c, conn: conn, relay: r}
}

// watch opens a watch stream to the relay, ended at cleanup.
func (f *fixture) watch(t *testing.T) (pb.Watch_WatchClient, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	st, err := pb.NewWatchClient(f.conn).Watch(clientv3.WithRequireLeader(ctx))
	if err != nil {
		t.Fatal(err)
	}
	return st, cancel
}

func create(t *testing.T, st pb.Watch_WatchClient, key, end string) {
	t.Helper()
	if err := st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
		Key: []byte(key), RangeEnd: []byte(end)}}}); err != nil {
		t.Fatal(err)
	}
}

func recv(t *testing.T, st pb.Watch_WatchClient) *pb.WatchResponse {
	t.Helper()
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (f *fixture) put(t *testing.T, key string) int64 {
	t.Helper()
	r, err := f.client.Put(context.Background(), key, "v")
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

func keys(r *pb.WatchResponse) string {
	var k []string
	for _, ev := range r.Events {
		k = append(k, strings.TrimPrefix(string(ev.Kv.Key), "/tabby/"))
	}
	return strings.Join(k, " ")
}

// The first response after a quiet window goes at once, alone; the
// responses that follow within the window are held and the event
// responses of one watch merged, in order, with the later header; another
// watch's response in between is not merged into them.
func TestRelayBatches(t *testing.T) {
	const w = 2 * time.Second // longer than the puts below take on a loaded host
	f := start(t, w)
	st, _ := f.watch(t)
	create(t, st, "/tabby/a/", "/tabby/a0")
	create(t, st, "/tabby/b/", "/tabby/b0")
	for i := range 2 {
		if r := recv(t, st); !r.Created || r.WatchId != int64(i) {
			t.Fatalf("response %d: %v, want watch %d created", i, r, i)
		}
	}
	// The creations started no window: the first event goes at once.
	f.put(t, "/tabby/a/1")
	if r := recv(t, st); keys(r) != "a/1" {
		t.Fatalf("first after the quiet: %q, want a/1 alone", keys(r))
	}
	f.put(t, "/tabby/a/2")
	f.put(t, "/tabby/a/3")
	f.put(t, "/tabby/b/1")
	f.put(t, "/tabby/a/4")
	last := f.put(t, "/tabby/a/5")
	var got []string
	for _, want := range []int64{0, 1, 0} {
		r := recv(t, st)
		if r.WatchId != want {
			t.Fatalf("watch %d's response, want %d's: %v", r.WatchId, want, r)
		}
		got = append(got, keys(r))
		if len(got) == 3 && r.Header.Revision != last {
			t.Errorf("merged response's header at %d, want the last's %d", r.Header.Revision, last)
		}
	}
	if want := []string{"a/2 a/3", "b/1", "a/4 a/5"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("responses %q, want %q", got, want)
	}
	// A window after that send, the next event goes at once again.
	time.Sleep(w + 100*time.Millisecond)
	f.put(t, "/tabby/a/6")
	f.put(t, "/tabby/a/7") // within the new window: held
	if r := recv(t, st); keys(r) != "a/6" {
		t.Errorf("after a quiet window: %q, want a/6 alone", keys(r))
	}
	if r := recv(t, st); keys(r) != "a/7" {
		t.Errorf("then %q, want a/7", keys(r))
	}
}

// With BatchOnly, an event of a key that is not batched goes at once, with
// the held responses before it, in order; batched keys wait as ever.
func TestRelayUnbatchedKeyFlushes(t *testing.T) {
	f := startBatching(t, time.Hour, []string{"resources/workloadendpoints/"})
	st, _ := f.watch(t)
	create(t, st, "/tabby/", "/tabby0") // one watch: etcd sends its events in order
	if r := recv(t, st); !r.Created {
		t.Fatalf("%v, want the watch created", r)
	}
	// The first event goes at once and starts an hour's window.
	f.put(t, "/tabby/resources/workloadendpoints/ns/0")
	if r := recv(t, st); keys(r) != "resources/workloadendpoints/ns/0" {
		t.Fatalf("%v, want the first event at once", r)
	}
	f.put(t, "/tabby/resources/workloadendpoints/ns/a")
	f.put(t, "/tabby/resources/workloadendpoints/ns/b")
	f.put(t, "/tabby/resources/networkpolicies/ns/p") // not batched: sends all three now
	var got []string
	for len(strings.Fields(strings.Join(got, " "))) < 3 {
		got = append(got, keys(recv(t, st)))
	}
	if want := []string{"resources/workloadendpoints/ns/a resources/workloadendpoints/ns/b", "resources/networkpolicies/ns/p"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after the policy's change: %q, want %q", got, want)
	}
}

// Watches are created at once; a progress request sends the held
// responses at once and then etcd's answer; nothing waits for the window (etcd's events may reach the relay
// after the request: its answer, which follows them, sends them too).
func TestRelayProgressFlushes(t *testing.T) {
	f := start(t, time.Hour)
	st, _ := f.watch(t)
	create(t, st, "/tabby/", "/tabby/z")
	create(t, st, "/tabby/z", "/tabby0")
	for i := range 2 { // each created at once, not a window after the first
		if r := recv(t, st); !r.Created || r.WatchId != int64(i) {
			t.Fatalf("response %d: %v, want watch %d created", i, r, i)
		}
	}
	f.put(t, "/tabby/x") // the first event: at once, and an hour's window begins
	rev := f.put(t, "/tabby/y")
	if err := st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}); err != nil {
		t.Fatal(err)
	}
	// x and y, held or still on their way from etcd when the request
	// came (then etcd's answer, which follows them, sends them), then the
	// answer: all well before the hour.
	var got []string
	for {
		r := recv(t, st)
		if r.WatchId == clientv3.InvalidWatchID && len(r.Events) == 0 {
			if r.Header.Revision != rev {
				t.Errorf("etcd's progress report at %d, want %d", r.Header.Revision, rev)
			}
			break
		}
		got = append(got, keys(r))
	}
	if k := strings.Join(got, " "); k != "x y" {
		t.Errorf("before the progress report: %q, want x y", got)
	}
}

// Sends without events (a watch's creation, a progress report) start no
// window: the first event after them, a lone one, still goes at once.
func TestRelayNoWindowAfterProgress(t *testing.T) {
	f := start(t, time.Hour)
	st, _ := f.watch(t)
	create(t, st, "/tabby/", "/tabby0")
	if r := recv(t, st); !r.Created {
		t.Fatalf("%v, want the watch created", r)
	}
	if err := st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}); err != nil {
		t.Fatal(err)
	}
	if r := recv(t, st); r.WatchId != clientv3.InvalidWatchID || len(r.Events) > 0 {
		t.Fatalf("%v, want etcd's progress report", r)
	}
	f.put(t, "/tabby/x")
	if r := recv(t, st); keys(r) != "x" { // the stream's minute ends first if it is held
		t.Fatalf("%v, want x at once", r)
	}
}

// A watch outside the prefix is refused as etcd refuses one (created and
// canceled, no watch ID), and the stream goes on.
func TestRelayRefusesOutsidePrefix(t *testing.T) {
	f := start(t, -1)
	st, _ := f.watch(t)
	for _, c := range []struct{ key, end string }{
		{"/other/", "/other0"},
		{"/tabby", ""},           // the prefix's own key, without the "/"
		{"/tabby/", "\x00"},      // everything from /tabby/ on
		{"/tabby/", "/tabbz"},    // past the prefix's end
		{"/tabbyx/", "/tabbyx0"}, // a sibling prefix
		{"/tabby/b", "/tabby/a"}, // an empty range is not a loophole either
	} {
		create(t, st, c.key, c.end)
		r := recv(t, st)
		if !r.Created || !r.Canceled || r.WatchId != clientv3.InvalidWatchID || !strings.Contains(r.CancelReason, "refused") {
			t.Errorf("watch of [%q, %q): %v, want refused", c.key, c.end, r)
		}
	}
	create(t, st, "/tabby/k", "")
	if r := recv(t, st); !r.Created || r.Canceled {
		t.Fatalf("a key under the prefix: %v, want created", r)
	}
	f.put(t, "/other/k")
	f.put(t, "/tabby/k")
	if r := recv(t, st); keys(r) != "k" {
		t.Fatalf("%v, want /tabby/k's event", r)
	}
}

// etcd going away ends the agent's stream with an error (the agent's
// watch then watches again), and the relay's goroutines of the stream end.
func TestRelayUpstreamFailureEndsStream(t *testing.T) {
	f := start(t, -1)
	st, _ := f.watch(t)
	create(t, st, "/tabby/", "/tabby0")
	recv(t, st)
	if err := f.etcd.Stop(); err != nil {
		t.Fatal(err)
	}
	_, err := st.Recv()
	if status.Code(err) != codes.Unavailable && status.Code(err) != codes.Canceled {
		t.Fatalf("after etcd stopped: %v, want Unavailable", err)
	}
}

// An agent that goes leaves no goroutine of its stream behind.
func TestRelayNoLeakWhenAgentGoes(t *testing.T) {
	f := start(t, time.Hour)
	st, _ := f.watch(t)
	create(t, st, "/tabby/", "/tabby0")
	recv(t, st)
	before := runtime.NumGoroutine()
	for range 20 {
		st, cancel := f.watch(t)
		create(t, st, "/tabby/", "/tabby0")
		recv(t, st)
		f.put(t, "/tabby/x") // held: the window is long
		cancel()
	}
	deadline := time.Now().Add(30 * time.Second)
	for runtime.NumGoroutine() > before+5 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before the 20 streams:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// get is a GET of path from the relay's Handler: its status and body.
func (f *fixture) get(t *testing.T, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	f.relay.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

// metric is a sample's value in /metrics' text (-1: none).
func metric(body, name string) float64 {
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// /metrics counts the streams, the watches created and refused, the
// responses received and sent and the events sent; /livez answers while
// the relay serves; /readyz answers while etcd does.
func TestRelayMetricsAndHealth(t *testing.T) {
	f := start(t, time.Hour)
	st, _ := f.watch(t)
	create(t, st, "/other/", "/other0")
	recv(t, st)
	create(t, st, "/tabby/", "/tabby0")
	recv(t, st)
	f.put(t, "/tabby/x") // at once: the window begins
	recv(t, st)
	f.put(t, "/tabby/y")
	f.put(t, "/tabby/z")
	// A progress request sends the two held events and etcd's answer.
	if err := st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}); err != nil {
		t.Fatal(err)
	}
	for n := 0; n < 2; {
		n += len(recv(t, st).Events)
	}
	var body string
	want := map[string]float64{"tabby_relay_streams": 1, "tabby_relay_watches_created_total": 1, "tabby_relay_watches_refused_total": 1,
		"tabby_relay_events_sent_total": 3, "tabby_relay_upstream_errors_total": 0}
	testkit.Eventually(t, 10*time.Second, "the relay's metrics", func() error {
		var code int
		code, body = f.get(t, "/metrics")
		for name, v := range want {
			if got := metric(body, name); got != v {
				return fmt.Errorf("status %d, %s = %v, want %v", code, name, got, v)
			}
		}
		return nil
	})
	// Received: the creation, x, y, z and the progress answer (y and z
	// may come in one response); sent: the refusal too, y and z merged.
	if recvd, sent := metric(body, "tabby_relay_responses_received_total"), metric(body, "tabby_relay_responses_sent_total"); recvd < 4 || sent < 4 || sent > recvd+1 {
		t.Errorf("responses received %v, sent %v", recvd, sent)
	}
	for _, path := range []string{"/livez", "/readyz"} {
		if code, body := f.get(t, path); code != http.StatusOK {
			t.Errorf("%s: %d %s, want 200", path, code, body)
		}
	}
	if err := f.etcd.Stop(); err != nil {
		t.Fatal(err)
	}
	if code, body := f.get(t, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "etcd") {
		t.Errorf("/readyz with etcd stopped: %d %s, want 503", code, body)
	}
	if code, _ := f.get(t, "/livez"); code != http.StatusOK {
		t.Errorf("/livez with etcd stopped: %d, want 200", code)
	}
	testkit.Eventually(t, 10*time.Second, "the stream's end counted", func() error {
		_, body := f.get(t, "/metrics")
		if s, e := metric(body, "tabby_relay_streams"), metric(body, "tabby_relay_upstream_errors_total"); s != 0 || e != 1 {
			return fmt.Errorf("streams %v, upstream errors %v", s, e)
		}
		return nil
	})
}

// CheckWindow takes more than 0 up to MaxWindow, as tabby-relay's
// --batch-window and the lab's relay do.
func TestCheckWindow(t *testing.T) {
	for d, ok := range map[time.Duration]bool{-time.Second: false, 0: false, time.Nanosecond: true, relay.DefaultWindow: true, relay.MaxWindow: true, relay.MaxWindow + 1: false} {
		if err := relay.CheckWindow(d); (err == nil) != ok {
			t.Errorf("CheckWindow(%s) = %v, want ok %v", d, err, ok)
		}
	}
}
