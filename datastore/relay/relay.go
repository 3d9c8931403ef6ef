// Package relay serves etcd's gRPC Watch service to agents and hands them
// their watch events in batches: for each agent's watch stream it opens
// one watch stream to etcd, forwards the agent's requests to it as they
// are, and sends the events of batched keys back at most once per
// window, consecutive event responses of one watch merged into one
// (progress reports, a watch's creation or end and other keys' events go
// at once, with what is held). An
// agent whose events arrive one per watch response wakes once per event,
// which is most of a remote pod event's CPU at a steady low rate
// (docs/scale.md, "Watch relay"); batched, it wakes once per window.
//
// Only watches of keys under the relay's prefix are forwarded: the relay
// holds etcd credentials and must not hand out other keys.
package relay

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// DefaultWindow is how long a stream's responses are held after a send of
// events. A wake-up costs an agent about as much as a whole second's
// batch of 20 events (docs/scale.md, "The relay's window"): at 1 s an
// agent pays for remote pods ≈ 1 ms of CPU a second whatever the churn,
// and another node's pod reaches its policy sets at most 1 s later under
// a churn (a lone event goes at once).
const DefaultWindow = time.Second

// MaxWindow is the longest batching window a relay takes: a longer one
// would hold a lone client's events for longer than the agents' progress
// requests wait (datastore's progressEveryRelayed, 3 s, is sized for the
// default).
const MaxWindow = 10 * time.Second

// CheckWindow says whether d is a batching window a relay takes: more than
// 0 and at most MaxWindow (tabby-relay's --batch-window; the lab's relay).
func CheckWindow(d time.Duration) error {
	if d <= 0 || d > MaxWindow {
		return fmt.Errorf("batching window %s: want more than 0 and at most %s", d, MaxWindow)
	}
	return nil
}

// maxMerged bounds the keys' and values' bytes merged into one response.
const maxMerged = 1 << 20

// Relay is the Watch service; safe for concurrent use.
type Relay struct {
	pb.UnimplementedWatchServer
	conn   func() *grpc.ClientConn // etcd's, shared by every stream
	kv     clientv3.KV             // for /readyz
	prefix string                  // absolute, with a trailing "/"
	end    string                  // the end of prefix's range
	m      *metrics
	window time.Duration
	log    *slog.Logger
	// batched are the absolute key prefixes whose events wait for the
	// window (nil: every key's); an event of any other key sends the
	// stream's held responses and itself at once (BatchOnly).
	batched []string
}

// DefaultBatched is what tabby-relay batches unless told otherwise
// (relative to its prefix): other nodes' workload endpoints, the churn
// that wakes every agent. A policy, namespace, node or pool change is rare
// and an operator waits for it: it goes at once.
var DefaultBatched = []string{"resources/workloadendpoints/"}

// BatchOnly makes only the events of keys under the given prefixes
// (relative to the relay's prefix) wait for the window; a response with an
// event of any other key is sent at once, with what is held before it.
// Empty: every key's events wait. It returns r; call it before serving.
func (r *Relay) BatchOnly(rel []string) *Relay {
	r.batched = nil
	for _, p := range rel {
		r.batched = append(r.batched, r.prefix+strings.TrimPrefix(p, "/"))
	}
	return r
}

// urgent reports whether m carries an event of a key whose events do not
// wait for the window.
func (r *Relay) urgent(m *pb.WatchResponse) bool {
	if r.batched == nil {
		return false
	}
	for _, ev := range m.Events {
		k := string(ev.Kv.GetKey())
		if !slices.ContainsFunc(r.batched, func(p string) bool { return strings.HasPrefix(k, p) }) {
			return true
		}
	}
	return false
}

