package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"text/template"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// The ToR's BGP identity in TestPrivilegedBIRDInterop. The ToR namespace of
// a lab owns 198.18.0.1 on the fabric; torPrefix is a prefix it announces,
// inside the lab's underlay range 198.18.0.0/15 and reachable nowhere.
const (
	torAddr   = "198.18.0.1"
	torASN    = 65001
	torPrefix = "198.19.77.0/24"
)

// birdConf makes BIRD an eBGP top-of-rack router: one session per node,
// everything the nodes announce is accepted and put into the ToR's kernel
// (so that the ToR routes to pods, as a real ToR would), and the nodes get
// only the ToR's own static prefix. The ToR has no default route and learns
// none, so it stays a dead end for anything outside the lab.
var birdConf = template.Must(template.New("bird.conf").Parse(`# written by TestPrivilegedBIRDInterop
log stderr all;
router id {{.RouterID}};

protocol device {
	scan time 10;
}

# Pod blocks learned over BGP go into the ToR namespace's main table;
# nothing is learned from that kernel table.
protocol kernel {
	ipv4 {
		import none;
		export where source = RTS_BGP;
	};
	merge paths on;
}

protocol static tor_static {
	ipv4;
	route {{.Prefix}} blackhole;
}

template bgp tabby_node {
	local {{.RouterID}} as {{.ASN}};
	hold time 9;
	keepalive time 3;
	connect retry time 2;
	error wait time 1, 10;
	graceful restart on;
	ipv4 {
		import all;
		export where source = RTS_STATIC;
	};
}
{{range .Nodes}}
protocol bgp {{.Name}} from tabby_node {
	neighbor {{.Addr}} as {{$.NodeASN}};{{if .Password}}
	password "{{.Password}}";{{end}}
}
{{end}}`))

// birdNode is a session of birdConf: the protocol's name, the node's
// address and the TCP-MD5 password ("" for none).
type birdNode struct{ Name, Addr, Password string }

// bird is a BIRD daemon this test started in the lab's ToR namespace.
type bird struct {
	ctl, log, conf string
}

// startBIRD writes the configuration and runs BIRD in the ToR namespace
// until the test ends.
func startBIRD(t testing.TB, l *lab.Lab) *bird {
	t.Helper()
	return runBIRD(t, l, birdConfText(t, birdNodes(l, nil)))
}

// birdNodes are the lab's nodes as birdConf sessions, with the passwords
// passwords gives by node name.
func birdNodes(l *lab.Lab, passwords map[string]string) []birdNode {
	var nodes []birdNode
	for _, n := range l.State().Nodes {
		nodes = append(nodes, birdNode{Name: n.Name, Addr: n.IP.Addr().String(), Password: passwords[n.Name]})
	}
	return nodes
}

// birdConfText is birdConf for the sessions nodes.
func birdConfText(t testing.TB, nodes []birdNode) string {
	t.Helper()
	var sb strings.Builder
	err := birdConf.Execute(&sb, map[string]any{
		"RouterID": torAddr, "ASN": torASN, "Prefix": torPrefix,
		"NodeASN": api.DefaultASNumber, "Nodes": nodes,
	})
	if err != nil {
		t.Fatal(err)
	}
	return sb.String()
}

// reconfigure replaces BIRD's configuration with text (birdc configure):
// BIRD restarts the sessions whose configuration changed.
func (b *bird) reconfigure(ctx context.Context, text string) error {
	if err := os.WriteFile(b.conf, []byte(text), 0o644); err != nil {
		return err
	}
	out, err := b.c(ctx, "configure")
	if err != nil {
		return err
	}
	if !strings.Contains(out, "Reconfigured") && !strings.Contains(out, "Reconfiguration in progress") {
		return fmt.Errorf("birdc configure: %s", out)
	}
	return nil
}

