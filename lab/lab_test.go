package lab

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/internal/testkit"
)

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		want []string // substrings of the error; none = valid
	}{
		{"defaults", Options{Nodes: 3}, nil},
		{"rr", Options{Nodes: 3, RouteReflectors: 3, PodsPerNode: 2}, nil},
		{"bad name", Options{Name: "Lab_1", Nodes: 1}, []string{`name "Lab_1"`}},
		{"long name", Options{Name: "abcdefghijklmnopqrstu"}, []string{"name"}},
		{"too many rrs", Options{Nodes: 2, RouteReflectors: 3}, []string{"route reflectors: 3"}},
		{"auto reflectors", Options{Nodes: 8, AutoReflectors: 2, PodsPerNode: 1}, nil},
		{"auto and manual reflectors", Options{Nodes: 8, AutoReflectors: 2, RouteReflectors: 2, Zones: 27},
			[]string{"auto reflectors: not with route reflectors chosen by hand", "zones: 27 out of range"}},
		{"reflector candidates", Options{Nodes: 9, AutoReflectors: 2, Zones: 3, ReflectorCandidates: 6}, nil},
		{"bad reflector candidates", Options{Nodes: 9, RouteReflectors: 2, ReflectorCandidates: 10},
			[]string{"reflector candidates: 10 out of range 0-9", "reflector candidates: only with auto reflectors"}},
		{"too many auto reflectors", Options{Nodes: 8, AutoReflectors: 17}, []string{"auto reflectors: 17 out of range 0-16"}},
		{"too many nodes", Options{Nodes: 245}, []string{"nodes: 245"}},
		{"pods without agents", Options{Nodes: 1, PodsPerNode: 1, NoAgents: true}, []string{"pods need agents"}},
		{"relative run dir", Options{Nodes: 1, RunDir: "run"}, []string{"must be absolute"}},
		{"etcd cluster", Options{Nodes: 1, EtcdMembers: 3}, nil},
		{"too many etcd members", Options{Nodes: 1, EtcdMembers: MaxEtcdMembers + 1}, []string{"etcd members: 10"}},
		{"every problem", Options{Name: "-", Nodes: -1, PodsPerNode: -1}, []string{"name", "nodes: -1", "pods per node: -1"}},
		{"narrower pool", Options{Nodes: 1, IPv4Pool: CNIBenchPool}, nil},
		{"pool outside PodPool", Options{Nodes: 1, IPv4Pool: netip.MustParsePrefix("10.245.0.0/17")}, []string{"ipv4 pool 10.245.0.0/17"}},
		{"pool wider than PodPool", Options{Nodes: 1, IPv4Pool: netip.MustParsePrefix("10.0.0.0/8")}, []string{"ipv4 pool 10.0.0.0/8"}},
		{"ipv6 pool as ipv4", Options{Nodes: 1, IPv4Pool: netip.MustParsePrefix("fd00::/64")}, []string{"ipv4 pool fd00::/64"}},
		{"ipv6-only fabric", Options{Nodes: 3, IPv6OnlyFabric: true, PodsPerNode: 1, EtcdMembers: 3}, nil},
		{"ipv6-only fabric on ipv4 parts", Options{Nodes: 3, IPv6OnlyFabric: true, TwoSubnets: true, EtcdProxy: true},
			[]string{"two subnets: not available with an IPv6-only fabric", "etcd proxy: not available with an IPv6-only fabric"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.o
			o.Default()
			err := o.Validate()
			testkit.ErrMentions(t, "Validate()", err, tt.want)
		})
	}
}

func TestNodeAddressing(t *testing.T) {
	got := []string{nodePrefix(firstNodeHost).String(), nodePrefix(firstNodeHost + 9).String(), NodeName(4), podName(2, 3),
		nodePrefix6(firstNodeHost).String(), nodePrefix6(maxNodeHost).String()}
	want := []string{"198.18.0.11/24", "198.18.0.20/24", "node4", "n2p3", "2001:db8::b/64", "2001:db8::fe/64"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("addressing (-want +got):\n%s", diff)
	}
}

