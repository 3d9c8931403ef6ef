package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tabbynet/tabby/ctl"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/lab"
)

// TestExplainPacket runs TestPolicy's truth table (policySteps, 40 cases)
// on a dual-stack lab, once per firewall backend, through both `explain
// packet` (the agents' evaluation of the rules they applied) and the
// kernel (a real connection), in both families, and requires they agree
// on every case; in IPv4 both must also give the table's verdict. (The
// table's ipBlock is IPv4: in IPv6 its verdicts differ, the agreement
// does not.) Then tabbyctl explain packet prints a denied case with the
// node and the policy rule that decided.
func TestExplainPacket(t *testing.T) {
	for _, b := range []struct{ backend, lab string }{
		{dataplane.FirewallNFTables, "wixn"},
		{dataplane.FirewallIPTables, "wixi"},
	} {
		t.Run(b.backend, func(t *testing.T) {
			testExplainPacket(t, b.backend, b.lab)
		})
	}
}

func testExplainPacket(t *testing.T, backend, name string) {
	l := upLab(t, lab.Options{Name: name, Nodes: 3, DualStack: true, AgentArgs: []string{"--firewall-backend", backend}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ips := map[string]netip.Addr{}
	ips6 := map[string]netip.Addr{}
	for _, p := range policyPods {
		pod, err := l.AddPod(ctx, p.node, p.name, lab.PodOptions{Namespace: p.ns, Labels: map[string]string{"app": p.app}})
		if err != nil {
			t.Fatalf("adding pod %s: %v", p.name, err)
		}
		for _, a := range pod.IPs {
			if a.Addr().Is4() {
				ips[p.name] = a.Addr()
			} else {
				ips6[p.name] = a.Addr()
			}
		}
		if !ips6[p.name].IsValid() {
			t.Fatalf("pod %s has no IPv6 address: %v", p.name, pod.IPs)
		}
	}
	for _, p := range policyPods {
		if p.app != "client" {
			startPolicyServer(t, l, p.name, p.name, serverTCP, serverUDP)
		}
	}
	t.Cleanup(func() { deleteAllPolicies(t, l) })
	nameAWebPort(ctx, t, l)
	c := ctl.NewClient(l.Store(), nil)
	agents := ctl.AgentTemplate{Template: "unix://" + filepath.Join(l.Dir(), "{node}", "status.sock")}
	total := 0
	for _, step := range policySteps(ips) {
		ok := t.Run(step.name, func(t *testing.T) {
			setPolicies(ctx, t, l, step.objs)
			waitPolicyConverged(ctx, t, l)
			for _, fam := range []int{4, 6} {
				addrs := map[int]map[string]netip.Addr{4: ips, 6: ips6}[fam]
				compareWhatIf(ctx, t, l, c, agents, fam, addrs, step.cases)
			}
		})
		total += 2 * len(step.cases)
		if !ok {
			break
		}
	}
	t.Logf("%d cases (both families) agreed", total)

	// The CLI names the node and the policy rule that decided.
	setPolicies(ctx, t, l, policySteps(ips)[1].objs) // default-deny ingress in alpha
	waitPolicyConverged(ctx, t, l)
	out, err := tabbyctl(t, l, "explain", "packet", "--from", "pod/alpha/acli", "--to", "pod/alpha/aweb", "--port", "80/tcp",
		"--agent", "unix://"+filepath.Join(l.Dir(), "{node}", "status.sock"))
	if err != nil {
		t.Fatalf("explain packet: %v\n%s", err, out)
	}
	for _, want := range []string{"node2, egress: ACCEPT", "node1, ingress: DROP", "default Deny at the end of ingress", "Verdict: DENIED at node1"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain packet lacks %q:\n%s", want, out)
		}
	}
	t.Run("live", func(t *testing.T) {
		checkExplainLive(ctx, t, l, c, agents, ips) // both backends count per rule
	})
}

// compareWhatIf checks every case of one family: what-if and the kernel
// agree, and in IPv4 both give the table's verdict.
func compareWhatIf(ctx context.Context, t *testing.T, l *lab.Lab, c *ctl.Client, agents ctl.Agents, fam int,
	addrs map[string]netip.Addr, cases []policyCase) {
	t.Helper()
	var mu sync.Mutex
	var wrong []string
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, pc := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			report := func(format string, args ...any) {
				mu.Lock()
				defer mu.Unlock()
				wrong = append(wrong, fmt.Sprintf("IPv%d %s -> %s %s/%d: ", fam, pc.src, pc.dst, pc.proto, pc.port)+fmt.Sprintf(format, args...))
			}
			src, dst := policyPodRef(pc.src), policyPodRef(pc.dst)
			xs, err := c.ExplainPacket(ctx, ctl.PacketOptions{From: src, To: dst, Port: fmt.Sprintf("%d/%s", pc.port, pc.proto), Family: fam, Agents: agents})
			if err != nil || len(xs) != 1 {
				report("explain packet: %v (%d answers)", err, len(xs))
				return
			}
			whatif := xs[0].Allowed
			var kernel probeResult
			for range 2 { // a first packet lost to neighbour resolution
				kernel = probeFrom(ctx, t, l, pc.src, pc.proto, netip.AddrPortFrom(addrs[pc.dst], uint16(pc.port)))
				if kernel.err == nil && kernel.allowed == whatif {
					break
				}
			}
			switch {
			case kernel.err != nil:
				report("probe: %v", kernel.err)
			case kernel.allowed != whatif:
				report("what-if allowed=%v (denied at %q), kernel allowed=%v", whatif, xs[0].DeniedAt, kernel.allowed)
			case fam == 4 && whatif != pc.allowed:
				report("what-if and kernel allowed=%v, the table says %v", whatif, pc.allowed)
			}
		}()
	}
	wg.Wait()
	if len(wrong) > 0 {
		slices.Sort(wrong)
		t.Errorf("%d of %d IPv%d cases wrong:\n%s", len(wrong), len(cases), fam, strings.Join(wrong, "\n"))
	}
}

// policyPodRef is explain packet's name for a pod of policyPods.
func policyPodRef(name string) string {
	for _, p := range policyPods {
		if p.name == name {
			return "pod/" + p.ns + "/" + p.name
		}
	}
	return name
}