// runBIRD runs BIRD with the configuration text in the lab's ToR namespace
// until the test ends, and returns once its control socket answers.
func runBIRD(t testing.TB, l *lab.Lab, text string) *bird {
	t.Helper()
	dir := t.TempDir()
	b := &bird{ctl: filepath.Join(dir, "bird.ctl"), log: filepath.Join(dir, "bird.log"), conf: filepath.Join(dir, "bird.conf")}
	conf := b.conf
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(b.log)
	if err != nil {
		t.Fatal(err)
	}
	tor := netnsPath(t, l, "tor")
	// nsenter with only --net execs bird in place: the pid is BIRD's.
	cmd := exec.Command("nsenter", "--net="+tor, "--", "bird", "-f", "-c", conf, "-s", b.ctl)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		t.Fatalf("starting bird: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		// Only the process this test started.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logf.Close()
		if t.Failed() {
			if out, err := os.ReadFile(b.log); err == nil {
				t.Logf("bird log:\n%s", out)
			}
		}
	})
	// BIRD is up once its control socket answers.
	testkit.EventuallyEvery(t, 20*time.Second, 100*time.Millisecond, "bird to answer on its control socket", func() error {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("bird exited (%v); config:\n%s", err, text)
		default:
		}
		_, err := b.c(context.Background(), "show", "status")
		return err
	})
	return b
}

