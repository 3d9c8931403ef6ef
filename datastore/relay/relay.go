// Package relay serves etcd's gRPC Watch service to agents and hands them
// their watch events in batches: for each agent's watch stream it opens
// one watch stream to etcd, forwards the agent's requests to it as they
// are, and sends etcd's responses back no more often than once per
// window, consecutive event responses of one watch merged into one. An
// agent whose events arrive one per watch response wakes once per event,
// which is most of a remote pod event's CPU at a steady low rate
// (docs/scale.md, "Watch relay"); batched, it wakes once per window.
//
// Only watches of keys under the relay's prefix are forwarded: the relay
// holds etcd credentials and must not hand out other keys.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
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

// DefaultWindow is how long a stream's responses are held after a send.
const DefaultWindow = 250 * time.Millisecond

// maxMerged bounds the keys' and values' bytes merged into one response.
const maxMerged = 1 << 20

// Relay is the Watch service; safe for concurrent use.
type Relay struct {
	pb.UnimplementedWatchServer
	conn   func() *grpc.ClientConn // etcd's, shared by every stream
	prefix string                  // absolute, with a trailing "/"
	end    string                  // the end of prefix's range
	window time.Duration
	log    *slog.Logger
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
	return &Relay{conn: client.ActiveConnection, prefix: p, end: clientv3.GetPrefixRangeEnd(p), window: max(window, 0), log: log}
}

// ServerOptions are the gRPC server's options a relay needs: its agents'
// etcd clients ping every 10 s (datastore's DialKeepAliveTime), which gRPC's
// default policy (at most every 5 min) answers by closing the connection.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true})}
}

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

// item is what a stream's sender takes, in order: a response of etcd, a
// response of the relay's own (a refused watch), or a progress request to
// forward once the held responses are sent.
type item struct {
	resp     *pb.WatchResponse
	progress *pb.WatchRequest
}

// Watch relays one agent's watch stream.
func (r *Relay) Watch(down pb.Watch_WatchServer) error {
	ctx, cancel := context.WithCancel(down.Context())
	defer cancel()
	uctx := ctx
	if md, ok := metadata.FromIncomingContext(down.Context()); ok && len(md.Get(rpctypes.MetadataRequireLeaderKey)) > 0 {
		uctx = clientv3.WithRequireLeader(ctx)
	}
	up, err := pb.NewWatchClient(r.conn()).Watch(uctx, grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(math.MaxInt32))
	if err != nil {
		return upstreamErr(err)
	}
	var sendMu sync.Mutex // the reader and the sender both send upstream
	sendUp := func(req *pb.WatchRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return up.Send(req)
	}
	items := make(chan item, 64)
	errc := make(chan error, 2)
	put := func(it item) bool {
		select {
		case items <- it:
			return true
		case <-ctx.Done():
			return false
		}
	}
	go func() { // the agent's requests
		for {
			req, err := down.Recv()
			if err != nil {
				errc <- errDownstream{err}
				return
			}
			switch u := req.RequestUnion.(type) {
			case *pb.WatchRequest_CreateRequest:
				if !r.allowed(u.CreateRequest) {
					r.log.Warn("refused a watch outside the prefix", "key", string(u.CreateRequest.Key), "prefix", r.prefix)
					if !put(item{resp: &pb.WatchResponse{Header: &pb.ResponseHeader{}, WatchId: clientv3.InvalidWatchID, Created: true, Canceled: true,
						CancelReason: fmt.Sprintf("relay: watch outside %s refused", r.prefix)}}) {
						return
					}
					continue
				}
			case *pb.WatchRequest_ProgressRequest:
				// Sent after the held responses: whoever asks waits for
				// an answer, and should not wait for the window too.
				if !put(item{progress: req}) {
					return
				}
				continue
			}
			if err := sendUp(req); err != nil {
				errc <- upstreamErr(err)
				return
			}
		}
	}()
	go func() { // etcd's responses
		for {
			resp, err := up.Recv()
			if err != nil {
				errc <- upstreamErr(err)
				return
			}
			if !put(item{resp: resp}) {
				return
			}
		}
	}()
	err = r.send(ctx, down, items, errc, sendUp)
	var de errDownstream
	if errors.As(err, &de) {
		return nil // the agent went
	}
	return err
}

type errDownstream struct{ error }

// upstreamErr is etcd's error as the agent's: a gRPC status passes as it
// is (a lost leader, a compaction), anything else is Unavailable.
func upstreamErr(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Unavailable, "relay: etcd: "+err.Error())
}

// send delivers a stream's items: the first response after a window's
// quiet at once, later ones held until a window after the last send and
// then sent back to back, consecutive event responses of one watch
// merged. A progress request of the agent's, etcd's answer to it and a
// watch's creation or end each send the held responses at once.
func (r *Relay) send(ctx context.Context, down pb.Watch_WatchServer, items <-chan item, errc <-chan error, sendUp func(*pb.WatchRequest) error) error {
	var (
		held     []*pb.WatchResponse
		heldSize int
		lastSend time.Time
		timer    = time.NewTimer(time.Hour)
		armed    bool
	)
	timer.Stop()
	defer timer.Stop()
	flush := func() error {
		for _, m := range held {
			if err := down.Send(m); err != nil {
				return errDownstream{err}
			}
		}
		if len(held) > 0 {
			lastSend = time.Now()
		}
		clear(held)
		held, heldSize = held[:0], 0
		return nil
	}
	for {
		select {
		case err := <-errc:
			var de errDownstream
			if !errors.As(err, &de) {
				_ = flush() // what etcd sent before it failed
			}
			return err
		case <-ctx.Done():
			return errDownstream{ctx.Err()}
		case <-timer.C:
			armed = false
			if err := flush(); err != nil {
				return err
			}
		case it := <-items:
			if it.progress != nil {
				if err := flush(); err != nil {
					return err
				}
				if err := sendUp(it.progress); err != nil {
					return upstreamErr(err)
				}
				continue
			}
			if answersProgress(it.resp) || it.resp.Created || it.resp.Canceled {
				// Whoever asked is waiting for it (a progress report
				// says every event up to its revision was sent, so it
				// follows the held ones; a watch created or ended is
				// not worth a window's wait).
				held = append(held, it.resp)
				if err := flush(); err != nil {
					return err
				}
				continue
			}
			now := time.Now()
			if len(held) == 0 && now.Sub(lastSend) >= r.window {
				if err := down.Send(it.resp); err != nil {
					return errDownstream{err}
				}
				lastSend = now
				continue
			}
			if n := len(held); n > 0 && mergeable(held[n-1]) && mergeable(it.resp) && held[n-1].WatchId == it.resp.WatchId && heldSize < maxMerged {
				held[n-1].Events = append(held[n-1].Events, it.resp.Events...)
				held[n-1].Header = it.resp.Header
			} else {
				held = append(held, it.resp)
				heldSize = 0
			}
			for _, ev := range it.resp.Events {
				heldSize += len(ev.Kv.GetKey()) + len(ev.Kv.GetValue()) + len(ev.PrevKv.GetKey()) + len(ev.PrevKv.GetValue())
			}
			if !armed {
				armed = true
				timer.Reset(lastSend.Add(r.window).Sub(now))
			}
		}
	}
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
