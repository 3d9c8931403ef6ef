package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// The ToR's IPv6 side in TestPrivilegedBIRDIPv6: its fabric address in a
// dual-stack lab, a prefix inside the lab's IPv6 pool (fd00:10:244::/48),
// which the nodes refuse from an external peer even though a filter rule
// accepts it (docs/bgp.md, the import table), a foreign prefix a filter
// rule lets in, and one no rule matches.
const (
	torAddr6        = "2001:db8::1"
	torPoolPrefix6  = "fd00:10:244:ff00::/64"
	torForeignPref6 = "2001:db8:78::/48"
	torAllowed6     = "2001:db8:77::/48"
)

// birdIPv6Conf: BIRD as the ToR of a dual-stack lab, one session per node
// over IPv4 carrying both families (an ipv6 channel beside the ipv4 one, as
// the nodes' MP-BGP does). Everything learned goes into the ToR's kernel of
// its family; the ToR sends the nodes only its IPv6 static routes: a
// default route, a prefix in the pod pool and two foreign prefixes. The IPv6
// next hop BIRD puts on them is its own global IPv6 address on the
// interface towards the node (BIRD's default for an IPv6 channel on an
// IPv4 session), not set here.
const birdIPv6Conf = `# written by TestPrivilegedBIRDIPv6
log stderr all;
router id 198.18.0.1;
protocol device { scan time 10; }
protocol kernel {
	ipv4 { import none; export where source = RTS_BGP; };
	merge paths on;
}
protocol kernel {
	ipv6 { import none; export where source = RTS_BGP; };
	merge paths on;
}
protocol static tor_static6 {
	ipv6;
	route ::/0 blackhole;
	route ` + torPoolPrefix6 + ` blackhole;
	route ` + torForeignPref6 + ` blackhole;
	route ` + torAllowed6 + ` blackhole;
}
template bgp tabby_node {
	local 198.18.0.1 as 65001;
	hold time 9;
	keepalive time 3;
	connect retry time 2;
	error wait time 1, 10;
	graceful restart on;
	ipv4 { import all; export none; };
	ipv6 { import all; export where source = RTS_STATIC; };
}
`

