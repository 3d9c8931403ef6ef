package syncer_test

import (
	"context"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/ipam"
)

// A block record that stops decoding stays in the view as it was, so its
// node keeps routing and advertising it; a view started while the record
// is bad has it from its key and its node's claim; the view lists it.
func TestUnreadableBlockStaysInView(t *testing.T) {
	st := storetest.New(t)
	ctx := context.Background()
	mustCreate(t, st, &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/24", BlockSize: 26}})
	al := ipam.New(st)
	asg, err := al.Assign(ctx, ipam.AssignRequest{Node: "a", Handle: "h1", Attrs: ipam.Attributes{Node: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	v := start(t, st)
	testkit.Eventually(t, 10*time.Second, "a's block", testkit.Cond(func() bool { return len(v.BlocksOf("a")) == 1 }))

	// The view reads the block's summary record (the block itself never
	// reaches it).
	key := ipam.BlockSummariesPrefix + asg.Block.Addr().String() + "-26"
	if _, err := st.PutKV(ctx, key, []byte("{not json"), 0); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the block listed as unreadable", testkit.Cond(func() bool { return len(v.UnreadableBlocks()) == 1 }))
	if bs := v.BlocksOf("a"); len(bs) != 1 || bs[0].CIDR != asg.Block || !bs[0].Confirmed {
		t.Errorf("running view: BlocksOf(a) = %+v, want %s kept", bs, asg.Block)
	}

	fresh := start(t, st)
	if bs := fresh.BlocksOf("a"); len(bs) != 1 || bs[0].CIDR != asg.Block || !bs[0].Confirmed {
		t.Errorf("fresh view: BlocksOf(a) = %+v, want %s from its claim", bs, asg.Block)
	}
	if got := fresh.UnreadableBlocks(); len(got) != 1 || got[0] != key {
		t.Errorf("UnreadableBlocks() = %v, want [%s]", got, key)
	}

	// Deleting the key removes it.
	if err := st.DeleteKV(ctx, key, 0); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the block gone", testkit.Cond(func() bool { return len(v.BlocksOf("a")) == 0 }))
}

// Records written around Tabby's validation never reach the kernel: an
// endpoint on eth0 or with a whole network as its address is left out of
// the view; an invalid Node is still known to exist (node GC must not take
// it for a deleted one).
func TestInvalidRecordsLeftOut(t *testing.T) {
	st := storetest.New(t)
	ctx := context.Background()
	good := wep("a", "good", "10.244.0.1")
	mustCreate(t, st, good)
	raw := map[string]string{
		"resources/workloadendpoints/default/on-eth0": `{"metadata":{"name":"on-eth0","namespace":"default"},"spec":{"node":"a","containerID":"c1","interfaceName":"eth0","ipNetworks":["10.244.0.2/32"]}}`,
		"resources/workloadendpoints/default/whole":   `{"metadata":{"name":"whole","namespace":"default"},"spec":{"node":"a","containerID":"c2","interfaceName":"cali12345678901","ipNetworks":["0.0.0.0/0"]}}`,
		"resources/nodes/bad-node":                    `{"metadata":{"name":"bad-node"},"spec":{"bgp":{"ipv4Address":"not an address"}}}`,
	}
	for k, v := range raw {
		if _, err := st.PutKV(ctx, k, []byte(v), 0); err != nil {
			t.Fatal(err)
		}
	}
	v := start(t, st)
	eps := v.EndpointsOn("a")
	if len(eps) != 1 || eps[0].Metadata.Name != "good" {
		var names []string
		for _, e := range eps {
			names = append(names, e.Metadata.Name)
		}
		t.Errorf("EndpointsOn(a) = %v, want only good", names)
	}
	if _, ok := v.Node("bad-node"); ok {
		t.Error("an invalid Node is in the view")
	}
	if !v.NodeRecordExists("bad-node") {
		t.Error("an invalid Node is taken for a deleted one")
	}
}
