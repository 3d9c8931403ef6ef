package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/ipam"
)

func TestResources(t *testing.T) {
	h := newHarness(t)
	cluster, wep := "testdata/manifests/cluster.yaml", "testdata/manifests/wep.json"

	h.ok("apply", "-f", cluster, "-f", wep)
	for _, kind := range []string{"nodes", "pool", "ipamconfig", "bgpconfig", "peers", "netpol", "gnp"} {
		h.ok("get", kind)
	}
	h.ok("get", "wep", "-A")
	h.ok("get", "wep", "-n", "shop", "-o", "wide")
	h.ok("get", "wep") // nothing in namespace default
	h.ok("get", "nodes", "-o", "wide")
	h.ok("get", "ippool", "default-ipv4-ippool", "-o", "yaml")
	h.ok("get", "policy", "-n", "shop", "web-ingress", "-o", "json")
	h.ok("get", "bgppeers", "-o", "json")

	// Apply again: unchanged; then change one resource.
	h.ok("apply", "-f", cluster)
	changed := h.file("pool.yaml", `apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: default-ipv4-ippool}
spec: {cidr: 10.244.0.0/16, natOutgoing: false}
`)
	h.ok("apply", "-f", changed)
	h.ok("get", "ippools")

	// Errors.
	h.fail("get", "widgets")
	h.fail("get", "ippool", "nope")
	h.fail("get", "wep", "-n", "shop", "missing", "node--1-k8s-web--0-eth0")
	h.fail("create", "-f", changed)
	overlap := h.file("overlap.yaml", `apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: other}
spec: {cidr: 10.244.128.0/17}
`)
	h.fail("apply", "-f", overlap)
	resize := h.file("resize.yaml", `apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: default-ipv4-ippool}
spec: {cidr: 10.245.0.0/16, blockSize: 28}
`)
	h.fail("apply", "-f", resize)
	invalid := h.file("invalid.yaml", `apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: ok-pool}
spec: {cidr: 10.250.0.0/16}
---
apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: Bad_Name}
spec: {cidr: 10.251.0.0/33, blockSize: 40}
`)
	h.fail("apply", "-f", invalid)
	h.fail("get", "ippool", "ok-pool") // nothing was applied

	// Labels.
	h.ok("label", "node", "node-2", "rack=r2", "zone=a")
	h.fail("label", "node", "node-2", "rack=r3")
	h.ok("label", "node", "node-2", "rack=r3", "--overwrite", "zone-")
	h.ok("label", "node", "node-2", "rack=r3")
	h.fail("label", "node", "node-2", "bad key!=x")
	h.fail("label", "node", "node-9", "a=b")
	h.ok("get", "nodes", "-o", "wide")

	// Create from stdin and from a directory.
	if _, err := h.run(`{"apiVersion":"tabby.dev/v1","kind":"IPPool","metadata":{"name":"extra"},"spec":{"cidr":"10.96.0.0/20","blockSize":28}}`,
		"create", "-f", "-"); err != nil {
		t.Errorf("create from stdin: %v", err)
	}
	dir := h.file("dir/a.yaml", "apiVersion: tabby.dev/v1\nkind: GlobalNetworkPolicy\nmetadata: {name: allow-dns}\nspec: {egress: [{action: Allow, protocol: UDP, destination: {ports: [53]}}]}\n")
	h.file("dir/ignored.txt", "not a manifest")
	h.ok("apply", "-f", dir[:len(dir)-len("/a.yaml")])

	// Deleting: an IPPool with allocations is refused.
	alloc := ipam.New(h.store)
	as, err := alloc.Assign(context.Background(), ipam.AssignRequest{Node: "node-1", Handle: "h1", Pools: []string{"extra"}})
	if err != nil {
		t.Fatalf("assign: %v", err)
	}
	h.fail("delete", "ippool", "extra")
	if err := alloc.ReleaseAddr(context.Background(), as.Addr); err != nil {
		t.Fatalf("release: %v", err)
	}
	h.ok("delete", "pool", "extra")
	h.fail("delete", "pool", "extra")
	h.ok("delete", "pool", "extra", "--ignore-not-found")
	h.ok("delete", "-f", wep)
	h.ok("delete", "gnp", "allow-dns", "deny-db")
	h.fail("delete", "-f", wep)
	h.ok("get", "gnp")
	h.golden("resources")
}

