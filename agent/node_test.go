package agent

import (
	"context"
	"net/netip"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// The agent marks the Node it registers as its own (tabbyctl's ORIGIN
// column), and leaves a Node someone else created as it was.
func TestRegisterNodeMarksOrigin(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	a := &Agent{cfg: Config{NodeName: "node1"}, store: store, nodeAddr: netip.MustParsePrefix("198.18.0.11/24")}
	n, err := a.registerNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if api.Origin(n) != api.OriginAgent || n.Spec.BGP.IPv4Address != "198.18.0.11/24" {
		t.Errorf("registered node: origin %q, %+v", api.Origin(n), n.Spec.BGP)
	}
	mustCreate(t, store, &api.Node{Metadata: api.ObjectMeta{Name: "node2"}})
	a.cfg.NodeName = "node2"
	if n, err = a.registerNode(ctx); err != nil {
		t.Fatal(err)
	}
	if api.Origin(n) != api.OriginTabbyctl || n.Spec.BGP.IPv4Address != "198.18.0.11/24" {
		t.Errorf("node made with tabbyctl: origin %q, %+v", api.Origin(n), n.Spec.BGP)
	}
}
