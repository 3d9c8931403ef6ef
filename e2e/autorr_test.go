package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/lab"
)

// Automatic route reflectors (issue 30 part 5, docs/bgp.md "Reflectors that
// place themselves"). TABBY_AUTORR_NODES sets the lab's size (default 8;
// `make e2e-autorr` runs 30).
const (
	autorrPerZone = 2
	autorrZones   = 2
	autorrGrace   = 10 * time.Second
	// autorrLeaseTTL is the agents' liveness lease (agent.Config.LeaseTTL).
	autorrLeaseTTL = 20 * time.Second
)

// TestAutoReflectors: N nodes in two zones, mesh off, routeReflectorMode
// Auto with 2 reflectors per zone and none chosen at first. The choice
// converges and every node peers by it (lab.WaitEstablished checks each
// node's sessions against the choice); the full pod matrix pings; nodes
// join and leave, and a reflector's agent restarts within the grace,
// without changing the choice; a reflector's agent is SIGKILLed and replaced within lease TTL + grace + a few seconds while
// pods on two other nodes ping each other without loss; over the run the
// record is written only to add reflectors at first and once for the
// replacement.
func TestAutoReflectors(t *testing.T) {
	n := 8
	if s := os.Getenv("TABBY_AUTORR_NODES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 6 {
			t.Fatalf("TABBY_AUTORR_NODES=%q: want a number of nodes, at least 6", s)
		}
		n = v
	}
	start := time.Now()
	l := upLab(t, lab.Options{Name: "e2eautorr", Nodes: n, AutoReflectors: autorrPerZone, Zones: autorrZones,
		ReflectorGrace: autorrGrace, PodsPerNode: 1, ConvergeTimeout: 3 * time.Minute})
	t.Logf("FIGURE nodes=%d converged (agents started → reflectors elected, every session per the choice established) in %v; lab up with pods and routes in %v",
		n, l.ConvergedIn().Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	initial := checkChoice(t, ctx, l)
	checkNodeStatus(t, l, "")
	pingMatrix(t, l)
	if t.Failed() {
		return
	}

	clients := clientNodes(l, initial)
	from, to, leaver := pickClients(t, clients)
	p := startSeqPinger(t, l, podOf(from), podOf(to))
	defer p.stop()
	// Joins: one node per zone.
	for i := 1; i <= autorrZones; i++ {
		name := lab.NodeName(n + i)
		if err := l.AddNode(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	waitEstablished(t, ctx, l)
	// A leave: a client that carries no test traffic.
	if err := l.RemoveNode(ctx, leaver); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, ctx, l)

	// A reflector's agent restarts (SIGTERM revokes its lease: liveness
	// gone at once) and is back within the grace: it keeps its role.
	restarted := initial.Zones[lab.ZoneName(1)][0].Node
	stopped := time.Now()
	if err := l.StopAgent(ctx, restarted, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Store().GetKV(ctx, datastore.NodeLivenessKey(restarted)); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("liveness of %s after a clean stop: %v, want it revoked", restarted, err)
	}
	if err := l.StartAgent(ctx, restarted); err != nil {
		t.Fatal(err)
	}
	back := waitLiveness(t, ctx, l, restarted).Sub(stopped)
	waitEstablished(t, ctx, l)
	t.Logf("FIGURE nodes=%d reflector %s restarted (SIGTERM, start): liveness back after %v (grace %v), every session after %v; it stays a reflector",
		n, restarted, back.Round(100*time.Millisecond), autorrGrace, time.Since(stopped).Round(100*time.Millisecond))
	if back >= autorrGrace {
		t.Fatalf("the restart of %s took %v, not within the grace %v: the check of its role cannot hold (machine overloaded?)", restarted, back, autorrGrace)
	}

	victim := initial.Zones[lab.ZoneName(0)][0].Node
	blocks := nodeBlocks(t, ctx, l)
	t.Logf("killing the agent of reflector %s (traffic %s -> %s)", victim, from, to)
	killed := time.Now()
	if err := l.StopAgent(ctx, victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone, replaced := waitReplaced(t, ctx, l, victim, killed, func() {
		checkStaleRoutes(t, ctx, l, victim, blocks, killed)
	})
	t.Logf("FIGURE nodes=%d reflector %s replaced %v after SIGKILL: liveness gone after %v (lease TTL %v), choice rewritten %v later (grace %v)",
		n, victim, replaced.Round(100*time.Millisecond), gone.Round(100*time.Millisecond), autorrLeaseTTL,
		(replaced - gone).Round(100*time.Millisecond), autorrGrace)
	// The dead node leaves; the others' sessions follow the new choice.
	if err := l.RemoveNode(ctx, victim); err != nil {
		t.Fatal(err)
	}
	if err := l.AddNode(ctx, lab.NodeName(n+autorrZones+1)); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, ctx, l)
	checkReportedReady(t, ctx, l, victim, killed)
	time.Sleep(2 * time.Second) // traffic after the new sessions, so that a late loss would show
	sent, lost := p.stop()
	t.Logf("FIGURE nodes=%d pings %s -> %s across the replacement: %d sent, %d lost", n, from, to, sent, len(lost))
	if len(lost) > 0 || sent == 0 {
		t.Errorf("ping %s -> %s lost %v of %d across the replacement", from, to, lost, sent)
	}
	checkChoice(t, ctx, l)
	checkNodeStatus(t, l, victim)
	checkHistory(t, ctx, l, initial, victim)
}

// checkReportedReady waits until the node elected in victim's place
// reported its sessions ready for that election in its liveness record
// (docs/bgp.md, "Promotion"): until then its zone's other reflector sends
// it every route.
func checkReportedReady(t *testing.T, ctx context.Context, l *lab.Lab, victim string, killed time.Time) {
	t.Helper()
	c, _, err := l.ReflectorChoice(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var promoted bgp.Reflector
	for _, r := range c.Zones[lab.ZoneName(0)] {
		if promoted.Since.IsZero() || r.Since.After(promoted.Since) {
			promoted = r
		}
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last string
	err = lab.Poll(wctx, 100*time.Millisecond, func() (bool, error) {
		kv, err := l.Store().GetKV(wctx, datastore.NodeLivenessKey(promoted.Node))
		if err != nil {
			return false, nil
		}
		last = string(kv.Value)
		var rec struct {
			ReflectorReady *time.Time `json:"reflectorReady"`
		}
		return json.Unmarshal(kv.Value, &rec) == nil && rec.ReflectorReady != nil && rec.ReflectorReady.Equal(promoted.Since), nil
	})
	if err != nil {
		t.Fatalf("%s, elected %v in %s's place, did not report its sessions ready: liveness %s", promoted.Node, promoted.Since, victim, last)
	}
	t.Logf("FIGURE %s (elected in %s's place) had reported its reflector sessions ready %v after the SIGKILL (read once every session was up)",
		promoted.Node, victim, time.Since(killed).Round(100*time.Millisecond))
}

func waitEstablished(t *testing.T, ctx context.Context, l *lab.Lab) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := l.WaitEstablished(wctx); err != nil {
		t.Fatal(err)
	}
}

// checkChoice checks that every zone has its reflectors and every agent
// reports the recorded choice and its own role (tabbyctl node status reads
// the same status).
func checkChoice(t *testing.T, ctx context.Context, l *lab.Lab) *bgp.ReflectorChoice {
	t.Helper()
	c, _, err := l.ReflectorChoice(ctx)
	if err != nil || c == nil {
		t.Fatalf("reflector choice: %v, %v", c, err)
	}
	for i := range autorrZones {
		if got := len(c.Zones[lab.ZoneName(i)]); got != autorrPerZone {
			t.Errorf("zone %s has %d reflectors, want %d: %+v", lab.ZoneName(i), got, autorrPerZone, c.Zones)
		}
	}
	want := choiceMembers(c)
	for _, nd := range l.State().Nodes {
		st, err := l.NodeStatus(ctx, nd.Name)
		if err != nil {
			t.Error(err)
			continue
		}
		r := st.Reflectors
		if r == nil {
			t.Errorf("%s reports no reflector status", nd.Name)
			continue
		}
		got := map[string]string{}
		for _, e := range r.Elected {
			got[e.Node] = e.Zone
		}
		role := "client"
		if _, ok := want[nd.Name]; ok {
			role = "reflector"
		}
		if !maps.Equal(got, want) || r.Role != role || r.Zone != nd.Zone {
			t.Errorf("%s reports %s in zone %q, elected %v; want %s in zone %q, elected %v", nd.Name, r.Role, r.Zone, got, role, nd.Zone, want)
		}
	}
	return c
}

// choiceMembers maps every elected node to its zone.
func choiceMembers(c *bgp.ReflectorChoice) map[string]string {
	m := map[string]string{}
	if c == nil {
		return m
	}
	for z, rs := range c.Zones {
		for _, r := range rs {
			m[r.Node] = z
		}
	}
	return m
}

// clientNodes are the lab's nodes with a pod that are not reflectors, by zone.
func clientNodes(l *lab.Lab, c *bgp.ReflectorChoice) map[string][]string {
	rr := choiceMembers(c)
	out := map[string][]string{}
	for _, nd := range l.State().Nodes {
		if _, ok := rr[nd.Name]; !ok {
			out[nd.Zone] = append(out[nd.Zone], nd.Name)
		}
	}
	return out
}

// pickClients picks a client in each of the first two zones to ping
// between and a third client to remove.
func pickClients(t *testing.T, clients map[string][]string) (from, to, leaver string) {
	t.Helper()
	a, b := clients[lab.ZoneName(0)], clients[lab.ZoneName(1)]
	if len(a) < 2 || len(b) < 1 {
		t.Fatalf("too few clients: %v", clients)
	}
	return a[0], b[0], a[1]
}

// podOf is the pod Up added to a node (nodeI has nIp1).
func podOf(node string) string { return "n" + strings.TrimPrefix(node, "node") + "p1" }

// waitLiveness waits until node's liveness record is there and returns when.
func waitLiveness(t *testing.T, ctx context.Context, l *lab.Lab, node string) time.Time {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := lab.Poll(wctx, 50*time.Millisecond, func() (bool, error) {
		_, err := l.Store().GetKV(wctx, datastore.NodeLivenessKey(node))
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("liveness of %s: %v", node, err)
	}
	return time.Now()
}

// waitReplaced waits until victim left the choice and its zone is full
// again, and returns how long after killed its liveness record was gone
// and it was replaced. It calls whenGone once, as soon as the liveness
// record is gone (the grace still to run before the replacement). The bound it allows is docs/bgp.md's: lease TTL +
// grace + a few seconds.
func waitReplaced(t *testing.T, ctx context.Context, l *lab.Lab, victim string, killed time.Time, whenGone func()) (gone, replaced time.Duration) {
	t.Helper()
	bound := autorrLeaseTTL + autorrGrace + 15*time.Second
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var last *bgp.ReflectorChoice
	err := lab.Poll(wctx, 100*time.Millisecond, func() (bool, error) {
		if gone == 0 {
			if _, err := l.Store().GetKV(wctx, datastore.NodeLivenessKey(victim)); errors.Is(err, datastore.ErrNotFound) {
				gone = time.Since(killed)
				whenGone()
			}
		}
		c, _, err := l.ReflectorChoice(wctx)
		if err != nil {
			return false, nil
		}
		last = c
		_, still := c.Find(victim)
		return !still && len(c.Zones[lab.ZoneName(0)]) == autorrPerZone, nil
	})
	if err != nil {
		t.Fatalf("%s not replaced within %v: %v; choice %+v", victim, bound, err, last)
	}
	return gone, time.Since(killed)
}

// nodeBlocks maps every node to the blocks its agent reports.
func nodeBlocks(t *testing.T, ctx context.Context, l *lab.Lab) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, nd := range l.State().Nodes {
		st, err := l.NodeStatus(ctx, nd.Name)
		if err != nil {
			t.Fatal(err)
		}
		out[nd.Name] = st.Blocks
	}
	return out
}

// checkStaleRoutes: with the killed reflector victim not yet replaced,
// read from the kernels, every client still routes to each block of the
// other zone's nodes (the victim's own blocks included) via the owner;
// the clients that peered with the victim have lost that session, so
// graceful restart keeps its routes stale meanwhile.
func checkStaleRoutes(t *testing.T, ctx context.Context, l *lab.Lab, victim string, blocks map[string][]string, killed time.Time) {
	t.Helper()
	c, _, err := l.ReflectorChoice(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rr := choiceMembers(c)
	zone, addr := map[string]string{}, map[string]string{}
	for _, nd := range l.State().Nodes {
		zone[nd.Name], addr[nd.Name] = nd.Zone, nd.IP.Addr().String()
	}
	clients, routes, lostSession := 0, 0, 0
	for _, nd := range l.State().Nodes {
		if _, ok := rr[nd.Name]; ok {
			continue
		}
		clients++
		have, err := l.LearnedRoutes(ctx, nd.Name)
		if err != nil {
			t.Fatal(err)
		}
		for o, bs := range blocks {
			for _, b := range bs {
				if zone[o] == nd.Zone {
					continue
				}
				routes++
				if !slices.Contains(have[b], addr[o]) {
					t.Errorf("%s lost its route to %s (%s's block, zone %q) %v after %s's agent was killed: %v",
						nd.Name, b, o, zone[o], time.Since(killed).Round(100*time.Millisecond), victim, have[b])
				}
			}
		}
		st, err := l.NodeStatus(ctx, nd.Name)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range st.Peers {
			if p.Address == addr[victim] && p.State != "Established" {
				lostSession++
			}
		}
	}
	after, _, err := l.ReflectorChoice(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, still := after.Find(victim); !still {
		t.Errorf("%s was replaced before the check of the clients' routes ended: the check proves nothing (machine overloaded?)", victim)
	}
	t.Logf("FIGURE %v after the kill, %s not yet replaced: %d clients hold all %d routes to the other zone's blocks (%d of them lost their session to %s: stale under graceful restart)",
		time.Since(killed).Round(100*time.Millisecond), victim, clients, routes, lostSession, victim)
	if lostSession == 0 {
		t.Errorf("no client reports its session to %s down: the routes were not held stale", victim)
	}
}

// checkHistory checks every write of the reflector record over the run:
// at first each write only adds reflectors up to the initial choice, then
// exactly one write replaces the victim by one node of its zone, and
// nothing else (joins and leaves of clients never rewrite it).
func checkHistory(t *testing.T, ctx context.Context, l *lab.Lab, initial *bgp.ReflectorChoice, victim string) {
	t.Helper()
	hist, err := l.ReflectorHistory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var desc []string
	for _, c := range hist {
		desc = append(desc, fmt.Sprint(slices.Sorted(maps.Keys(choiceMembers(c)))))
	}
	t.Logf("FIGURE writes of election/bgp-reflectors over the run: %d (%s)", len(hist), strings.Join(desc, " → "))
	k := slices.IndexFunc(hist, initial.Equal) + 1
	if k < 1 || k != len(hist)-1 || choiceMembers(hist[k])[victim] != "" {
		t.Fatalf("want the initial choice, then the replacement as the last write; history %v", desc)
	}
	for i := range k {
		prev := map[string]string{}
		if i > 0 {
			prev = choiceMembers(hist[i-1])
		}
		for node, z := range prev {
			if choiceMembers(hist[i])[node] != z {
				t.Errorf("write %d dropped or moved reflector %s before the kill: %v", i+1, node, desc)
			}
		}
	}
	if !hist[k-1].Equal(initial) {
		t.Errorf("the choice before the kill is %s, want the initial one", desc[k-1])
	}
	before, after := choiceMembers(hist[k-1]), choiceMembers(hist[k])
	var added []string
	for node, z := range after {
		if before[node] != z {
			added = append(added, node)
		}
	}
	delete(before, victim)
	for node, z := range before {
		if after[node] != z {
			t.Errorf("the replacement dropped %s too: %v", node, desc)
		}
	}
	if len(added) != 1 || after[added[0]] != choiceMembers(initial)[victim] {
		t.Errorf("the replacement added %v, want one node of %s's zone: %v", added, victim, desc)
	}
}

// checkNodeStatus checks `tabbyctl node status --all`: every node shows its
// role, the reflectors are the configured number, and after a replacement
// the agent that wrote it names the victim and why.
func checkNodeStatus(t *testing.T, l *lab.Lab, replaced string) {
	t.Helper()
	out, err := tabbyctl(t, l, "node", "status", "--all")
	if err != nil {
		t.Fatalf("node status --all: %v\n%s", err, out)
	}
	n := len(l.State().Nodes)
	roles := strings.Count(out, "Route reflectors (Auto, 2 per zone by topology.kubernetes.io/zone, grace 10s, zones peer as NonClient): this node is a ")
	rrs := strings.Count(out, "this node is a reflector in zone")
	if roles != n || rrs != autorrPerZone*autorrZones {
		t.Errorf("node status --all shows %d roles and %d reflectors, want %d and %d:\n%s", roles, rrs, n, autorrPerZone*autorrZones, out)
	}
	if want := "replaced: " + replaced + " (zone"; replaced != "" && !strings.Contains(out, want) {
		t.Errorf("node status --all lacks %q:\n%s", want, out)
	}
}

// TestAutoReflectorZones: six nodes in three zones, one elected reflector
// each, the default routeReflectorPeering (NonClient, docs/bgp.md). Read
// from the kernels, every client routes each block of every node of the
// other zones (their reflectors' own included) via its owner, and the pod
// matrix pings. Each reflector types its sessions to the other zones'
// reflectors rr (non-client) and received from each exactly the blocks of
// that reflector's zone: with Calico's rule (Client) it would also hear
// the third zone's blocks from it.
func TestAutoReflectorZones(t *testing.T) {
	l := upLab(t, lab.Options{Name: "e2eautorrz", Nodes: 6, AutoReflectors: 1, Zones: 3, PodsPerNode: 1, ConvergeTimeout: 3 * time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, _, err := l.ReflectorChoice(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rr := choiceMembers(c)
	if len(rr) != 3 {
		t.Fatalf("elected %v, want one reflector in each of 3 zones", rr)
	}
	blocks := nodeBlocks(t, ctx, l)
	zone, addr, zoneBlocks := map[string]string{}, map[string]string{}, map[string]int{}
	for _, nd := range l.State().Nodes {
		zone[nd.Name], addr[nd.Name] = nd.Zone, nd.IP.Addr().String()
		zoneBlocks[nd.Zone] += len(blocks[nd.Name])
	}
	byAddr := map[string]string{}
	for n, a := range addr {
		byAddr[a] = n
	}
	routes := 0
	for _, nd := range l.State().Nodes {
		if _, ok := rr[nd.Name]; ok {
			continue
		}
		have, err := l.LearnedRoutes(ctx, nd.Name)
		if err != nil {
			t.Fatal(err)
		}
		for o, bs := range blocks {
			if zone[o] == nd.Zone {
				continue
			}
			for _, b := range bs {
				routes++
				if !slices.Contains(have[b], addr[o]) {
					t.Errorf("%s (zone %s) has no route to %s (%s's block, zone %s) via %s: %v", nd.Name, nd.Zone, b, o, zone[o], addr[o], have[b])
				}
			}
		}
	}
	// The status counts each session's prefixes when asked unless its
	// last count is recent (countSoon), so a count taken just before
	// the blocks arrived can read 0: poll.
	var wrong []string
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	_ = lab.Poll(wctx, 500*time.Millisecond, func() (bool, error) {
		wrong = wrong[:0]
		for name := range rr {
			st, err := l.NodeStatus(wctx, name)
			if err != nil {
				return false, err
			}
			for _, p := range st.Peers {
				peer := byAddr[p.Address]
				if _, isRR := rr[peer]; !isRR {
					continue
				}
				if p.Type != "rr" || p.Received != uint32(zoneBlocks[zone[peer]]) {
					wrong = append(wrong, fmt.Sprintf("reflector %s (zone %s): session to reflector %s (zone %s) typed %s, received %d prefixes, want rr and the %d blocks of zone %s",
						name, zone[name], peer, zone[peer], p.Type, p.Received, zoneBlocks[zone[peer]], zone[peer]))
				}
			}
		}
		return len(wrong) == 0, nil
	})
	for _, w := range wrong {
		t.Error(w)
	}
	t.Logf("FIGURE 3 zones, NonClient: %d routes to other zones' blocks checked in the clients' kernels", routes)
	pingMatrix(t, l)
}
