package syncer

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// heldSub is a subscriber whose offer waits for release.
type heldSub struct{ offered, release chan struct{} }

func (h *heldSub) offer([]change) { close(h.offered); <-h.release }
func (h *heldSub) wake()          {}
func (h *heldSub) retained() int  { return 0 }

// WaitHeld ends only once the subscribers have been offered the key's
// update: the state holds the key before they are, and a policy pass that
// a WaitHeld let in then found nothing queued (a failing firewall's ADD
// succeeded: TestCNIAddProgramsPolicy, once under load).
func TestWaitHeldAfterTheOffer(t *testing.T) {
	s := New(nil, nil)
	s.apply(datastore.Event{Type: datastore.EventResync, Revision: 10, Reached: 10})
	h := &heldSub{offered: make(chan struct{}), release: make(chan struct{})}
	s.mu.Lock()
	s.subs = append(s.subs, h)
	s.mu.Unlock()
	key, err := datastore.ResourceKey(api.KindWorkloadEndpoint, "default", "pa")
	if err != nil {
		t.Fatal(err)
	}
	val, err := json.Marshal(&api.WorkloadEndpoint{Metadata: api.ObjectMeta{Name: "pa", Namespace: "default"},
		Spec: api.WorkloadEndpointSpec{Node: "a", Orchestrator: "cni", Pod: "pa", ContainerID: "pa", Endpoint: "eth0",
			InterfaceName: "calipa", IPNetworks: []string{"10.244.0.1/32"}}})
	if err != nil {
		t.Fatal(err)
	}
	applied := make(chan struct{})
	go func() { // the key's write, its part ahead of the other: Reached stays 10
		defer close(applied)
		s.apply(datastore.Event{Type: datastore.EventPut, KV: datastore.KV{Key: key, Value: val, ModRevision: 12}, Revision: 12, Reached: 10})
	}()
	<-h.offered
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- s.WaitHeld(ctx, 10, key, 12)
	}()
	select {
	case err := <-done:
		t.Fatalf("WaitHeld ended (%v) before the subscribers were offered the key's update", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(h.release)
	<-applied
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitHeld still waiting after the offer")
	}
}