// TestBGPFilterResources: BGPFilters and the BGPPeer fields that use them
// go through get, apply and delete like every other kind.
func TestBGPFilterResources(t *testing.T) {
	h := newHarness(t)
	manifest := h.file("filters.yaml", `apiVersion: tabby.dev/v1
kind: BGPFilter
metadata: {name: tor-in}
spec:
  importV4:
  - {cidr: 203.0.113.0/24, matchOperator: In, prefixLength: {min: 25, max: 28}, action: Accept}
  - {cidr: 0.0.0.0/0, matchOperator: Equal, action: Accept}
  exportV4:
  - {cidr: 10.244.128.0/17, action: Reject}
  importV6:
  - {cidr: 2001:db8:77::/48, prefixLength: {max: 56}, action: Accept}
  exportV6:
  - {cidr: "fd00:10:244:8000::/49", action: Reject}
---
apiVersion: tabby.dev/v1
kind: BGPPeer
metadata: {name: tor}
spec:
  peerIP: 198.18.0.1
  asNumber: 65001
  filters: [tor-in]
  maxPrefixes: 200
  bfd: {enabled: true}
`)
	h.ok("apply", "-f", manifest)
	h.ok("get", "bgpfilters")
	h.ok("get", "filter", "tor-in", "-o", "wide")
	h.ok("get", "bgpfilter", "tor-in", "-o", "yaml")
	h.ok("get", "peers", "-o", "wide")
	h.ok("apply", "-f", manifest) // unchanged
	bad := h.file("bad-filter.yaml", `apiVersion: tabby.dev/v1
kind: BGPFilter
metadata: {name: bad}
spec:
  importV4:
  - {cidr: 203.0.113.1/24, matchOperator: Near, action: Allow}
  - {cidr: 10.0.0.0/8, matchOperator: Equal, prefixLength: {max: 24}, action: Accept}
  importV6:
  - {cidr: 10.0.0.0/8, action: Accept}
`)
	h.fail("apply", "-f", bad)
	h.fail("apply", "-f", h.file("typo-filter.yaml", "apiVersion: tabby.dev/v1\nkind: BGPFilter\nmetadata: {name: t}\nspec: {importv4: []}\n"))
	h.ok("delete", "filter", "tor-in")
	h.fail("get", "bgpfilter", "tor-in")
	h.ok("delete", "-f", manifest, "--ignore-not-found")
	h.ok("get", "bgpfilters")
	h.golden("bgpfilter")
}

func TestValidate(t *testing.T) {
	h := newOfflineHarness(t)
	h.ok("validate", "-f", "testdata/manifests")
	bad := h.file("bad.yaml", `apiVersion: tabby.dev/v1
kind: BGPPeer
metadata: {name: tor}
spec:
  peerIP: 300.1.1.1
  asNumber: 0
  nodeSelector:
    matchExpressions: [{key: rack, operator: Within, values: [a]}]
---
apiVersion: tabby.dev/v1
kind: NetworkPolicy
metadata: {name: np, namespace: shop}
spec:
  podSelector: {}
  ingress: [{ports: [{port: 70000}]}]
`)
	h.fail("validate", "-f", bad)
	typo := h.file("typo.yaml", "apiVersion: tabby.dev/v1\nkind: IPPool\nmetadata: {name: p}\nspec: {cidr: 10.0.0.0/16, blocksize: 26}\n")
	h.fail("validate", "-f", typo, "-f", bad)
	h.fail("validate", "-f", h.file("empty.yaml", "# nothing\n"))
	h.fail("validate", "-f", "testdata/no-such-file.yaml")
	h.fail("validate")
	h.golden("validate")
}

func TestUnreachableEtcd(t *testing.T) {
	h := newOfflineHarness(t)
	// Port 1 on loopback: nothing listens there.
	h.fail("get", "pools", "--etcd-endpoints", "http://127.0.0.1:1")
	h.env["TABBY_ETCD_ENDPOINTS"] = "http://127.0.0.1:1,unix://" + h.dir + "/etcd.sock"
	h.fail("node", "status")
	h.fail("get", "pools", "--etcd-endpoints", "ftp://127.0.0.1:1")
	h.golden("unreachable")
}

func TestConfigSources(t *testing.T) {
	h := newHarness(t)
	good := h.env["TABBY_ETCD_ENDPOINTS"]
	h.env = map[string]string{"TABBY_ETCD_ENDPOINTS": "http://127.0.0.1:1"}
	cfg := h.file("tabbyctl.yaml", "etcd-endpoints: "+good+"\n")
	h.fail("get", "nodes")                         // the environment names a dead endpoint
	h.ok("get", "nodes", "--etcd-endpoints", good) // a flag beats the environment
	delete(h.env, "TABBY_ETCD_ENDPOINTS")
	h.ok("get", "nodes", "--config", cfg)
	h.fail("get", "nodes", "--config", h.file("bad.yaml", "etcd-endpoints: [\n"))
	h.ok("version")
	h.golden("config")
}

