package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// TestHostEndpointFailsafes: automatic host endpoints and a default-deny
// GlobalNetworkPolicy on them leave a node's BGP sessions, its etcd
// client, and its SSH and kubelet ports working (failsafes), but block a
// test service on the node from the ToR and from pods (remote and local)
// and the node's own traffic out, until allow rules open them; forwarded
// NodePort traffic (a DNAT the test adds in the node's namespace) is
// blocked by a preDNAT policy only; a host endpoint naming a missing
// interface is reported until the interface appears.
func TestHostEndpointFailsafes(t *testing.T) {
	for i, backend := range []string{"nftables", "iptables"} {
		t.Run(backend, func(t *testing.T) {
			hostEndpointFailsafes(t, fmt.Sprintf("hostep%d", i+1), backend)
		})
	}
}

func hostEndpointFailsafes(t *testing.T, name, backend string) {
	l := upLab(t, lab.Options{Name: name, Nodes: 2, AgentArgs: []string{"--firewall-backend", backend,
		"--endpoint-to-host-action", "Accept"}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	st := l.State()
	n1, n2 := st.Nodes[0], st.Nodes[1]
	nodeIP := n1.IP.Addr()
	at := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(nodeIP, port) }

	local, err := l.AddPod(ctx, n1.Name, "hep-local", lab.PodOptions{})
	if err != nil {
		t.Fatal(err)
	}
	remote, err := l.AddPod(ctx, n2.Name, "hep-remote", lab.PodOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The node's services: SSH and kubelet stand-ins, the test service
	// 8080; a server in the ToR for the node's own traffic out; a server
	// in the local pod behind a NodePort stand-in (30080 → pod:8080).
	startPolicyServer(t, l, n1.Name, "node", []int{22, 10250, 8080}, nil)
	startPolicyServer(t, l, "tor", "tor", []int{9090}, nil)
	startPolicyServer(t, l, local.Name, "pod", []int{8080}, nil)
	podIP := local.IPs[0].Addr()
	if _, err := l.Exec(ctx, n1.Name, "nft", fmt.Sprintf("add table ip hepnp; add chain ip hepnp pre { type nat hook prerouting priority -100; }; add rule ip hepnp pre ip daddr %s tcp dport 30080 dnat to %s:8080", nodeIP, podIP)); err != nil {
		t.Fatal(err)
	}
	torAt := netip.AddrPortFrom(hepTorAddr(t, l), 9090)

	type probe struct {
		from string
		to   netip.AddrPort
		want bool
	}
	expect := func(phase string, probes ...probe) {
		t.Helper()
		testkit.EventuallyEvery(t, 30*time.Second, 200*time.Millisecond, phase, func() error {
			var bad []string
			for _, p := range probes {
				r := probeFrom(ctx, t, l, p.from, "tcp", p.to)
				if r.err != nil {
					return r.err
				}
				if r.allowed != p.want {
					bad = append(bad, fmt.Sprintf("%s → %s: connected %v, want %v", p.from, p.to, r.allowed, p.want))
				}
			}
			if len(bad) > 0 {
				return fmt.Errorf("%s", strings.Join(bad, "; "))
			}
			return nil
		})
	}
	store := l.Store()
	apply := func(objs ...api.Object) {
		t.Helper()
		for _, o := range objs {
			if _, err := store.Apply(ctx, o); err != nil {
				t.Fatalf("applying %s %s: %v", api.KindOf(o), o.GetMeta().Name, err)
			}
		}
	}
	open := []probe{{"tor", at(8080), true}, {remote.Name, at(8080), true}, {local.Name, at(8080), true},
		{n1.Name, torAt, true}, {"tor", at(30080), true}, {"tor", at(22), true}}
	expect("no host endpoint: nothing policed", open...)

	// Automatic host endpoints carry the default-allow profile: on
	// their own, they block nothing.
	apply(&api.ClusterConfiguration{Metadata: api.ObjectMeta{Name: api.SingletonName}, Spec: api.ClusterConfigurationSpec{AutoHostEndpoints: api.Enabled}})
	labelNode(ctx, t, l, n1.Name, "hep-test", "guarded")
	waitHostEndpoint(ctx, t, l, n1.Name, n1.Name+"-auto-hep", api.HostEndpointPoliced)
	expect("automatic host endpoint, no policy", open...)

	guarded := &api.LabelSelector{MatchLabels: map[string]string{"hep-test": "guarded"}}
	order := func(o float64) *float64 { return &o }
	tcp := "TCP"
	port := func(p int32) api.EntityRule { return api.EntityRule{Ports: []api.IntOrString{api.FromInt(p)}} }
	denyAll := &api.GlobalNetworkPolicy{Metadata: api.ObjectMeta{Name: "hep-default-deny"}, Spec: api.GlobalNetworkPolicySpec{
		Order: order(1000), Selector: guarded, Types: []api.PolicyType{api.PolicyTypeIngress, api.PolicyTypeEgress}}}
	apply(denyAll)
	expect("default deny",
		probe{"tor", at(8080), false}, probe{remote.Name, at(8080), false}, probe{local.Name, at(8080), false},
		probe{n1.Name, torAt, false},
		probe{"tor", at(22), true}, probe{"tor", at(10250), true}, probe{remote.Name, at(22), true},
		// Forwarded traffic meets only applyOnForward policy.
		probe{"tor", at(30080), true})
	// BGP and etcd: new sessions come up through the failsafes, inbound
	// (node2's agent restarted connects to node1) and outbound (node1's
	// agent restarted, its rules still in the kernel, connects to etcd
	// and to node2).
	for _, n := range []string{n2.Name, n1.Name} {
		if err := l.StopAgent(ctx, n, 15); err != nil {
			t.Fatal(err)
		}
		if err := l.StartAgent(ctx, n); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
		err := l.WaitEstablished(wctx)
		wcancel()
		if err != nil {
			t.Fatalf("BGP under a default-deny host policy, %s restarted: %v", n, err)
		}
	}
	expect("default deny after the restarts", probe{"tor", at(8080), false}, probe{"tor", at(22), true})
	// node1's restarted agent hears the datastore: the next change takes
	// effect.
	apply(&api.GlobalNetworkPolicy{Metadata: api.ObjectMeta{Name: "hep-allow-8080"}, Spec: api.GlobalNetworkPolicySpec{
		Order: order(10), Selector: guarded,
		Ingress: []api.Rule{{Action: api.ActionAllow, Protocol: &tcp, Destination: port(8080)}},
		Egress:  []api.Rule{{Action: api.ActionAllow, Protocol: &tcp, Destination: port(9090)}}}})
	expect("allow rules", probe{"tor", at(8080), true}, probe{remote.Name, at(8080), true}, probe{local.Name, at(8080), true},
		probe{n1.Name, torAt, true})

	pre := &api.GlobalNetworkPolicy{Metadata: api.ObjectMeta{Name: "hep-block-nodeport"}, Spec: api.GlobalNetworkPolicySpec{
		Order: order(10), Selector: guarded, PreDNAT: true, ApplyOnForward: true,
		Ingress: []api.Rule{{Action: api.ActionDeny, Protocol: &tcp, Destination: port(30080)}}}}
	apply(pre)
	expect("preDNAT deny of the NodePort", probe{"tor", at(30080), false}, probe{"tor", at(8080), true}, probe{"tor", at(22), true})
	if err := store.Delete(ctx, api.KindGlobalNetworkPolicy, "", pre.Metadata.Name, ""); err != nil {
		t.Fatal(err)
	}
	expect("preDNAT policy gone", probe{"tor", at(30080), true})

	// A host endpoint for an interface node1 does not have: reported, and
	// policed once the interface appears.
	apply(&api.HostEndpoint{Metadata: api.ObjectMeta{Name: n1.Name + "-hep9", Labels: map[string]string{"hep-test": "other"}},
		Spec: api.HostEndpointSpec{Node: n1.Name, InterfaceName: "hep9"}})
	waitHostEndpoint(ctx, t, l, n1.Name, n1.Name+"-hep9", api.HostEndpointNoInterface)
	if _, err := l.Exec(ctx, n1.Name, "ip", "link", "add", "hep9", "type", "veth", "peer", "name", "hep9p"); err != nil {
		t.Fatal(err)
	}
	// The agent watches links: well before the 30 s resync.
	waitHostEndpointWithin(ctx, t, l, n1.Name, n1.Name+"-hep9", api.HostEndpointPoliced, 10*time.Second)

	// Removing the policies and the configuration leaves nothing policed.
	for _, n := range []string{"hep-default-deny", "hep-allow-8080"} {
		if err := store.Delete(ctx, api.KindGlobalNetworkPolicy, "", n, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.Delete(ctx, api.KindHostEndpoint, "", n1.Name+"-hep9", ""); err != nil {
		t.Fatal(err)
	}
	if err := store.Delete(ctx, api.KindClusterConfiguration, "", api.SingletonName, ""); err != nil {
		t.Fatal(err)
	}
	expect("all removed", open...)
}

// hepTorAddr is the ToR's fabric address.
func hepTorAddr(t *testing.T, l *lab.Lab) netip.Addr {
	t.Helper()
	out, err := l.Exec(context.Background(), "tor", "ip", "-4", "-o", "addr", "show", "scope", "global")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(out)) {
		if p, err := netip.ParsePrefix(f); err == nil && p.Addr().Is4() && netip.MustParsePrefix("198.18.0.0/15").Contains(p.Addr()) {
			return p.Addr()
		}
	}
	t.Fatalf("no fabric address on the ToR: %s", out)
	return netip.Addr{}
}

// labelNode sets a label on a Node.
func labelNode(ctx context.Context, t *testing.T, l *lab.Lab, node, k, v string) {
	t.Helper()
	obj, err := l.Store().Get(ctx, api.KindNode, "", node)
	if err != nil {
		t.Fatal(err)
	}
	n, ok := obj.(*api.Node)
	if !ok {
		t.Fatalf("node %s is a %T", node, obj)
	}
	if n.Metadata.Labels == nil {
		n.Metadata.Labels = map[string]string{}
	}
	n.Metadata.Labels[k] = v
	if _, err := l.Store().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
}

// waitHostEndpoint waits for the node's agent to report a host endpoint in
// a state.
func waitHostEndpoint(ctx context.Context, t *testing.T, l *lab.Lab, node, hep, state string) {
	t.Helper()
	waitHostEndpointWithin(ctx, t, l, node, hep, state, 30*time.Second)
}

func waitHostEndpointWithin(ctx context.Context, t *testing.T, l *lab.Lab, node, hep, state string, within time.Duration) {
	t.Helper()
	testkit.EventuallyEvery(t, within, 200*time.Millisecond, "host endpoint "+hep+" "+state, func() error {
		st, err := l.NodeStatus(ctx, node)
		if err != nil {
			return err
		}
		for _, h := range st.HostEndpoints {
			if h.Name == hep && h.State == state {
				return nil
			}
		}
		return fmt.Errorf("host endpoints %+v", st.HostEndpoints)
	})
}
