package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/tabbynet/tabby/agent/attach"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// blockingSpare is the handler's addresses with a spare-block claim that
// holds on until the test releases it, even past its context's end.
type blockingSpare struct {
	attach.Addresses
	entered, ended chan struct{}
	release        chan struct{}
}

func (b blockingSpare) EnsureFreeBlock(ctx context.Context, node string, family int) (netip.Prefix, error) {
	close(b.entered)
	<-ctx.Done()
	<-b.release
	close(b.ended)
	return netip.Prefix{}, ctx.Err()
}

// signalLog closes a channel when a record with its message is logged.
type signalLog struct {
	slog.Handler
	msg  string
	once *sync.Once
	seen chan struct{}
}

func (s signalLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == s.msg {
		s.once.Do(func() { close(s.seen) })
	}
	return s.Handler.Handle(ctx, r)
}

func (s signalLog) WithAttrs(as []slog.Attr) slog.Handler {
	s.Handler = s.Handler.WithAttrs(as)
	return s
}

func (s signalLog) WithGroup(name string) slog.Handler {
	s.Handler = s.Handler.WithGroup(name)
	return s
}

// TestRunWaitsForSpareClaim: Run returns only after a spare-block claim an
// ADD started has ended, so that no claim outlives the agent and its
// store. The claim here ignores its cancellation until released: Run must
// say it waits for it, and must not return before it has ended.
func TestRunWaitsForSpareClaim(t *testing.T) {
	etcd := storetest.Etcd(t)
	waiting := signalLog{Handler: testLogger().Handler(), msg: "stopping: waiting for spare-block claims", once: new(sync.Once), seen: make(chan struct{})}
	a := newFakeAgent(t, etcd.Endpoints(), "node1", "198.18.0.11/24", slog.New(waiting))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case <-a.wired:
	case err := <-done:
		t.Fatalf("agent stopped: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("agent never came up")
	}
	// Nothing calls the handler but this test, whose ADD below comes after
	// the swap.
	spare := blockingSpare{Addresses: a.handler.ipam, entered: make(chan struct{}), ended: make(chan struct{}), release: make(chan struct{})}
	a.handler.ipam = spare
	req, conf, args := addReq("c1")
	if _, err := a.handler.Add(ctx, req, conf, args); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	<-spare.entered

	cancel()
	select {
	case err := <-done:
		close(spare.release)
		t.Fatalf("Run returned (%v) while a spare-block claim was running", err)
	case <-waiting.seen:
	}
	close(spare.release)
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	select {
	case <-spare.ended:
	default:
		t.Error("Run returned before the spare-block claim ended")
	}
}