func TestCompletion(t *testing.T) {
	h := newOfflineHarness(t)
	out := h.ok("completion", "bash")
	if !strings.Contains(out, "__start_tabbyctl") {
		t.Errorf("completion bash does not define __start_tabbyctl:\n%.300s", out)
	}
	out = h.ok("__complete", "get", "ip")
	if !strings.HasPrefix(out, "ippools\n") {
		t.Errorf("completing kinds: got %q, want ippools first", out)
	}
}

// A pool of /32 blocks is refused at apply with a reason, not accepted and
// then failing in every node's routing pass.
func TestApplyRefusesInvalidBlockSizes(t *testing.T) {
	h := newHarness(t)
	for _, bs := range []int{32, 19, 33} {
		f := h.file(fmt.Sprintf("pool-%d.yaml", bs), fmt.Sprintf(`apiVersion: tabby.dev/v1
kind: IPPool
metadata:
  name: p%d
spec:
  cidr: 10.244.0.0/16
  blockSize: %d
`, bs, bs))
		err := h.fail("apply", "-f", f)
		if !strings.Contains(err.Error(), "spec.blockSize") {
			t.Errorf("blockSize %d: error %v does not name spec.blockSize", bs, err)
		}
		if bs == 32 && !strings.Contains(err.Error(), "32 is not supported") {
			t.Errorf("blockSize 32: error %v does not say why", err)
		}
	}
	if out := h.ok("get", "ippools"); strings.Contains(out, "10.244.0.0/16") {
		t.Errorf("a refused pool was stored:\n%s", out)
	}
}

// The ORIGIN column says who wrote each node, endpoint and policy, from
// the marks the controllers and the agent write (objects here are written
// to etcd as they write them); an object with no mark came from tabbyctl.
func TestOriginColumn(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	kubeNode := map[string]string{api.AnnotationKubeNode: "node-k"}
	byAgent := map[string]string{api.AnnotationOrigin: api.OriginAgent}
	byKube := map[string]string{api.AnnotationOrigin: api.OriginKubernetes}
	objs := []api.Object{
		&api.Node{Metadata: api.ObjectMeta{Name: "node-a", Annotations: byAgent}},
		// Registered by its agent, then adopted by the controllers.
		&api.Node{Metadata: api.ObjectMeta{Name: "node-k", Annotations: map[string]string{api.AnnotationOrigin: api.OriginAgent, api.AnnotationKubeNode: "node-k"}}},
		&api.Node{Metadata: api.ObjectMeta{Name: "node-old-k", Annotations: kubeNode}},
		&api.Node{Metadata: api.ObjectMeta{Name: "node-t"}},
		&api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: "shop", Name: "k8s.allow-web", Annotations: byKube}},
		&api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: "shop", Name: "by-hand"}},
		&api.WorkloadEndpoint{Metadata: api.ObjectMeta{Namespace: "shop", Name: "node--k-k8s-web--0-eth0", Annotations: byKube},
			Spec: api.WorkloadEndpointSpec{Node: "node-k", Orchestrator: "k8s", Pod: "web-0", ContainerID: "c1", Endpoint: "eth0",
				InterfaceName: "cali0123456789a", IPNetworks: []string{"10.244.3.7/32"}}},
		&api.WorkloadEndpoint{Metadata: api.ObjectMeta{Namespace: "shop", Name: "node--a-cni-c2-eth0", Annotations: byAgent},
			Spec: api.WorkloadEndpointSpec{Node: "node-a", Orchestrator: "cni", Pod: "c2", ContainerID: "c2", Endpoint: "eth0",
				InterfaceName: "cali0123456789b", IPNetworks: []string{"10.244.3.8/32"}}},
	}
	for _, o := range objs {
		if d, ok := o.(interface{ SetDefaults() }); ok {
			d.SetDefaults()
		}
		if _, err := h.store.Create(ctx, o); err != nil {
			t.Fatalf("creating %s: %v", o.GetMeta().Name, err)
		}
	}
	h.ok("get", "nodes")
	h.ok("get", "netpol", "-A")
	h.ok("get", "wep", "-A")
	h.golden("origin")
}