// etcd members sit between the ToR and the first node, the first one named
// and addressed as the single etcd of a one-member lab.
func TestEtcdMembers(t *testing.T) {
	var got []string
	for _, m := range etcdMembers(MaxEtcdMembers, false) {
		got = append(got, m.Name+" "+m.ClientURL()+" "+m.peerURL())
	}
	want := []string{
		"etcd http://198.18.0.2:2379 http://198.18.0.2:2380",
		"etcd2 http://198.18.0.3:2379 http://198.18.0.3:2380",
	}
	if diff := cmp.Diff(want, got[:2]); diff != "" {
		t.Errorf("members (-want +got):\n%s", diff)
	}
	last := etcdMembers(MaxEtcdMembers, false)[MaxEtcdMembers-1].Addr
	if !last.Less(nodePrefix(firstNodeHost).Addr()) || !torAddr.Less(etcdAddr) {
		t.Errorf("etcd members up to %s collide with the ToR %s or node1 %s", last, torAddr, nodePrefix(firstNodeHost).Addr())
	}
	st := State{Etcd: etcdMembers(3, false)}
	if diff := cmp.Diff([]string{"http://198.18.0.2:2379", "http://198.18.0.3:2379", "http://198.18.0.4:2379"}, st.EtcdEndpoints()); diff != "" {
		t.Errorf("endpoints (-want +got):\n%s", diff)
	}
}

// An IPv6-only fabric: etcd members on 2001:db8::2 on, agents without an
// IPv4 address (--node-ip none) nor IPv4 pool, a node's underlay address
// its IPv6 one.
func TestIPv6OnlyFabric(t *testing.T) {
	st := &State{Etcd: etcdMembers(2, true), NoIPv4: true, DualStack: true, BinDir: "/b"}
	if diff := cmp.Diff([]string{"http://[2001:db8::2]:2379", "http://[2001:db8::3]:2379"}, st.EtcdEndpoints()); diff != "" {
		t.Errorf("endpoints (-want +got):\n%s", diff)
	}
	n := &NodeState{Name: "node1", IP6: nodePrefix6(firstNodeHost)}
	if n.Underlay() != n.IP6 || n.host() != firstNodeHost {
		t.Errorf("underlay %v, host %d", n.Underlay(), n.host())
	}
	l := &Lab{dir: "/run/x"}
	argv := strings.Join(l.agentArgv(st, n), " ")
	for _, want := range []string{"--node-ip none", "--node-ip6 2001:db8::b/64", "--default-ipv6-pool " + PodPool6, "--etcd-endpoints http://[2001:db8::2]:2379,http://[2001:db8::3]:2379"} {
		if !strings.Contains(argv, want) {
			t.Errorf("agent argv %q: want %q", argv, want)
		}
	}
	if strings.Contains(argv, "ipv4-pool") {
		t.Errorf("agent argv %q: an IPv4 pool on an IPv6-only node", argv)
	}
	d4 := &NodeState{Name: "node2", IP: nodePrefix(firstNodeHost + 1)}
	if d4.Underlay() != d4.IP || d4.host() != firstNodeHost+1 {
		t.Errorf("IPv4 node: underlay %v, host %d", d4.Underlay(), d4.host())
	}
}

// Client agents' arguments go to every node after the reflectors and the
// reflector candidates, after the arguments every agent gets.
func TestClientAgentArgs(t *testing.T) {
	l := &Lab{dir: "/run/x"}
	for _, tc := range []struct {
		st     State
		node   string
		client bool
	}{
		{State{RouteReflectors: 2}, "node2", false},
		{State{RouteReflectors: 2}, "node3", true},
		{State{ReflectorCandidates: 4}, "node4", false},
		{State{ReflectorCandidates: 4}, "node10", true},
		{State{}, "node1", true},
	} {
		st := tc.st
		st.BinDir, st.AgentArgs, st.ClientAgentArgs = "/b", []string{"--log-level=debug"}, []string{"--max-procs=1"}
		argv := strings.Join(l.agentArgv(&st, &NodeState{Name: tc.node, IP: nodePrefix(firstNodeHost)}), " ")
		if got := strings.HasSuffix(argv, "--log-level=debug --max-procs=1"); got != tc.client {
			t.Errorf("%s of %+v: argv %q; client arguments last: %v, want %v", tc.node, tc.st, argv, got, tc.client)
		}
		if !strings.Contains(argv, "--log-level=debug") {
			t.Errorf("%s: argv %q lacks every agent's arguments", tc.node, argv)
		}
	}
}

func TestParseRoutes(t *testing.T) {
	out := `10.244.11.64/26 via 198.18.0.12 dev eth0 proto 81
10.244.158.128/26 proto 81
	nexthop via 198.18.0.13 dev eth0 weight 1
	nexthop via 198.18.0.14 dev eth0 weight 1
10.244.197.5 via 198.18.0.13 dev eth0 proto 81
`
	want := map[string][]string{
		"10.244.11.64/26":   {"198.18.0.12"},
		"10.244.158.128/26": {"198.18.0.13", "198.18.0.14"},
		"10.244.197.5":      {"198.18.0.13"},
	}
	if diff := cmp.Diff(want, parseRoutes(out)); diff != "" {
		t.Errorf("parseRoutes (-want +got):\n%s", diff)
	}
}

