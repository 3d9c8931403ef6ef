package syncer_test

import (
	"context"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore/storetest"
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
	waitFor(t, "a's block", func() bool { return len(v.BlocksOf("a")) == 1 })

	key := ipam.BlocksPrefix + asg.Block.Addr().String() + "-26"
	if _, err := st.PutKV(ctx, key, []byte("{not json"), 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the block listed as unreadable", func() bool { return len(v.UnreadableBlocks()) == 1 })
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
	waitFor(t, "the block gone", func() bool { return len(v.BlocksOf("a")) == 0 })
}