// New serves watches of keys under prefix ("/tabby") through client's
// connection to etcd, batching each stream's responses by window (0:
// DefaultWindow; negative: no batching).
func New(client *clientv3.Client, prefix string, window time.Duration, log *slog.Logger) *Relay {
	if window == 0 {
		window = DefaultWindow
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := strings.TrimSuffix(prefix, "/") + "/"
	return &Relay{conn: client.ActiveConnection, kv: client.KV, prefix: p, end: clientv3.GetPrefixRangeEnd(p), window: max(window, 0), log: log,
		m: newMetrics()}
}

// ServerOptions are the gRPC server's options a relay needs: its agents'
// etcd clients ping every 10 s (datastore's DialKeepAliveTime), which gRPC's
// default policy (at most every 5 min) answers by closing the connection.
// The receive windows are fixed: with gRPC's dynamic ones every request an
// agent sends (a progress request: a few bytes) made the server answer
// with a window update and a bandwidth-estimation ping, two more frames
// the agent wakes to read and a ping it wakes to answer. An agent's
// requests never need more than the minimum window.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.StaticStreamWindowSize(requestWindow),
		grpc.StaticConnWindowSize(requestWindow),
	}
}

// requestWindow is gRPC's least window, 64 KiB.
const requestWindow = 64 << 10

// Register adds the relay's Watch service to s.
func (r *Relay) Register(s *grpc.Server) { pb.RegisterWatchServer(s, r) }

// allowed reports whether a watch of [key, end) lies under the prefix.
func (r *Relay) allowed(c *pb.WatchCreateRequest) bool {
	k := string(c.Key)
	if !strings.HasPrefix(k, r.prefix) {
		return false
	}
	return len(c.RangeEnd) == 0 || (string(c.RangeEnd) > k && string(c.RangeEnd) <= r.end)
}

// Watch relays one agent's watch stream. The handler's goroutine receives
// etcd's responses and sends or holds each itself (one hand-off per
// response, gRPC's reader to it, as the agent's own watch); a goroutine
// forwards the agent's requests; a timer sends what is held.
func (r *Relay) Watch(down pb.Watch_WatchServer) error {
	ctx, cancel := context.WithCancel(down.Context())
	defer cancel()
	uctx := ctx
	if md, ok := metadata.FromIncomingContext(down.Context()); ok && len(md.Get(rpctypes.MetadataRequireLeaderKey)) > 0 {
		uctx = clientv3.WithRequireLeader(ctx)
	}
	r.m.streams.Inc()
	defer r.m.streams.Dec()
	up, err := pb.NewWatchClient(r.conn()).Watch(uctx, grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(math.MaxInt32))
	if err != nil {
		if ctx.Err() == nil { // not the agent gone while the relay waited for etcd
			r.m.upErrs.Inc()
		}
		return upstreamErr(err)
	}
	b := &batcher{down: down, window: r.window, fail: cancel, urgent: r.urgent, m: r.m}
	b.t = time.AfterFunc(time.Hour, b.fire)
	b.t.Stop()
	defer b.close()
	var mu sync.Mutex
	var upErr error // the reader's, set before it cancels
	go func() {
		defer cancel()
		err := r.forward(down, up, b)
		mu.Lock()
		upErr = err
		mu.Unlock()
	}()
	for {
		resp, err := up.Recv()
		if err != nil {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case upErr != nil:
				r.m.upErrs.Inc()
				return upErr
			case b.failed() || down.Context().Err() != nil:
				return nil // the agent went
			case ctx.Err() != nil:
				return nil // the reader saw the agent go
			}
			b.flushNow() // what etcd sent before it failed
			r.m.upErrs.Inc()
			return upstreamErr(err)
		}
		r.m.received.Inc()
		b.take(resp)
	}
}

// forward sends the agent's requests to etcd until the agent goes (nil)
// or etcd's stream fails (its error); a watch outside the prefix is
// refused here, never forwarded. It is the only sender on up.
func (r *Relay) forward(down pb.Watch_WatchServer, up pb.Watch_WatchClient, b *batcher) error {
	for {
		req, err := down.Recv()
		if err != nil {
			return nil // the agent went (or the handler returned)
		}
		if c := req.GetCreateRequest(); c != nil {
			if !r.allowed(c) {
				r.m.refused.Inc()
				r.log.Warn("refused a watch outside the prefix", "key", string(c.Key), "prefix", r.prefix)
				b.take(&pb.WatchResponse{Header: &pb.ResponseHeader{}, WatchId: clientv3.InvalidWatchID, Created: true, Canceled: true,
					CancelReason: fmt.Sprintf("relay: watch outside %s refused", r.prefix)})
				continue
			}
			r.m.watches.Inc()
		}
		// A progress request does not send what is held: etcd's answer
		// (take) sends it, a round trip later, back to back with the
		// answer, which the agent wakes once for, not twice.
		if err := up.Send(req); err != nil {
			return upstreamErr(err)
		}
	}
}

