package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tabbynet/tabby/agent"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
	"github.com/tabbynet/tabby/policy"
)

// Pods of the policy lab: three namespaces, three nodes.
var policyPods = []struct {
	name, node, ns, app string
}{
	{"aweb", "node1", "alpha", "web"},
	{"bcli", "node1", "beta", "client"},
	{"acli", "node2", "alpha", "client"},
	{"bweb", "node2", "beta", "web"},
	{"adb", "node3", "alpha", "db"},
	{"ccli", "node3", "gamma", "client"},
}

// Every server listens on these ports.
var (
	serverTCP = []int{80, 5432, 8080, 8085, 9100}
	serverUDP = []int{53}
)

// policyCase is one row of the truth table: a new connection from src to
// dst's address on proto/port is allowed or dropped.
type policyCase struct {
	src, dst, proto string
	port            int
	allowed         bool
}

// policyStep is a set of policies and the cases that must hold under it.
type policyStep struct {
	name  string
	objs  []api.Object
	cases []policyCase
}

func labels(kv ...string) *api.LabelSelector {
	s := &api.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func netpol(ns, name string, spec api.NetworkPolicySpec) *api.NetworkPolicy {
	return &api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
}

func globalpol(name string, order float64, spec api.GlobalNetworkPolicySpec) *api.GlobalNetworkPolicy {
	spec.Order = &order
	return &api.GlobalNetworkPolicy{Metadata: api.ObjectMeta{Name: name}, Spec: spec}
}

func nsName(ns string) *api.LabelSelector { return labels(policy.NamespaceNameLabel, ns) }

func strp(s string) *string { return &s }

func policySteps(ips map[string]netip.Addr) []policyStep {
	tcp := func(p int32) api.NetworkPolicyPort {
		return api.NetworkPolicyPort{Protocol: strp("TCP"), Port: &api.IntOrString{IntVal: p}}
	}
	endPort := int32(8100)
	ingress := []api.PolicyType{api.PolicyTypeIngress}
	egress := []api.PolicyType{api.PolicyTypeEgress}
	return []policyStep{
		{"default allow", nil, []policyCase{
			{"acli", "aweb", "tcp", 80, true},  // across nodes
			{"ccli", "adb", "tcp", 5432, true}, // same node
			{"bcli", "bweb", "udp", 53, true},
			{"aweb", "bweb", "tcp", 8080, true},
		}},
		{"default-deny ingress", []api.Object{
			netpol("alpha", "deny-ingress", api.NetworkPolicySpec{PolicyTypes: ingress}),
		}, []policyCase{
			{"acli", "aweb", "tcp", 80, false},
			{"bcli", "aweb", "tcp", 80, false}, // same node
			{"ccli", "adb", "tcp", 5432, false},
			{"bcli", "bweb", "tcp", 80, true}, // beta is not isolated
			{"aweb", "bweb", "tcp", 80, true}, // alpha's egress is not isolated
			{"acli", "bweb", "udp", 53, true},
		}},
		{"namespace isolation and namespaceSelector+podSelector in one peer", []api.Object{
			netpol("alpha", "deny-ingress", api.NetworkPolicySpec{PolicyTypes: ingress}),
			netpol("alpha", "same-namespace", api.NetworkPolicySpec{
				Ingress: []api.NetworkPolicyIngressRule{{From: []api.NetworkPolicyPeer{{PodSelector: labels()}}}}}),
			netpol("alpha", "web-from-beta-clients", api.NetworkPolicySpec{PodSelector: *labels("app", "web"),
				Ingress: []api.NetworkPolicyIngressRule{{
					From:  []api.NetworkPolicyPeer{{NamespaceSelector: nsName("beta"), PodSelector: labels("app", "client")}},
					Ports: []api.NetworkPolicyPort{tcp(8080)},
				}}}),
		}, []policyCase{
			{"acli", "aweb", "tcp", 80, true},
			{"acli", "adb", "tcp", 5432, true},
			{"ccli", "adb", "tcp", 5432, false},  // gamma
			{"bcli", "aweb", "tcp", 8080, true},  // beta client
			{"bcli", "aweb", "tcp", 80, false},   // wrong port
			{"bweb", "aweb", "tcp", 8080, false}, // beta, not a client
			{"ccli", "aweb", "tcp", 8080, false}, // a client, not in beta
		}},
		{"default-deny egress, ipBlock except, port range", []api.Object{
			netpol("beta", "dns-only", api.NetworkPolicySpec{
				Egress:      []api.NetworkPolicyEgressRule{{Ports: []api.NetworkPolicyPort{{Protocol: strp("UDP"), Port: &api.IntOrString{IntVal: 53}}}}},
				PolicyTypes: egress}),
			netpol("beta", "clients-to-pods", api.NetworkPolicySpec{PodSelector: *labels("app", "client"),
				Egress: []api.NetworkPolicyEgressRule{{
					To:    []api.NetworkPolicyPeer{{IPBlock: &api.IPBlock{CIDR: "10.244.0.0/16", Except: []string{ips["aweb"].String() + "/32"}}}},
					Ports: []api.NetworkPolicyPort{{Protocol: strp("TCP"), Port: &api.IntOrString{IntVal: 8000}, EndPort: &endPort}},
				}},
				PolicyTypes: egress}),
		}, []policyCase{
			{"bcli", "bweb", "tcp", 8080, true},
			{"bcli", "bweb", "tcp", 8085, true},
			{"bcli", "bweb", "tcp", 9100, false}, // outside the range
			{"bcli", "adb", "tcp", 8080, true},
			{"bcli", "aweb", "tcp", 8080, false}, // the excepted address
			{"bcli", "bweb", "udp", 53, true},
			{"bweb", "aweb", "tcp", 80, false},
			{"bweb", "adb", "udp", 53, true},
			{"acli", "bweb", "tcp", 80, true}, // beta's ingress is not isolated
		}},
		{"a global deny overrides a namespaced allow", []api.Object{
			netpol("alpha", "allow-all", api.NetworkPolicySpec{Ingress: []api.NetworkPolicyIngressRule{{}}}),
			globalpol("deny-gamma-to-alpha", 10, api.GlobalNetworkPolicySpec{NamespaceSelector: nsName("alpha"),
				Ingress: []api.Rule{{Action: api.ActionDeny, Source: api.EntityRule{NamespaceSelector: nsName("gamma")}}}}),
		}, []policyCase{
			{"ccli", "aweb", "tcp", 80, false},
			{"ccli", "adb", "tcp", 5432, false}, // same node
			{"acli", "aweb", "tcp", 80, true},
			{"bcli", "adb", "tcp", 5432, true},
			{"ccli", "bweb", "tcp", 80, true},
		}},
		{"global order and protocols, named port", []api.Object{
			globalpol("db-udp", 1, api.GlobalNetworkPolicySpec{Selector: labels("app", "db"),
				Ingress: []api.Rule{{Action: api.ActionAllow, Protocol: strp("UDP")}}}),
			globalpol("db-deny", 2, api.GlobalNetworkPolicySpec{Selector: labels("app", "db"),
				Ingress: []api.Rule{{Action: api.ActionDeny}}}),
			netpol("alpha", "web-http", api.NetworkPolicySpec{PodSelector: *labels("app", "web"),
				Ingress: []api.NetworkPolicyIngressRule{{Ports: []api.NetworkPolicyPort{{Protocol: strp("TCP"), Port: &api.IntOrString{IsString: true, StrVal: "http"}}}}}}),
		}, []policyCase{
			{"acli", "adb", "udp", 53, true},
			{"acli", "adb", "tcp", 5432, false},
			{"ccli", "adb", "udp", 53, true},
			{"acli", "aweb", "tcp", 8080, true}, // aweb's port "http"
			{"acli", "aweb", "tcp", 80, false},
			{"bweb", "aweb", "udp", 53, false},
		}},
		{"back to no policy", nil, []policyCase{
			{"ccli", "aweb", "tcp", 80, true},
			{"ccli", "adb", "tcp", 5432, true},
			{"bcli", "aweb", "tcp", 9100, true},
		}},
	}
}

// TestPolicy brings up a 3-node lab with pods in three namespaces and
// checks a truth table of real TCP and UDP connections under a series of
// policy sets (with admin policies present that select none of the
// table's pods), then anti-spoofing and natOutgoing, once per firewall
// backend.
func TestPolicy(t *testing.T) {
	for _, b := range []struct{ backend, lab string }{
		{dataplane.FirewallNFTables, "e2epol"},
		{dataplane.FirewallIPTables, "e2epoi"},
	} {
		t.Run(b.backend, func(t *testing.T) { testPolicy(t, b.backend, b.lab) })
	}
}

func testPolicy(t *testing.T, backend, name string) {
	l := upLab(t, lab.Options{Name: name, Nodes: 3, AgentArgs: []string{"--firewall-backend", backend}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ips := map[string]netip.Addr{}
	for _, p := range policyPods {
		pod, err := l.AddPod(ctx, p.node, p.name, lab.PodOptions{Namespace: p.ns, Labels: map[string]string{"app": p.app}})
		if err != nil {
			t.Fatalf("adding pod %s: %v", p.name, err)
		}
		ips[p.name] = pod.IPs[0].Addr()
	}
	servers := map[string]*policyServer{}
	for _, p := range policyPods {
		if p.app != "client" {
			servers[p.name] = startPolicyServer(t, l, p.name, p.name, serverTCP, serverUDP)
		}
	}
	t.Cleanup(func() { deleteAllPolicies(t, l) })
	nameAWebPort(ctx, t, l)
	waitPolicyConverged(ctx, t, l)
	for _, n := range l.State().Nodes {
		if got, err := nftTableIn(t, l, n.Name); err != nil || got != (backend == dataplane.FirewallNFTables) {
			t.Fatalf("node %s: nftables table present = %v (%v) with backend %s", n.Name, got, err, backend)
		}
	}

	// Every step runs with admin policies present that select only
	// namespace zulu (issue 31): the verdicts must not change. zulu's one
	// pod, in no case of the table, shows they are in force.
	if _, err := l.AddPod(ctx, "node3", "zadm", lab.PodOptions{Namespace: "zulu", Labels: map[string]string{"app": "client"}}); err != nil {
		t.Fatalf("adding pod zadm: %v", err)
	}
	total := 0
	for _, step := range policySteps(ips) {
		ok := t.Run(step.name, func(t *testing.T) {
			setPolicies(ctx, t, l, append(slices.Clone(step.objs), bystanderAdminPolicies()...))
			waitPolicyConverged(ctx, t, l)
			checkCases(ctx, t, l, ips, step.cases)
		})
		total += len(step.cases)
		if !ok {
			break
		}
	}
	t.Logf("%d truth-table cases", total)
	t.Run("AdminPoliciesInForce", func(t *testing.T) {
		checkCases(ctx, t, l, ips, []policyCase{
			{"zadm", "aweb", "tcp", 80, false},  // across nodes
			{"zadm", "adb", "tcp", 5432, false}, // same node
		})
	})
	t.Run("NewPodReadyAtOnce", func(t *testing.T) { testNewPodReady(ctx, t, l, ips) })
	t.Run("AntiSpoofing", func(t *testing.T) { testSpoofing(ctx, t, l, ips, servers["aweb"]) })
	t.Run("NATOutgoing", func(t *testing.T) { testNATOutgoing(ctx, t, l, ips) })
}

// bystanderAdminPolicies deny everything in and out of namespace zulu,
// in tier kube-admin and in tier kube-baseline: no pod of the truth table
// is in zulu, so its verdicts must not change.
func bystanderAdminPolicies() []api.Object {
	var out []api.Object
	for _, tier := range []string{api.TierKubeAdmin, api.TierKubeBaseline} {
		deny := []api.Rule{{Action: api.ActionDeny}}
		out = append(out, globalpol(tier+"-deny-zulu", 1, api.GlobalNetworkPolicySpec{Tier: tier, NamespaceSelector: nsName("zulu"),
			Ingress: deny, Egress: deny}))
	}
	return out
}

// nameAWebPort gives aweb's endpoint the named port http=8080, as a
// runtime would for a container port (the lab's CNI call cannot).
func nameAWebPort(ctx context.Context, t *testing.T, l *lab.Lab) {
	t.Helper()
	objs, _, err := l.Store().List(ctx, api.KindWorkloadEndpoint, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		w := o.(*api.WorkloadEndpoint)
		if w.Spec.Pod == "aweb" {
			w.Spec.Ports = []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}}
			if _, err := l.Store().Update(ctx, w); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatal("no endpoint for aweb")
}

// setPolicies makes the datastore hold exactly objs among the policies.
func setPolicies(ctx context.Context, t *testing.T, l *lab.Lab, objs []api.Object) {
	t.Helper()
	keep := map[string]bool{}
	for _, o := range objs {
		m := o.GetMeta()
		keep[api.KindOf(o)+"/"+m.Namespace+"/"+m.Name] = true
		if _, err := l.Store().Apply(ctx, o); err != nil {
			t.Fatalf("applying %s %s: %v", api.KindOf(o), m.Name, err)
		}
	}
	// Tiers last: a tier goes once no policy names it.
	for _, kind := range []string{api.KindNetworkPolicy, api.KindGlobalNetworkPolicy, api.KindStagedGlobalNetworkPolicy, api.KindTier} {
		cur, _, err := l.Store().List(ctx, kind, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range cur {
			m := o.GetMeta()
			if !keep[kind+"/"+m.Namespace+"/"+m.Name] {
				if err := l.Store().Delete(ctx, kind, m.Namespace, m.Name, ""); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

func deleteAllPolicies(t *testing.T, l *lab.Lab) {
	if l.Store() == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	setPolicies(ctx, t, l, nil)
}

// checkCases probes every case, a few at a time, and reports each wrong
// one. A case is tried twice before it counts as wrong, so that a first
// packet lost to neighbour resolution does not fail the test.
func checkCases(ctx context.Context, t *testing.T, l *lab.Lab, ips map[string]netip.Addr, cases []policyCase) {
	t.Helper()
	checkCasesVia(ctx, t, ips, cases, casePath{
		name: "direct",
		ns:   func(src string) string { return netnsPath(t, l, src) },
		addr: func(c policyCase) netip.AddrPort { return netip.AddrPortFrom(ips[c.dst], uint16(c.port)) },
	})
}

// casePath is one way of probing a truth-table case: from the network
// namespace ns(src), to addr(case) — dst's own address, or a Service's
// address that leads to it.
type casePath struct {
	name string
	ns   func(src string) string
	addr func(c policyCase) netip.AddrPort
}

// checkCasesVia probes every case along every path; each case must get its
// verdict along each, and an allowed one dst's answer with src's own
// address (ips).
func checkCasesVia(ctx context.Context, t *testing.T, ips map[string]netip.Addr, cases []policyCase, paths ...casePath) {
	t.Helper()
	var mu sync.Mutex
	var wrong []string
	var wg sync.WaitGroup
	sem := make(chan struct{}, 6)
	for _, c := range cases {
		for _, p := range paths {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				addr := p.addr(c)
				var r probeResult
				for range 2 {
					r = probeIn(ctx, p.ns(c.src), c.proto, addr)
					if r.err == nil && r.allowed == c.allowed {
						break
					}
				}
				msg := ""
				switch {
				case r.err != nil:
					msg = r.err.Error()
				case r.allowed != c.allowed:
					msg = fmt.Sprintf("allowed=%v, want %v", r.allowed, c.allowed)
				case r.allowed && r.answer != fmt.Sprintf("%s %s", c.dst, ips[c.src]):
					// Inside the cluster the server sees the client's own address.
					msg = fmt.Sprintf("answer %q", r.answer)
				default:
					return
				}
				mu.Lock()
				wrong = append(wrong, fmt.Sprintf("%s -> %s %s/%d %s (%s): %s", c.src, c.dst, c.proto, c.port, p.name, addr, msg))
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	if len(wrong) > 0 {
		slices.Sort(wrong)
		t.Errorf("%d of %d probes wrong:\n%s", len(wrong), len(cases)*len(paths), strings.Join(wrong, "\n"))
	}
}

// waitPolicyConverged waits until every node's kernel holds what the
// compiler makes of the datastore for it: the same Tabby chains with the
// same number of rules, and the same ipset members.
func waitPolicyConverged(ctx context.Context, t *testing.T, l *lab.Lab) {
	t.Helper()
	testkit.EventuallyEvery(t, 30*time.Second, 200*time.Millisecond, "policy to converge", func() error {
		diff, err := policyDiff(ctx, t, l)
		if err != nil {
			return err
		}
		if diff != "" {
			return errors.New(diff)
		}
		return nil
	})
}

func policyDiff(ctx context.Context, t *testing.T, l *lab.Lab) (string, error) {
	// The ports the lab's agents protect from their pods, as they work
	// them out from their configuration.
	acfg := agent.Config{Etcd: datastore.Config{Endpoints: l.State().EtcdEndpoints()}}
	in := policy.Input{HostProtectedPorts: acfg.HostProtectedPorts()}
	store := l.Store()
	list := func(kind string, add func(api.Object)) error {
		objs, _, err := store.List(ctx, kind, "")
		for _, o := range objs {
			add(o)
		}
		return err
	}
	if err := list(api.KindWorkloadEndpoint, func(o api.Object) { in.Endpoints = append(in.Endpoints, o.(*api.WorkloadEndpoint)) }); err != nil {
		return "", err
	}
	if err := list(api.KindNetworkPolicy, func(o api.Object) { in.NetworkPolicies = append(in.NetworkPolicies, o.(*api.NetworkPolicy)) }); err != nil {
		return "", err
	}
	if err := list(api.KindGlobalNetworkPolicy, func(o api.Object) { in.GlobalPolicies = append(in.GlobalPolicies, o.(*api.GlobalNetworkPolicy)) }); err != nil {
		return "", err
	}
	if err := list(api.KindIPPool, func(o api.Object) { in.Pools = append(in.Pools, o.(*api.IPPool)) }); err != nil {
		return "", err
	}
	if err := list(api.KindStagedGlobalNetworkPolicy, func(o api.Object) {
		in.StagedPolicies = append(in.StagedPolicies, o.(*api.StagedGlobalNetworkPolicy))
	}); err != nil {
		return "", err
	}
	var tiers []*api.Tier
	if err := list(api.KindTier, func(o api.Object) { tiers = append(tiers, o.(*api.Tier)) }); err != nil {
		return "", err
	}
	in.Tiers = api.EffectiveTiers(tiers) // as the agents' view hands them out
	guard, err := labNodeGuard(ctx, l)
	if err != nil {
		return "", err
	}
	in.Guard = guard
	var diffs []string
	for _, n := range l.State().Nodes {
		in.Node = n.Name
		rs := policy.Compile(in)
		ipt := dataplane.RenderIPTables(*rs)
		want := map[string]int{}
		for _, c := range ipt.Chains {
			want[c.Table+" "+c.Name] = len(c.Rules)
		}
		// The kernel's ipsets are both families': the IPv6 twin
		// (ip6tables) owns the family inet6 ones.
		for _, s := range append(ipt.Sets, dataplane.RenderIPTablesFamily(*rs, policy.IPv6).Sets...) {
			for _, m := range s.Members {
				want["set "+s.Name+" "+m] = 1
			}
			want["set "+s.Name] = 0
		}
		nft, err := nftTableIn(t, l, n.Name)
		if err != nil {
			return "", err
		}
		if nft {
			d, err := nftDiff(ctx, t, l, n.Name, rs)
			if err != nil {
				return "", err
			}
			diffs = append(diffs, d...)
			continue
		}
		got, err := kernelPolicy(ctx, t, l, n.Name)
		if err != nil {
			return "", err
		}
		for k, v := range want {
			if got[k] != v {
				diffs = append(diffs, fmt.Sprintf("%s: %s: kernel %d, want %d", n.Name, k, got[k], v))
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s: %s: in the kernel, not wanted", n.Name, k))
			}
		}
	}
	if len(diffs) == 0 {
		return "", nil
	}
	slices.Sort(diffs)
	if len(diffs) > 10 {
		diffs = diffs[:10]
	}
	return "\n" + strings.Join(diffs, "\n"), nil
}

// nftTableIn reports whether a node's namespace holds Tabby's nftables
// table (the agent removes the other backend's state when it starts).
func nftTableIn(t *testing.T, l *lab.Lab, node string) (bool, error) {
	fw, err := dataplane.NewNFTFirewall(dataplane.NFTConfig{NetNS: netnsPath(t, l, node)})
	if err != nil {
		return false, nil // no nf_tables here
	}
	defer fw.Close()
	return fw.HasTable()
}

// nftDiff lists how a node's nftables table differs from the ruleset.
func nftDiff(ctx context.Context, t *testing.T, l *lab.Lab, node string, rs *policy.Ruleset) ([]string, error) {
	fw, err := dataplane.NewNFTFirewall(dataplane.NFTConfig{NetNS: netnsPath(t, l, node)})
	if err != nil {
		return nil, err
	}
	defer fw.Close()
	d, err := fw.Diff(ctx, *rs)
	for i := range d {
		d[i] = node + ": " + d[i]
	}
	return d, err
}

// kernelPolicy reads a node's Tabby iptables chains (rule counts) and set
// members, as the iptables backend renders them.
func kernelPolicy(ctx context.Context, t *testing.T, l *lab.Lab, node string) (map[string]int, error) {
	fw, err := dataplane.NewIPTablesFirewall(dataplane.FirewallConfig{NetNS: netnsPath(t, l, node)})
	if err != nil {
		return nil, err
	}
	got := map[string]int{}
	for _, table := range []string{policy.TableFilter, policy.TableNAT} {
		out, err := fw.Save(ctx, table)
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) > 0 && strings.HasPrefix(f[0], ":"+policy.Prefix):
				got[table+" "+f[0][1:]] += 0
			case len(f) > 1 && f[0] == "-A" && strings.HasPrefix(f[1], policy.Prefix):
				got[table+" "+f[1]]++
			}
		}
	}
	out, err := fw.SaveSets(ctx)
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasPrefix(f[1], policy.Prefix) {
			continue
		}
		switch f[0] {
		case "create":
			got["set "+f[1]] = 0
		case "add":
			// ipset prints a host member of a hash:net set without its
			// prefix length: /32 or, in a family inet6 set, /128.
			m := f[2]
			if a, err := netip.ParseAddr(m); err == nil {
				m = netip.PrefixFrom(a, a.BitLen()).String()
			}
			got["set "+f[1]+" "+m] = 1
		}
	}
	return got, nil
}

// testNewPodReady adds a pod and at once, without waiting for anything,
// sends one UDP datagram from it: CNI ADD returns only after the pod's
// chains are in place (until then a workload interface without chains
// drops everything). The policy loop, woken by the endpoint's write, is
// usually as quick as the probe, so this is a check that a new pod works
// at once under policy; agent.TestCNIAddProgramsPolicy is the one that
// fails without the ADD hook.
func testNewPodReady(ctx context.Context, t *testing.T, l *lab.Lab, ips map[string]netip.Addr) {
	setPolicies(ctx, t, l, []api.Object{netpol("alpha", "deny-egress", api.NetworkPolicySpec{
		PodSelector: *labels("app", "fresh"),
		Egress:      []api.NetworkPolicyEgressRule{{Ports: []api.NetworkPolicyPort{{Protocol: strp("UDP"), Port: &api.IntOrString{IntVal: 53}}}}},
		PolicyTypes: []api.PolicyType{api.PolicyTypeEgress}})})
	waitPolicyConverged(ctx, t, l)
	pod, err := l.AddPod(ctx, "node1", "fresh", lab.PodOptions{Namespace: "alpha", Labels: map[string]string{"app": "fresh"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.DelPod(context.Background(), "fresh") })
	if r := probeFrom(ctx, t, l, "fresh", "udp", netip.AddrPortFrom(ips["bweb"], 53)); !r.allowed {
		t.Errorf("first datagram of a new pod: %+v, want an answer", r)
	} else if r.answer != "bweb "+pod.IPs[0].Addr().String() {
		t.Errorf("answer %q", r.answer)
	}
	// Its egress policy is in place as well.
	if r := probeFrom(ctx, t, l, "fresh", "tcp", netip.AddrPortFrom(ips["bweb"], 80)); r.allowed || r.err != nil {
		t.Errorf("TCP from the new pod under an egress policy allowing only UDP 53: %+v", r)
	}
	setPolicies(ctx, t, l, nil)
}

// testSpoofing sends UDP from acli with source addresses that are not its
// own (an unallocated one and another pod's), then one from its own: the
// server on aweb must hear only the last.
func testSpoofing(ctx context.Context, t *testing.T, l *lab.Lab, ips map[string]netip.Addr, srv *policyServer) {
	spoofed := []netip.Addr{netip.MustParseAddr("10.244.250.250"), ips["adb"]}
	for _, a := range spoofed {
		if out, err := l.Exec(ctx, "acli", "ip", "addr", "add", a.String()+"/32", "dev", "eth0"); err != nil {
			t.Fatalf("adding %s in acli: %v: %s", a, err, out)
		}
		t.Cleanup(func() {
			_, _ = l.Exec(context.Background(), "acli", "ip", "addr", "del", a.String()+"/32", "dev", "eth0")
		})
	}
	dst := netip.AddrPortFrom(ips["aweb"], 53).String()
	send := func(src netip.Addr, msg string) {
		out, err := l.Exec(ctx, "acli", "env", policyHelperEnv+"=1", os.Args[0], "-test.run=^TestPolicyHelperProcess$", "--", "udpfrom", src.String(), dst, msg)
		if err != nil {
			t.Fatalf("sending from %s: %v: %s", src, err, out)
		}
	}
	for i, a := range spoofed {
		send(a, fmt.Sprintf("spoofed-%d", i))
	}
	send(ips["acli"], "genuine")
	deadline := time.After(10 * time.Second)
	heardGenuine := false
	for !heardGenuine {
		select {
		case line := <-srv.lines:
			if strings.Contains(line, "spoofed") {
				t.Errorf("a spoofed packet arrived: %q", line)
			}
			if line == fmt.Sprintf("udp %s genuine", ips["acli"]) {
				heardGenuine = true
			}
		case <-deadline:
			t.Fatal("the genuine datagram did not arrive either")
		}
	}
	// Anything spoofed sent before the genuine one would have arrived by now;
	// drain briefly to be sure.
	linger := time.After(500 * time.Millisecond)
	for {
		select {
		case line := <-srv.lines:
			if strings.Contains(line, "spoofed") {
				t.Errorf("a spoofed packet arrived: %q", line)
			}
		case <-linger:
			return
		}
	}
}

// testNATOutgoing connects from acli (node2) to a server in the ToR
// namespace, outside every pool: with natOutgoing on (the lab's default
// pool) the server sees node2's address, with it off the pod's own.
func testNATOutgoing(ctx context.Context, t *testing.T, l *lab.Lab, ips map[string]netip.Addr) {
	startPolicyServer(t, l, "tor", "tor", []int{7000}, nil)
	var node2 netip.Addr
	for _, n := range l.State().Nodes {
		if n.Name == "node2" {
			node2 = n.IP.Addr()
		}
	}
	tor := netip.AddrPortFrom(netip.MustParseAddr("198.18.0.1"), 7000)
	expect := func(want netip.Addr) {
		t.Helper()
		var r probeResult
		for range 3 {
			if r = probeFrom(ctx, t, l, "acli", "tcp", tor); r.allowed {
				break
			}
		}
		if r.answer != "tor "+want.String() {
			t.Errorf("the ToR saw %q (err %v), want it to see %s", r.answer, r.err, want)
		}
	}
	expect(node2)

	pool := defaultPool(ctx, t, l)
	setNATOutgoing(ctx, t, l, pool, false)
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		setNATOutgoing(cctx, t, l, pool, true)
	})
	// Without NAT the ToR needs a route back to the pod; only in its own
	// namespace, removed again at the end.
	torNS, err := l.ResolveNetNS("tor")
	if err != nil {
		t.Fatal(err)
	}
	route := []string{ips["acli"].String() + "/32", "via", node2.String()}
	if out, err := l.Exec(ctx, "tor", append([]string{"ip", "route", "add"}, route...)...); err != nil {
		t.Fatalf("route in %s: %v: %s", torNS, err, out)
	}
	t.Cleanup(func() {
		_, _ = l.Exec(context.Background(), "tor", append([]string{"ip", "route", "del"}, route...)...)
	})
	waitPolicyConverged(ctx, t, l)
	expect(ips["acli"])
}

func defaultPool(ctx context.Context, t *testing.T, l *lab.Lab) string {
	t.Helper()
	objs, _, err := l.Store().List(ctx, api.KindIPPool, "")
	if err != nil || len(objs) != 1 {
		t.Fatalf("want the lab's one pool, got %d: %v", len(objs), err)
	}
	return objs[0].GetMeta().Name
}

func setNATOutgoing(ctx context.Context, t *testing.T, l *lab.Lab, name string, on bool) {
	t.Helper()
	obj, err := l.Store().Get(ctx, api.KindIPPool, "", name)
	if err != nil {
		t.Fatal(err)
	}
	p := obj.(*api.IPPool)
	p.Spec.NATOutgoing = on
	if _, err := l.Store().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
}

// labNodeGuard is the node guard the lab's agents work out from the
// cluster view: every node's addresses, the BGP peers, the listen port,
// and the agents' own ports (the lab's status listener; no GoBGP API).
func labNodeGuard(ctx context.Context, l *lab.Lab) (policy.NodeGuard, error) {
	store := l.Store()
	nodes, _, err := datastore.ListAs[*api.Node](ctx, store, api.KindNode, "")
	if err != nil {
		return policy.NodeGuard{}, err
	}
	peers, _, err := datastore.ListAs[*api.BGPPeer](ctx, store, api.KindBGPPeer, "")
	if err != nil {
		return policy.NodeGuard{}, err
	}
	cfg, err := datastore.GetAs[*api.BGPConfiguration](ctx, store, api.KindBGPConfiguration, "", "default")
	if err != nil && !errors.Is(err, datastore.ErrNotFound) {
		return policy.NodeGuard{}, err
	}
	if cfg == nil {
		cfg = &api.BGPConfiguration{Metadata: api.ObjectMeta{Name: api.SingletonName}}
	}
	cfg.SetDefaults() // as the agents' view hands it out
	http, err := netip.ParseAddrPort(lab.AgentHTTPListen)
	if err != nil {
		return policy.NodeGuard{}, err
	}
	return policy.NewNodeGuard(nodes, peers, cfg, []uint16{http.Port()}), nil
}