func TestExpectedPeers(t *testing.T) {
	nodes := func(n int) []NodeState {
		var s []NodeState
		for i := 1; i <= n; i++ {
			s = append(s, NodeState{Name: NodeName(i)})
		}
		return s
	}
	tests := []struct {
		name string
		st   State
		want map[string]int
	}{
		{"mesh", State{Nodes: nodes(3)}, map[string]int{"node1": 2, "node2": 2, "node3": 2}},
		{"one reflector", State{Nodes: nodes(3), RouteReflectors: 1}, map[string]int{"node1": 2, "node2": 1, "node3": 1}},
		{"two reflectors", State{Nodes: nodes(4), RouteReflectors: 2}, map[string]int{"node1": 3, "node2": 3, "node3": 2, "node4": 2}},
		{"single node", State{Nodes: nodes(1)}, map[string]int{"node1": 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, expectedPeers(&tt.st)); diff != "" {
				t.Errorf("expectedPeers (-want +got):\n%s", diff)
			}
		})
	}
}

func TestInjectLabels(t *testing.T) {
	in := []byte(`{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"tabby","mtu":1500},{"type":"portmap"}]}`)
	out, err := injectLabels(in, map[string]string{"tier": "fe", "app": "web"})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Plugins []struct {
			Type string `json:"type"`
			Args struct {
				CNI struct {
					Labels []map[string]string `json:"labels"`
				} `json:"cni"`
			} `json:"args"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	want := []map[string]string{{"key": "app", "value": "web"}, {"key": "tier", "value": "fe"}}
	for _, p := range got.Plugins {
		if diff := cmp.Diff(want, p.Args.CNI.Labels); diff != "" {
			t.Errorf("labels of %s (-want +got):\n%s", p.Type, diff)
		}
	}
}

func TestLabelsAndArgs(t *testing.T) {
	ls, err := ParseLabels("app=web,tier=fe,empty=")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"app": "web", "tier": "fe", "empty": ""}, ls); diff != "" {
		t.Errorf("ParseLabels (-want +got):\n%s", diff)
	}
	if got := formatLabels(ls); got != "app=web,empty=,tier=fe" {
		t.Errorf("formatLabels = %q", got)
	}
	for _, bad := range []string{"app", "=x", "a=b,,c=d"} {
		if _, err := ParseLabels(bad); err == nil {
			t.Errorf("ParseLabels(%q) = nil error", bad)
		}
	}
	p := &PodState{Name: "web", Namespace: "shop", ContainerID: "abc"}
	args, err := ParseCNIArgs(cniArgs(p))
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "shop"}, {"K8S_POD_NAME", "web"}, {"K8S_POD_INFRA_CONTAINER_ID", "abc"}}
	if diff := cmp.Diff(want, args); diff != "" {
		t.Errorf("CNI args (-want +got):\n%s", diff)
	}
}

func TestResultIPs(t *testing.T) {
	got, err := resultIPs([]byte(`{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.244.3.4/32","interface":0}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]netip.Prefix{netip.MustParsePrefix("10.244.3.4/32")}, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("resultIPs (-want +got):\n%s", diff)
	}
	if _, err := resultIPs([]byte(`{"ips":[{"address":"nonsense"}]}`)); err == nil {
		t.Error("resultIPs accepted a bad address")
	}
}

// TestProcAlive checks that a recorded process is recognised only while
// it runs with the command line and start time we recorded.
func TestProcAlive(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	st, err := procStartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	p := &Proc{Role: "sleeper", PID: cmd.Process.Pid, Argv: []string{"nsenter", "--net=/run/netns/x", "--", "sleep", "30"}, StartTime: st}
	if !p.Alive() {
		t.Fatal("alive() = false for the running process (command line after nsenter exec'd)")
	}
	for name, q := range map[string]*Proc{
		"other command line": {PID: p.PID, Argv: []string{"nsenter", "--", "sleep", "31"}, StartTime: st},
		"other start time":   {PID: p.PID, Argv: p.Argv, StartTime: st + 1},
		"no pid":             {Argv: p.Argv},
	} {
		if q.Alive() {
			t.Errorf("%s: alive() = true", name)
		}
	}
	if err := p.Stop(t.Context(), syscall.SIGTERM, 5*time.Second, done); err != nil {
		t.Fatal(err)
	}
	if p.Alive() {
		t.Error("alive() = true after stop")
	}
}

func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	st := &State{
		Name: "lab", Dir: dir, Namespaces: []string{"lab-fabric", "lab-node1"},
		Nodes: []NodeState{{Name: "node1", NetNS: "lab-node1", IP: nodePrefix(11), Agent: &Proc{Role: "agent node1", PID: 42, Argv: []string{"a"}}}},
		Pods:  []PodState{{Name: "p", Node: "node1", IPs: []netip.Prefix{netip.MustParsePrefix("10.244.0.1/32")}}},
	}
	if err := st.save(); err != nil {
		t.Fatal(err)
	}
	got, err := loadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(st, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("state round trip (-want +got):\n%s", diff)
	}
	got.addNamespace("lab-node1")
	got.addNamespace("lab-pod-p")
	got.removeNamespace("lab-fabric")
	if diff := cmp.Diff([]string{"lab-node1", "lab-pod-p"}, got.Namespaces); diff != "" {
		t.Errorf("namespaces (-want +got):\n%s", diff)
	}
}