// upstreamErr is etcd's error as the agent's: a gRPC status passes as it
// is (a lost leader, a compaction), anything else is Unavailable.
func upstreamErr(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Unavailable, "relay: etcd: "+err.Error())
}

// batcher sends a stream's responses: the first after a window's quiet at
// once, later ones held until a window after the last send of events and
// then sent back to back, consecutive event responses of one watch merged.
// A send without events (a progress report, a watch's creation or end)
// starts no window: the agent asked for it, and an event after it alone
// still goes at once. etcd's
// answer to a progress request, a watch's creation or end and an event of
// a key not batched each send the held responses at once, with themselves. Safe for
// concurrent use; Send is called under mu only.
type batcher struct {
	down     pb.Watch_WatchServer
	window   time.Duration
	fail     func() // a send failed: end the stream
	urgent   func(*pb.WatchResponse) bool
	m        *metrics
	mu       sync.Mutex
	held     []*pb.WatchResponse
	heldSize int       // the last held response's keys and values
	lastSend time.Time // of events: when the window began
	t        *time.Timer
	armed    bool
	closed   bool // the handler returns: nothing more is sent
	sendErr  bool
}

func (b *batcher) take(m *pb.WatchResponse) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if answersProgress(m) || m.Created || m.Canceled || b.urgent(m) {
		// Whoever asked is waiting for it (a progress report says every
		// event up to its revision was sent, so it follows the held ones;
		// a watch created or ended is not worth a window's wait; nor is a
		// change of a key that is not batched, BatchOnly).
		b.held = append(b.held, m)
		b.flushLocked()
		return
	}
	now := time.Now()
	if len(b.held) == 0 && now.Sub(b.lastSend) >= b.window {
		b.held = append(b.held, m)
		b.flushLocked()
		return
	}
	if n := len(b.held); n > 0 && mergeable(b.held[n-1]) && mergeable(m) && b.held[n-1].WatchId == m.WatchId && b.heldSize < maxMerged {
		b.held[n-1].Events = append(b.held[n-1].Events, m.Events...)
		b.held[n-1].Header = m.Header
	} else {
		b.held = append(b.held, m)
		b.heldSize = 0
	}
	for _, ev := range m.Events {
		b.heldSize += len(ev.Kv.GetKey()) + len(ev.Kv.GetValue()) + len(ev.PrevKv.GetKey()) + len(ev.PrevKv.GetValue())
	}
	if !b.armed {
		b.armed = true
		b.t.Reset(b.lastSend.Add(b.window).Sub(now))
	}
}

func (b *batcher) fire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.armed = false
	b.flushLocked()
}

func (b *batcher) flushNow() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
}

func (b *batcher) flushLocked() {
	if b.closed || b.sendErr || len(b.held) == 0 {
		return
	}
	events := false
	for _, m := range b.held {
		if err := b.down.Send(m); err != nil {
			b.sendErr = true
			b.fail()
			break
		}
		b.m.sends.Inc()
		b.m.events.Add(float64(len(m.Events)))
		events = events || len(m.Events) > 0
	}
	if events {
		b.lastSend = time.Now()
		if b.armed {
			// A flush before the timer (an urgent event, a progress
			// report) starts a new window: the timer's deadline is the
			// old one's.
			b.t.Stop()
			b.armed = false
		}
	}
	clear(b.held)
	b.held, b.heldSize = b.held[:0], 0
}

func (b *batcher) failed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sendErr
}

// close stops the batcher for good: a timer firing after it sends nothing.
func (b *batcher) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.t.Stop()
}

// mergeable: a plain event response (not a watch's creation, cancel,
// fragment or compaction, nor a progress report).
func mergeable(m *pb.WatchResponse) bool {
	return len(m.Events) > 0 && !m.Created && !m.Canceled && !m.Fragment && m.CompactRevision == 0
}

// answersProgress: etcd's answer to a progress request (a report of the
// whole stream, watch ID -1).
func answersProgress(m *pb.WatchResponse) bool {
	return m.WatchId == clientv3.InvalidWatchID && !m.Created && !m.Canceled && len(m.Events) == 0
}
