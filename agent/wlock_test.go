package agent

import (
	"context"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
)

func TestWorkloadLocksSerialisePerKey(t *testing.T) {
	var w workloadLocks
	unlock := w.lock("cali1")
	got := make(chan string, 2)
	go func() { u := w.lock("cali1"); got <- "same"; u() }()
	go func() { u := w.lock("cali2"); got <- "other"; u() }()
	if first := <-got; first != "other" {
		t.Fatalf("%s key ran while cali1 was held", first)
	}
	select {
	case s := <-got:
		t.Fatalf("%s key ran while cali1 was held", s)
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	if s := <-got; s != "same" {
		t.Fatalf("got %s", s)
	}
	if len(w.locks) != 0 {
		t.Errorf("%d lock entries left", len(w.locks))
	}
}

func TestGCSkipsInflight(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	req, conf, args := addReq("c1")
	if _, err := e.h.Add(ctx, req, conf, args); err != nil {
		t.Fatal(err)
	}
	hostIf := newWorkloadID(req, args).hostIfName()
	e.h.inflight = func() map[string]bool { return map[string]bool{hostIf: true} }
	if err := e.h.GC(ctx, conf, []types.GCAttachment{}); err != nil {
		t.Fatal(err)
	}
	if n := len(e.endpoints(t)); n != 1 {
		t.Fatalf("GC removed an endpoint being added: %d left", n)
	}
	e.h.inflight = nil
	if err := e.h.GC(ctx, conf, []types.GCAttachment{}); err != nil {
		t.Fatal(err)
	}
	if n := len(e.endpoints(t)); n != 0 {
		t.Fatalf("GC kept an attachment the runtime does not know: %d left", n)
	}
}
