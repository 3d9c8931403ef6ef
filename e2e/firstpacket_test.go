package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/tabbynet/tabby/agent"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/lab"
)

// TestFirstPacket: new pods each ping a pod on another node as soon as
// their ADD returns — the pod added just before them, on the previous
// node, so that both the way there (the previous pod's block, often just
// claimed) and the way back (this pod's) are new routes — and every first
// ping (one packet, one second to answer) must be answered. Round a uses
// the lab's pool (/26 blocks): each node's first pod lands in the block its
// agent claimed at start. Round b swaps in a pool of /30 blocks: each
// node's first pod opens a block and its ADD waits until the block is
// advertised; once a pod fills a block the agent claims the next one in
// the background (a spare), so later pods land in blocks already
// advertised.
func TestFirstPacket(t *testing.T) {
	l := upLab(t, lab.Options{Name: "e2efp", Nodes: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	nodes := []string{"node1", "node2", "node3"}
	const perRound = 51

	round := func(name string) (answered, total int) {
		var prev netip.Addr
		var slowest time.Duration
		for i := range perRound {
			pod := fmt.Sprintf("%s-p%d", name, i)
			start := time.Now()
			p, err := l.AddPod(ctx, nodes[i%len(nodes)], pod, lab.PodOptions{})
			if err != nil {
				t.Fatalf("ADD %s: %v", pod, err)
			}
			slowest = max(slowest, time.Since(start))
			if prev.IsValid() {
				total++
				if err := l.Ping(ctx, pod, prev); err != nil {
					t.Errorf("round %s: the first ping of %s on %s to %s on %s was not answered", name, pod, p.Node, prev, nodes[(i-1)%len(nodes)])
				} else {
					answered++
				}
			}
			prev = p.IPs[0].Addr()
		}
		t.Logf("round %s: %d of %d first pings answered; slowest ADD (with the lab's exec) %s", name, answered, total, slowest.Round(time.Millisecond))
		return answered, total
	}

	a1, n1 := round("a")

	// Round b: the pods of round a go, the pool is replaced by one of /30
	// blocks (4 addresses), so new blocks are claimed while pods are added.
	for _, p := range l.State().Pods {
		if err := l.DelPod(ctx, p.Name); err != nil {
			t.Fatalf("DEL %s: %v", p.Name, err)
		}
	}
	al := ipam.New(l.Store())
	if err := al.DeletePool(ctx, agent.DefaultPoolName); err != nil {
		t.Fatalf("deleting the lab's pool: %v", err)
	}
	if _, err := al.CreatePool(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "w19-small"},
		Spec: api.IPPoolSpec{CIDR: lab.PodPool, BlockSize: 30}}); err != nil {
		t.Fatalf("creating a pool of /30 blocks: %v", err)
	}
	a2, n2 := round("b")
	blocks, err := al.Blocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("in all %d of %d first pings answered; %d /30 blocks claimed in round b", a1+a2, n1+n2, len(blocks))
	if len(blocks) < perRound/4 {
		t.Errorf("round b claimed %d blocks, want at least %d (the wait for a new block was not exercised)", len(blocks), perRound/4)
	}
}
