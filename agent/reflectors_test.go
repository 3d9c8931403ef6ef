package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/internal/testkit"
)

// TestReflectorElection: three agents' electors over one etcd, starting
// with no choice, agree on one reflector per zone; when the zone-a
// reflector's liveness goes, it is replaced after the grace period by
// another zone-a node on every agent, zone b's reflector stays, and the
// record was written twice in all (no flapping, no write war).
func TestReflectorElection(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	one := uint32(1)
	bc := &api.BGPConfiguration{TypeMeta: api.TypeMeta{APIVersion: api.APIVersion, Kind: api.KindBGPConfiguration}, Metadata: api.ObjectMeta{Name: "default"},
		Spec: api.BGPConfigurationSpec{AutoReflectorSpec: api.AutoReflectorSpec{RouteReflectorMode: api.RouteReflectorModeAuto, RouteReflectorsPerZone: &one,
			RouteReflectorGracePeriod: &api.Duration{Duration: time.Second}}}}
	if _, err := datastore.CreateAs(ctx, store, bc); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		name, zone := fmt.Sprintf("n%d", i), []string{"a", "b"}[i%2]
		n := &api.Node{TypeMeta: api.TypeMeta{APIVersion: api.APIVersion, Kind: api.KindNode},
			Metadata: api.ObjectMeta{Name: name, Labels: map[string]string{api.DefaultZoneLabel: zone}},
			Spec:     api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: fmt.Sprintf("198.18.0.%d/24", i+1)}}}
		if _, err := datastore.CreateAs(ctx, store, n); err != nil {
			t.Fatal(err)
		}
		if _, err := store.PutKV(ctx, datastore.NodeLivenessKey(name), []byte("{}"), 0); err != nil {
			t.Fatal(err)
		}
	}
	writes := 0
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	recs := store.Watch(wctx, datastore.BGPReflectorsKey, 0)
	var electors []*reflectorElector
	for i := range 3 {
		view := startView(t, store)
		e := newReflectorElector(fmt.Sprintf("n%d", i), store, view, testLogger(), func() {})
		go e.run(wctx)
		electors = append(electors, e)
	}
	agreed := func(cond func(c *bgp.ReflectorChoice) error) func() error {
		return func() error {
			for _, ev := range drainEvents(recs) {
				if ev.Type == datastore.EventPut {
					writes++
				}
			}
			first := electors[0].current()
			for i, e := range electors {
				if !e.current().Equal(first) {
					return fmt.Errorf("elector %d has another choice", i)
				}
			}
			return cond(first)
		}
	}
	perZone := func(c *bgp.ReflectorChoice) error {
		if c == nil || len(c.Zones["a"]) != 1 || len(c.Zones["b"]) != 1 {
			return fmt.Errorf("choice %+v", c)
		}
		return nil
	}
	testkit.Eventually(t, 20*time.Second, "one reflector per zone", agreed(perZone))
	first := electors[0].current()
	victim, keep := first.Zones["a"][0].Node, first.Zones["b"][0].Node
	if err := store.DeleteKV(ctx, datastore.NodeLivenessKey(victim), 0); err != nil {
		t.Fatal(err)
	}
	took := testkit.Eventually(t, 20*time.Second, "the zone-a reflector replaced", agreed(func(c *bgp.ReflectorChoice) error {
		if err := perZone(c); err != nil {
			return err
		}
		if c.Zones["a"][0].Node == victim {
			return fmt.Errorf("%s still elected", victim)
		}
		if c.Zones["b"][0].Node != keep {
			return fmt.Errorf("zone b's reflector moved: %+v", c.Zones["b"])
		}
		return nil
	}))
	t.Logf("replaced in %v (grace 1s)", took)
	if writes != 2 {
		t.Errorf("the record was written %d times, want 2 (election, replacement)", writes)
	}
}

// drainEvents returns the events waiting on ch.
func drainEvents(ch <-chan datastore.Event) []datastore.Event {
	var out []datastore.Event
	for {
		select {
		case ev := <-ch:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// A progress report (the view's watch asks etcd for them, and etcd sends
// them to every watch of the stream) moves only the revision: the elector
// keeps the record it has; a deletion clears it.
func TestReflectorRecordProgressKeepsChoice(t *testing.T) {
	e := newReflectorElector("n1", nil, nil, testLogger(), func() {})
	rec := datastore.KV{Key: datastore.BGPReflectorsKey, Value: []byte(`{"zones":{"a":[{"node":"n2"}]}}`), ModRevision: 5}
	e.applyRecord(datastore.Event{Type: datastore.EventPut, KV: rec, Revision: 5})
	e.applyRecord(datastore.Event{Type: datastore.EventProgress, Revision: 9})
	if c := e.current(); c == nil || len(c.Zones["a"]) != 1 || c.Zones["a"][0].Node != "n2" {
		t.Fatalf("choice after a progress report = %+v, want n2 in zone a", c)
	}
	e.applyRecord(datastore.Event{Type: datastore.EventDelete, KV: datastore.KV{Key: rec.Key}, Revision: 10})
	if c := e.current(); c != nil {
		t.Errorf("choice after the record's deletion = %+v, want none", c)
	}
}