// TestRemoveCgroupRootRefuses: only a lab's cgroup root is ever removed.
func TestRemoveCgroupRootRefuses(t *testing.T) {
	for _, root := range []string{"", "/", "/kubepods", "/system.slice", "tabby-lab-x"} {
		if err := removeCgroupRoot(root); err == nil || !strings.Contains(err.Error(), "refusing") {
			t.Errorf("removeCgroupRoot(%q) = %v, want a refusal", root, err)
		}
	}
}

// TestNodeToStart: a process is started only on a node the lab has and
// only while it is not running.
func TestNodeToStart(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	start, err := procStartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	running := &Proc{PID: cmd.Process.Pid, Argv: []string{"sleep", "30"}, StartTime: start}
	st := &State{Nodes: []NodeState{{Name: "node1", Agent: running}, {Name: "node2"}}}
	agent := func(n *NodeState) *Proc { return n.Agent }

	if n, err := st.NodeToStart("node2", "agent", agent); err != nil || n != &st.Nodes[1] {
		t.Errorf("NodeToStart(node2) = %v, %v; want node2's record", n, err)
	}
	for node, want := range map[string]string{
		"node1": fmt.Sprintf("the agent of node1 is running (pid %d)", running.PID),
		"node9": `no node "node9"`,
	} {
		if _, err := st.NodeToStart(node, "agent", agent); err == nil || err.Error() != want {
			t.Errorf("NodeToStart(%s) = %v, want %q", node, err, want)
		}
	}
}

// With a relay (Options.Relay) the agents' views watch through it and
// everything else still goes to etcd; without one they get no
// --watch-endpoints. The relay watches etcd itself, not the proxy.
func TestRelayArgv(t *testing.T) {
	st := &State{Etcd: etcdMembers(1, false), BinDir: "/b"}
	n := &NodeState{Name: "node1", IP: nodePrefix(firstNodeHost)}
	l := &Lab{dir: "/run/x"}
	if argv := strings.Join(l.agentArgv(st, n), " "); strings.Contains(argv, "--watch-endpoints") {
		t.Errorf("agent argv %q without a relay: want no --watch-endpoints", argv)
	}
	st.Relay, st.EtcdProxy = &Proc{PID: 1}, &Proc{PID: 2}
	argv := strings.Join(l.agentArgv(st, n), " ")
	for _, want := range []string{"--watch-endpoints http://198.18.0.2:23792", "--etcd-endpoints " + st.EtcdProxyURL()} {
		if !strings.Contains(argv, want) {
			t.Errorf("agent argv %q: want %q", argv, want)
		}
	}
	relay := strings.Join(RelayArgv("/b/tabby-relay", st.EtcdEndpoints(), "198.18.0.2:23792", 0), " ")
	if want := "/b/tabby-relay --etcd-endpoints http://198.18.0.2:2379 --listen 198.18.0.2:23792"; relay != want {
		t.Errorf("relay argv %q, want %q", relay, want)
	}
	relay = strings.Join(RelayArgv("/b/tabby-relay", st.EtcdEndpoints(), "198.18.0.2:23792", time.Second), " ")
	if want := "/b/tabby-relay --etcd-endpoints http://198.18.0.2:2379 --listen 198.18.0.2:23792 --batch-window 1s"; relay != want {
		t.Errorf("relay argv with a window %q, want %q", relay, want)
	}
	for _, o := range []Options{{Nodes: 1, RelayWindow: time.Second}, {Nodes: 1, Relay: true, RelayWindow: time.Minute}} {
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "relay window") {
			t.Errorf("relay %v window %s: %v, want refused", o.Relay, o.RelayWindow, err)
		}
	}
	if err := (&Options{Nodes: 1, IPv6OnlyFabric: true, Relay: true}).Validate(); err == nil || !strings.Contains(err.Error(), "relay") {
		t.Errorf("a relay on an IPv6-only fabric: %v, want refused", err)
	}
}