// c runs birdc against this BIRD.
func (b *bird) c(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "birdc", append([]string{"-s", b.ctl}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("birdc %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// TestPrivilegedBIRDInterop runs BIRD 2 as an eBGP top-of-rack router (AS
// 65001) in the lab's ToR namespace, peers every node with it through a
// global BGPPeer, and checks both directions: BIRD learns each node's pod
// blocks with the owning node as next hop (and the ToR can reach the pods),
// and the nodes install the ToR's prefix with the agent's BGP protocol
// number, and remove it when BIRD withdraws it.
func TestPrivilegedBIRDInterop(t *testing.T) {
	testkit.RequirePrivileged(t, "ip", "nsenter", "ping")
	for _, bin := range []string{"bird", "birdc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("BIRD interop test skipped: %s not installed (Debian package bird2)", bin)
		}
	}
	l := upLab(t, lab.Options{Name: "e2ebird", Nodes: 2, PodsPerNode: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b := startBIRD(t, l)

	// An external peer sends nothing in by default (docs/bgp.md): a filter
	// lets the ToR's prefix in, as an operator would.
	if _, err := l.Store().Create(ctx, &api.BGPFilter{
		Metadata: api.ObjectMeta{Name: "tor-in"},
		Spec: api.BGPFilterSpec{ImportV4: []api.BGPFilterRule{
			{CIDR: "198.19.77.0/24", MatchOperator: api.MatchOperatorEqual, Action: api.FilterActionAccept},
		}},
	}); err != nil {
		t.Fatalf("creating the ToR's import filter: %v", err)
	}
	if _, err := l.Store().Create(ctx, &api.BGPPeer{
		Metadata: api.ObjectMeta{Name: "tor"},
		Spec:     api.BGPPeerSpec{PeerIP: torAddr, ASNumber: torASN, Filters: []string{"tor-in"}},
	}); err != nil {
		t.Fatalf("creating the ToR BGPPeer: %v", err)
	}
	nodes := l.State().Nodes

	t.Run("SessionsEstablished", func(t *testing.T) {
		waitToRSessions(ctx, t, l, nodes, 30*time.Second, "type global, Established", func(p api.PeerStatus) bool {
			return p.Type == "global" && p.State == "Established"
		})
		testkit.EventuallyEvery(t, 10*time.Second, 100*time.Millisecond, "BIRD's sessions", func() error {
			out, err := b.c(ctx, "show", "protocols")
			if err != nil {
				return err
			}
			var errs []error
			for _, n := range nodes {
				if st := birdProtocolState(out, n.Name); st != "Established" {
					errs = append(errs, fmt.Errorf("BIRD protocol %s is %q, want Established:\n%s", n.Name, st, out))
				}
			}
			return errors.Join(errs...)
		})
	})

	t.Run("BIRDLearnsPodBlocks", func(t *testing.T) {
		owner := map[string]string{} // block → owning node's address
		for _, n := range nodes {
			s, err := l.NodeStatus(ctx, n.Name)
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Blocks) == 0 {
				t.Fatalf("%s reports no blocks, but has a pod", n.Name)
			}
			for _, blk := range s.Blocks {
				owner[blk] = n.IP.Addr().String()
			}
		}
		var table string
		testkit.EventuallyEvery(t, 15*time.Second, 100*time.Millisecond, "BIRD to learn every pod block from its owner", func() error {
			out, err := b.c(ctx, "show", "route")
			if err != nil {
				return err
			}
			table = out
			routes := parseBIRDRoutes(out)
			var errs []error
			for blk, via := range owner {
				paths := routes[blk]
				best := slices.IndexFunc(paths, func(p birdPath) bool { return p.best })
				switch {
				case best < 0:
					errs = append(errs, fmt.Errorf("BIRD has no route to %s", blk))
				case paths[best].via != via:
					errs = append(errs, fmt.Errorf("BIRD's best route to %s is via %s (from %s), want via the owning node %s", blk, paths[best].via, paths[best].proto, via))
				}
				// Every node announces every block (the mesh-learned ones
				// too), but always with the owner as next hop (RFC 4271
				// third-party next hop on the shared subnet): a node must
				// not put itself in the path of another node's pods.
				if len(paths) != len(nodes) {
					errs = append(errs, fmt.Errorf("BIRD has %d paths to %s, want one from each of the %d nodes", len(paths), blk, len(nodes)))
				}
				for _, p := range paths {
					if p.via != via {
						errs = append(errs, fmt.Errorf("BIRD learned %s from %s via %s, want via its owner %s", blk, p.proto, p.via, via))
					}
				}
			}
			if err := errors.Join(errs...); err != nil {
				return fmt.Errorf("%w\nbirdc show route:\n%s", err, out)
			}
			return nil
		})
		t.Logf("birdc show route:\n%s", table)
		// BIRD put them into the ToR's kernel, and the ToR reaches every pod.
		for _, p := range l.State().Pods {
			ip := p.IPs[0].Addr().String()
			testkit.EventuallyEvery(t, 10*time.Second, 100*time.Millisecond, "the ToR to reach pod "+p.Name, func() error {
				out, err := l.Exec(ctx, "tor", "ping", "-c1", "-W1", "-n", ip)
				if err != nil {
					return fmt.Errorf("%w: %s", err, out)
				}
				return nil
			})
		}
		// Still a dead end: nothing leads out of the lab.
		out, err := l.Exec(ctx, "tor", "ip", "-4", "route", "show", "default")
		if err != nil {
			t.Fatal(err)
		}
		if s := strings.TrimSpace(string(out)); s != "" {
			t.Errorf("the ToR has a default route: %s", s)
		}
	})

	t.Run("NodesInstallToRPrefix", func(t *testing.T) {
		testkit.EventuallyEvery(t, 15*time.Second, 100*time.Millisecond, "every node to install "+torPrefix, func() error {
			return nodesHaveRoute(ctx, l, nodes, true)
		})
		// BIRD withdraws it; it leaves every kernel, and comes back.
		if out, err := b.c(ctx, "disable", "tor_static"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		testkit.EventuallyEvery(t, 15*time.Second, 100*time.Millisecond, "every node to remove "+torPrefix, func() error {
			return nodesHaveRoute(ctx, l, nodes, false)
		})
		if out, err := b.c(ctx, "enable", "tor_static"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		testkit.EventuallyEvery(t, 15*time.Second, 100*time.Millisecond, "every node to install "+torPrefix+" again", func() error {
			return nodesHaveRoute(ctx, l, nodes, true)
		})
	})
}

// nodesHaveRoute checks that each node's kernel has (or, with want false,
// has not) the ToR's prefix as a BGP route (proto 81) via the ToR.
func nodesHaveRoute(ctx context.Context, l *lab.Lab, nodes []lab.NodeState, want bool) error {
	var errs []error
	for _, n := range nodes {
		out, err := l.Exec(ctx, n.Name, "ip", "-4", "route", "show", "proto", "81")
		if err != nil {
			return err
		}
		has, other := false, ""
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || f[0] != torPrefix {
				continue
			}
			if len(f) >= 3 && f[1] == "via" && f[2] == torAddr {
				has = true
			} else {
				other = line
			}
		}
		switch {
		case other != "":
			errs = append(errs, fmt.Errorf("%s: unexpected route %q", n.Name, other))
		case want && !has:
			errs = append(errs, fmt.Errorf("%s has no route %s via %s proto 81:\n%s", n.Name, torPrefix, torAddr, out))
		case !want && has:
			errs = append(errs, fmt.Errorf("%s still has %s via %s", n.Name, torPrefix, torAddr))
		}
	}
	return errors.Join(errs...)
}

// birdProtocolState returns the Info column of a protocol in `birdc show
// protocols` ("Established" for an up BGP session), or "" when it is
// missing.
func birdProtocolState(out, name string) string {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		// name  proto  table  state  since (one or two fields)  info
		if len(f) < 6 || f[0] != name {
			continue
		}
		i := 5
		if strings.Contains(f[i], ":") { // the time of a "date time" since
			i++
		}
		if i < len(f) {
			return f[i]
		}
		return ""
	}
	return ""
}

// birdPath is one route of `birdc show route`.
type birdPath struct {
	proto string // the protocol that supplied it
	best  bool
	via   string
}

// parseBIRDRoutes reads `birdc show route` (BIRD 2): a line per route
// ("<prefix> unicast [<proto> <since>] * (100) [AS64512i]", the prefix
// omitted for further routes to the same prefix, "*" marking the best)
// followed by its next hop ("\tvia <addr> on <dev>").
func parseBIRDRoutes(out string) map[string][]birdPath {
	routes := map[string][]birdPath{}
	prefix := ""
	var cur *birdPath
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch {
		case f[0] == "via" && cur != nil && len(f) >= 2:
			cur.via = f[1]
		case strings.Contains(line, "["):
			i := 0
			if !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "\t") {
				prefix, i = f[0], 1
			}
			if i >= len(f) {
				continue
			}
			p := birdPath{}
			for j := i; j < len(f); j++ {
				switch {
				case strings.HasPrefix(f[j], "[") && p.proto == "":
					p.proto = strings.TrimPrefix(f[j], "[")
				case f[j] == "*":
					p.best = true
				}
			}
			routes[prefix] = append(routes[prefix], p)
			cur = &routes[prefix][len(routes[prefix])-1]
		}
	}
	return routes
}

func TestParseBIRDOutput(t *testing.T) {
	routes := "BIRD 2.0.12 ready.\nTable master4:\n" +
		"10.244.197.0/26      unicast [node1 16:47:06.130] * (100) [AS64512i]\n" +
		"\tvia 198.18.0.11 on eth0\n" +
		"                     unicast [node2 16:47:05.853 from 198.18.0.12] (100) [AS64512i]\n" +
		"\tvia 198.18.0.11 on eth0\n" +
		"198.19.77.0/24       blackhole [tor_static 16:47:04.105] * (200)\n"
	want := map[string][]birdPath{
		"10.244.197.0/26": {{proto: "node1", best: true, via: "198.18.0.11"}, {proto: "node2", via: "198.18.0.11"}},
		"198.19.77.0/24":  {{proto: "tor_static", best: true}},
	}
	if diff := cmp.Diff(want, parseBIRDRoutes(routes), cmp.AllowUnexported(birdPath{})); diff != "" {
		t.Errorf("parseBIRDRoutes (-want +got):\n%s", diff)
	}
	protocols := "BIRD 2.0.12 ready.\n" +
		"Name       Proto      Table      State  Since         Info\n" +
		"device1    Device     ---        up     16:47:04.105  \n" +
		"node1      BGP        ---        up     16:47:06.130  Established   \n" +
		"node2      BGP        ---        start  16:47:04.105  Connect       Socket: Connection refused\n" +
		"node3      BGP        ---        up     2026-12-02 16:47:06  Established\n"
	for name, want := range map[string]string{"node1": "Established", "node2": "Connect", "node3": "Established", "node4": ""} {
		if got := birdProtocolState(protocols, name); got != want {
			t.Errorf("birdProtocolState(%s) = %q, want %q", name, got, want)
		}
	}
}

// waitToRSessions waits until every node's session to the ToR satisfies
// ok (described by want), or fails the test after timeout.
func waitToRSessions(ctx context.Context, t testing.TB, l *lab.Lab, nodes []lab.NodeState, timeout time.Duration, want string, ok func(api.PeerStatus) bool) {
	t.Helper()
	testkit.EventuallyEvery(t, timeout, 100*time.Millisecond, "every node's ToR session "+want, func() error {
		var errs []error
		for _, n := range nodes {
			s, err := l.NodeStatus(ctx, n.Name)
			if err != nil {
				return err
			}
			i := slices.IndexFunc(s.Peers, func(p api.PeerStatus) bool { return p.Address == torAddr })
			switch {
			case i < 0:
				errs = append(errs, fmt.Errorf("%s has no session to %s: %+v", n.Name, torAddr, s.Peers))
			case !ok(s.Peers[i]):
				errs = append(errs, fmt.Errorf("%s: ToR session is %+v, want %s", n.Name, s.Peers[i], want))
			}
		}
		return errors.Join(errs...)
	})
}
