package main

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
)

const explainCluster = ipamCluster + `---
apiVersion: tabby.dev/v1
kind: Node
metadata: {name: node-3}
spec: {bgp: {ipv4Address: 198.18.0.13/24}}
---
apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: private}
spec: {cidr: 10.246.0.0/24, blockSize: 28, disableBGPExport: true}
---
apiVersion: tabby.dev/v1
kind: NetworkPolicy
metadata: {name: web-ingress, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress: [{ports: [{port: 8080}]}]
---
apiVersion: tabby.dev/v1
kind: NetworkPolicy
metadata: {name: db-only, namespace: shop}
spec:
  podSelector: {matchLabels: {app: db}}
---
apiVersion: tabby.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: default-deny-egress}
spec:
  order: 1000
  types: [Egress]
  namespaceSelector: {matchLabels: {team: shop}}
---
apiVersion: tabby.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: protect-db}
spec:
  order: 10
  selector: {matchLabels: {role: db}}
  ingress: [{action: Deny}]
---
apiVersion: tabby.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: admin-db}
spec:
  tier: kube-admin
  order: 1
  selector: {matchLabels: {role: db}}
  ingress: [{action: Pass}]
`

// fakeRunner answers commands from a table; anything else fails.
type fakeRunner map[string]string

func (f fakeRunner) Run(_ context.Context, name string, args ...string) ([]byte, error) {
	cmd := strings.Join(append([]string{name}, args...), " ")
	out, ok := f[cmd]
	if !ok {
		return nil, fmt.Errorf("%s: exit status 1: Cannot find device", cmd)
	}
	return []byte(out), nil
}

func TestExplain(t *testing.T) {
	h := newHarness(t)
	if _, err := h.run(explainCluster, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	addrs := addPods(t, h, []pod{
		{node: "node-1", ns: "shop", name: "web-0", labels: map[string]string{"app": "web"}},
		{node: "node-2", ns: "shop", name: "db-0", labels: map[string]string{"app": "db", "role": "db"}},
	})
	web, db := addrs["web-0"], addrs["db-0"]
	// borrower-0 on node-2 takes an address of node-1's block.
	borrowedAddr := web.Next().Next().Next()
	addrs = addPods(t, h, []pod{
		{node: "node-2", ns: "default", name: "borrower-0", addr: borrowedAddr.String()},
		{node: "node-3", ns: "default", name: "hidden-0", addr: "10.246.0.20"},
	})
	if addrs["borrower-0"] != borrowedAddr {
		t.Fatalf("borrower-0 got %s, want %s", addrs["borrower-0"], borrowedAddr)
	}
	// The namespace labels of shop's pods, for the GlobalNetworkPolicy's
	// namespaceSelector.
	obj, err := h.store.Get(context.Background(), api.KindWorkloadEndpoint, "shop", "node-1-k8s-web-0-eth0")
	if err != nil {
		t.Fatal(err)
	}
	w := obj.(*api.WorkloadEndpoint)
	w.Spec.NamespaceLabels = map[string]string{"team": "shop"}
	if _, err := h.store.Update(context.Background(), w); err != nil {
		t.Fatal(err)
	}
	webIf := w.Spec.InterfaceName

	up := fixedNow.Add(-time.Hour)
	block1 := netip.PrefixFrom(web, 28).Masked().String()
	publish(t, h, api.AgentStatus{
		Node: "node-1", Address: "198.18.0.11/24", ASN: 64512, Workloads: 1,
		Peers: []api.PeerStatus{
			{Address: "198.18.0.12", Type: "mesh", State: "Established", Since: up},
			{Address: "198.18.0.13", Type: "mesh", State: "Active", Info: "connection refused"},
			{Address: "198.18.0.1", Type: "global", State: "Established", Since: up},
		},
		Blocks: []string{block1}, Advertised: []string{block1},
	})
	publish(t, h, api.AgentStatus{
		Node: "node-2", Address: "198.18.0.12/24", ASN: 64512, Workloads: 2,
		Peers: []api.PeerStatus{{Address: "198.18.0.11", Type: "mesh", State: "Established", Since: up}},
		// The borrowed /32 is missing: explain says so.
		Blocks: []string{netip.PrefixFrom(db, 28).Masked().String()}, Advertised: []string{netip.PrefixFrom(db, 28).Masked().String()},
	})

	h.ok("explain", "pod", "shop/web-0")
	h.ok("explain", "pod", "db-0", "-n", "shop")
	h.ok("explain", "pod", borrowedAddr.String())
	h.ok("explain", "pod", "10.246.0.20")
	h.fail("explain", "pod", "shop/nope")
	h.fail("explain", "pod", "192.0.2.1")
	h.fail("explain", "node", "node-1")

	// Live, on node-2 (found by its address), whose kernel agrees.
	node2 := fakeRunner{
		"ip -j -4 addr show":                      `[{"ifname":"lo","addr_info":[{"local":"127.0.0.1"}]},{"ifname":"eth0","addr_info":[{"local":"198.18.0.12","prefixlen":24}]}]`,
		"ip -j -4 route show table main proto 80": `[{"type":"blackhole","dst":"` + netip.PrefixFrom(db, 28).Masked().String() + `","flags":[]}]`,
		"ip -j -4 route show table main proto 81": `[{"dst":"` + block1 + `","gateway":"198.18.0.11","dev":"eth0","flags":[]}]`,
		"ip -j route get " + web.String():         `[{"dst":"` + web.String() + `","gateway":"198.18.0.11","dev":"eth0","prefsrc":"198.18.0.12","flags":[],"uid":0,"cache":[]}]`,
	}
	h.hook = func(a *app) { a.runner = node2 }
	h.ok("explain", "pod", "shop/web-0", "--live")

	// Live, on node-1 through its namespace: the pod's route is on the wrong
	// interface and proxy ARP is off.
	ns := "nsenter --net=/run/netns/node-1 "
	node1 := fakeRunner{
		ns + "ip -j -4 route show table main proto 80":             `[{"type":"blackhole","dst":"` + block1 + `","flags":[]},{"dst":"` + web.String() + `","dev":"cali00000000000","scope":"link","flags":[]}]`,
		ns + "ip -j -4 route show table main proto 81":             `[]`,
		ns + "ip -j link show dev " + webIf:                        `[{"ifname":"` + webIf + `"}]`,
		ns + "cat /proc/sys/net/ipv4/conf/" + webIf + "/proxy_arp": "0\n",
		ns + "ip -j route get " + web.String():                     `[{"dst":"` + web.String() + `","dev":"cali00000000000","prefsrc":"198.18.0.11","flags":[],"uid":0,"cache":[]}]`,
	}
	h.hook = func(a *app) { a.runner = node1 }
	h.fail("explain", "pod", "shop/web-0", "--netns", "/run/netns/node-1", "--node", "node-1")
	h.fail("explain", "pod", "shop/web-0", "--live", "--node", "node-9")
	h.golden("explain")
}