// TestPrivilegedBIRDIPv6 runs BIRD 2 as the eBGP ToR of a dual-stack lab,
// the sessions over IPv4 carrying IPv6 too (MP-BGP), and checks: both sides
// negotiate both families; BIRD learns every node's IPv6 blocks with the
// owning node's IPv6 address as next hop (from every node: third-party
// next hop on the shared IPv6 subnet) and its IPv4 blocks as before; the
// ToR reaches every pod over IPv6 through the routes BIRD put into its
// kernel; of the ToR's four IPv6 routes the nodes install the default
// route (the peer has acceptDefault, but not over the node's own default
// route) and the foreign prefix the BGPFilter's importV6 accepts, via the
// ToR's IPv6 address, and refuse the prefix inside the IPv6 pool (which
// the filter accepts too) and the foreign prefix no rule matches; a
// withdrawal leaves every node's kernel.
func TestPrivilegedBIRDIPv6(t *testing.T) {
	requireBIRD(t)
	l := upLab(t, lab.Options{Name: "b6bird", Nodes: 2, PodsPerNode: 1, DualStack: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nodes := l.State().Nodes
	conf := birdIPv6Conf
	for _, n := range nodes {
		if !n.IP6.IsValid() {
			t.Fatalf("%s has no IPv6 fabric address in a dual-stack lab", n.Name)
		}
		conf += fmt.Sprintf("protocol bgp %s from tabby_node { neighbor %s as %d; }\n", n.Name, n.IP.Addr(), api.DefaultASNumber)
	}
	b := runBIRD(t, l, conf)

	filter := &api.BGPFilter{Metadata: api.ObjectMeta{Name: "tor-in6"}, Spec: api.BGPFilterSpec{ImportV6: []api.BGPFilterRule{
		{CIDR: torAllowed6, MatchOperator: api.MatchOperatorEqual, Action: api.FilterActionAccept},
		{CIDR: torPoolPrefix6, MatchOperator: api.MatchOperatorEqual, Action: api.FilterActionAccept},
	}}}
	peer := &api.BGPPeer{Metadata: api.ObjectMeta{Name: "tor"},
		Spec: api.BGPPeerSpec{PeerIP: torAddr, ASNumber: torASN, AcceptDefault: true, Filters: []string{"tor-in6"}}}
	for _, obj := range []api.Object{filter, peer} {
		obj.SetDefaults()
		if err := obj.Validate(); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Store().Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("SessionsCarryBothFamilies", func(t *testing.T) {
		waitToRSessions(ctx, t, l, nodes, 40*time.Second, "Established with ipv4,ipv6", func(p api.PeerStatus) bool {
			return p.State == "Established" && strings.Join(p.Families, ",") == "ipv4,ipv6"
		})
		testkit.EventuallyEvery(t, 10*time.Second, 100*time.Millisecond, "BIRD's sessions with both channels up", func() error {
			var errs []error
			for _, n := range nodes {
				out, err := b.c(ctx, "show", "protocols", "all", n.Name)
				if err != nil {
					return err
				}
				// One "Channel ipv4" and one "Channel ipv6" block, each
				// "State: UP" once the capability was negotiated.
				if birdProtocolState(out, n.Name) != "Established" || strings.Count(out, "State:          UP") != 2 ||
					!strings.Contains(out, "Channel ipv6") {
					errs = append(errs, fmt.Errorf("BIRD protocol %s:\n%s", n.Name, out))
				}
			}
			return errors.Join(errs...)
		})
	})

	t.Run("BIRDLearnsIPv6Blocks", func(t *testing.T) {
		owner := map[string]string{} // block → owning node's address of the block's family
		for _, n := range nodes {
			s, err := l.NodeStatus(ctx, n.Name)
			if err != nil {
				t.Fatal(err)
			}
			var v6 int
			for _, blk := range s.Blocks {
				p, err := netip.ParsePrefix(blk)
				if err != nil {
					t.Fatalf("%s: block %q: %v", n.Name, blk, err)
				}
				if p.Addr().Is6() {
					owner[blk] = n.IP6.Addr().String()
					v6++
				} else {
					owner[blk] = n.IP.Addr().String()
				}
			}
			if v6 == 0 {
				t.Fatalf("%s reports no IPv6 block (%v), but has a dual-stack pod", n.Name, s.Blocks)
			}
		}
		var table string
		testkit.EventuallyEvery(t, 20*time.Second, 100*time.Millisecond, "BIRD to learn every block from every node via its owner", func() error {
			out, err := b.c(ctx, "show", "route")
			if err != nil {
				return err
			}
			table = out
			routes := parseBIRDRoutes(out)
			var errs []error
			for blk, via := range owner {
				paths := routes[blk]
				if len(paths) != len(nodes) {
					errs = append(errs, fmt.Errorf("BIRD has %d paths to %s, want one from each of the %d nodes", len(paths), blk, len(nodes)))
				}
				if !slices.ContainsFunc(paths, func(p birdPath) bool { return p.best }) {
					errs = append(errs, fmt.Errorf("BIRD has no best route to %s", blk))
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
		// BIRD put them into the ToR's kernel: the ToR reaches every pod
		// over IPv6.
		pods := l.State().Pods
		if len(pods) != len(nodes) {
			t.Fatalf("%d pods, want one per node", len(pods))
		}
		for _, p := range pods {
			i := slices.IndexFunc(p.IPs, func(ip netip.Prefix) bool { return ip.Addr().Is6() })
			if i < 0 {
				t.Fatalf("pod %s has no IPv6 address: %v", p.Name, p.IPs)
			}
			for _, ip := range p.IPs[i : i+1] {
				testkit.EventuallyEvery(t, 15*time.Second, 100*time.Millisecond, "the ToR to reach pod "+p.Name+" at "+ip.Addr().String(), func() error {
					out, err := l.Exec(ctx, "tor", "ping", "-c1", "-W1", "-n", ip.Addr().String())
					if err != nil {
						return fmt.Errorf("%w: %s", err, out)
					}
					return nil
				})
			}
		}
	})

	t.Run("NodesImportOnlyTheDefault", func(t *testing.T) {
		// The lab gives every node a static IPv6 default route via the
		// ToR (no protocol: boot). The agent accepts the ToR's ::/0
		// (acceptDefault) but its route table keeps it off the node's own
		// route (issue 24: node routes are guarded in both families) and
		// logs it; it installs it once the node's route is gone.
		testkit.EventuallyEvery(t, 20*time.Second, 100*time.Millisecond, "every node's agent to refuse to overwrite its own IPv6 default route", func() error {
			var errs []error
			for _, n := range nodes {
				b, err := os.ReadFile(n.Agent.Log)
				if err != nil {
					return err
				}
				if !slices.ContainsFunc(strings.Split(string(b), "\n"), func(line string) bool {
					return strings.Contains(line, "learned route not installed: it would override this node's own") && strings.Contains(line, "prefix=::/0")
				}) {
					errs = append(errs, fmt.Errorf("%s's agent has not met the lab's IPv6 default route yet", n.Name))
				}
			}
			return errors.Join(errs...)
		})
		for _, n := range nodes {
			out, err := l.Exec(ctx, n.Name, "ip", "-6", "route", "show", "default")
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(string(out)); got != "default via "+torAddr6+" dev eth0 metric 1024 pref medium" {
				t.Errorf("%s: the node's own IPv6 default route changed: %q", n.Name, got)
			}
			// The lab's route goes; the agent, re-reading the node's
			// routes while one keeps a learned route off, installs it.
			if out, err := l.Exec(ctx, n.Name, "ip", "-6", "route", "del", "default", "via", torAddr6, "proto", "boot"); err != nil {
				t.Fatalf("%s: deleting the lab's IPv6 default route: %v: %s", n.Name, err, out)
			}
		}
		// The barrier: every node counts the ToR's four IPv6 prefixes
		// as received (before the import policy) and installed ::/0 and
		// the filter's prefix, so the same RIB reads saw the two others
		// and left them out.
		testkit.EventuallyEvery(t, 20*time.Second, 100*time.Millisecond, "every node to install ::/0 and "+torAllowed6+" via "+torAddr6, func() error {
			var errs []error
			for _, n := range nodes {
				s, err := l.NodeStatus(ctx, n.Name)
				if err != nil {
					return err
				}
				i := slices.IndexFunc(s.Peers, func(p api.PeerStatus) bool { return p.Address == torAddr })
				if i < 0 || s.Peers[i].Received != 4 {
					errs = append(errs, fmt.Errorf("%s: ToR session %+v, want 4 prefixes received", n.Name, s.Peers))
				}
				if err := nodeDefault6(ctx, l, n, true); err != nil {
					errs = append(errs, err)
				}
				if err := nodeRoute6(ctx, l, n, torAllowed6, true); err != nil {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		})
		for _, n := range nodes {
			out, err := l.Exec(ctx, n.Name, "ip", "-6", "route", "show", "table", "all")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: ip -6 route show table all:\n%s", n.Name, out)
			for _, pfx := range []string{torPoolPrefix6, torForeignPref6} {
				for _, line := range strings.Split(string(out), "\n") {
					if f := strings.Fields(line); len(f) > 0 && f[0] == pfx {
						t.Errorf("%s installed %s from an external peer: %q", n.Name, pfx, line)
					}
				}
			}
		}
		// BIRD withdraws the default route; it leaves every kernel.
		if out, err := b.c(ctx, "disable", "tor_static6"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		testkit.EventuallyEvery(t, 15*time.Second, 100*time.Millisecond, "every node to remove ::/0 and "+torAllowed6, func() error {
			var errs []error
			for _, n := range nodes {
				if err := nodeDefault6(ctx, l, n, false); err != nil {
					errs = append(errs, err)
				}
				if err := nodeRoute6(ctx, l, n, torAllowed6, false); err != nil {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		})
	})
}

// nodeDefault6 checks that the node's kernel has (want) or has not an IPv6
// default route of protocol 81 via the ToR's IPv6 address, and no other
// IPv6 default route in any case.
func nodeDefault6(ctx context.Context, l *lab.Lab, n lab.NodeState, want bool) error {
	out, err := l.Exec(ctx, n.Name, "ip", "-6", "route", "show", "default")
	if err != nil {
		return err
	}
	has := false
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if i := slices.Index(f, "proto"); len(f) >= 3 && f[1] == "via" && f[2] == torAddr6 && i > 0 && i+1 < len(f) && f[i+1] == "81" {
			has = true
			continue
		}
		return fmt.Errorf("%s: unexpected IPv6 default route %q", n.Name, line)
	}
	if has != want {
		return fmt.Errorf("%s: IPv6 default route via %s proto 81: have %v, want %v:\n%s", n.Name, torAddr6, has, want, out)
	}
	return nil
}

// nodeRoute6 checks that the node's kernel has (want) or has not the IPv6
// route dst of protocol 81 via the ToR's IPv6 address.
func nodeRoute6(ctx context.Context, l *lab.Lab, n lab.NodeState, dst string, want bool) error {
	out, err := l.Exec(ctx, n.Name, "ip", "-6", "route", "show", "proto", "81", "exact", dst)
	if err != nil {
		return err
	}
	got := strings.TrimSpace(string(out))
	wantLine := dst + " via " + torAddr6 + " dev eth0 metric 1024 pref medium"
	switch {
	case want && got != wantLine:
		return fmt.Errorf("%s: route to %s is %q, want %q", n.Name, dst, got, wantLine)
	case !want && got != "":
		return fmt.Errorf("%s still has %q", n.Name, got)
	}
	return nil
}
