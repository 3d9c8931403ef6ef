package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/ctl"
	"github.com/tabbynet/tabby/lab"
)

// checkExplainLive runs `explain packet --live` on a few allowed and denied
// cases of policySteps (across nodes and on one node, TCP and UDP, ingress
// and egress deciders) and requires the kernel to agree: the probe's
// outcome fits the verdict and the deciding rule's counter moved on every
// node asked (both backends count per rule).
func checkExplainLive(ctx context.Context, t *testing.T, l *lab.Lab, c *ctl.Client, agents ctl.AgentTemplate, ips map[string]netip.Addr) {
	steps := policySteps(ips)
	for _, run := range []struct {
		step  int
		cases []policyCase
	}{
		{2, []policyCase{
			{"acli", "aweb", "tcp", 80, true},    // across nodes, ingress allow
			{"bcli", "aweb", "tcp", 8080, true},  // one node
			{"bcli", "aweb", "tcp", 80, false},   // one node, default deny
			{"ccli", "aweb", "tcp", 8080, false}, // across nodes, default deny at ingress
		}},
		{3, []policyCase{
			{"bcli", "bweb", "udp", 53, true},    // egress allow, UDP
			{"bcli", "bweb", "tcp", 9100, false}, // egress default deny at the source
		}},
	} {
		setPolicies(ctx, t, l, steps[run.step].objs)
		waitPolicyConverged(ctx, t, l)
		for _, pc := range run.cases {
			name := fmt.Sprintf("%s -> %s %s/%d", pc.src, pc.dst, pc.proto, pc.port)
			xs, err := c.ExplainPacket(ctx, ctl.PacketOptions{From: policyPodRef(pc.src), To: policyPodRef(pc.dst),
				Port: fmt.Sprintf("%d/%s", pc.port, pc.proto), Family: 4, Agents: agents, Live: true})
			if err != nil || len(xs) != 1 || xs[0].Live == nil {
				t.Errorf("%s: explain packet --live: %v (%d answers)", name, err, len(xs))
				continue
			}
			x := xs[0]
			lc := x.Live
			if x.Allowed != pc.allowed || !lc.OutcomeAgrees || !lc.Agrees {
				t.Errorf("%s: what-if allowed=%v (table %v), probe %s, kernel agrees=%v: %+v", name, x.Allowed, pc.allowed, lc.Probe.Outcome, lc.Agrees, lc.Sides)
			}
			counted := 0
			for _, s := range lc.Sides {
				switch {
				case s.Moved:
					counted++
				case s.Origin != nil:
					t.Errorf("%s: %s's deciding rule %v did not count the probe: %s", name, s.Node, s.Origin, s.Note)
				}
			}
			if counted == 0 {
				t.Errorf("%s: no deciding rule's counter checked: %+v", name, lc.Sides)
			}
			t.Logf("%s: %s, probe %s in %s, %d counter(s) moved", name, map[bool]string{true: "allowed", false: "denied"}[x.Allowed], lc.Probe.Outcome, lc.Probe.Took, counted)
		}
	}
	// The CLI prints the probe and the verdict of the kernel.
	out, err := tabbyctl(t, l, "explain", "packet", "--live", "--from", "pod/beta/bcli", "--to", "pod/beta/bweb", "--port", "9100/tcp",
		"--agent", "unix://"+filepath.Join(l.Dir(), "{node}", "status.sock"))
	if err != nil {
		t.Fatalf("explain packet --live: %v\n%s", err, out)
	}
	for _, want := range []string{"Live probe from node1", "tcp " + ips["bcli"].String(), "timeout", "Kernel: AGREES", "Verdict: DENIED at node1"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain packet --live lacks %q:\n%s", want, out)
		}
	}
	// Never outside the cluster.
	out, err = tabbyctl(t, l, "explain", "packet", "--live", "--from", "pod/beta/bcli", "--to", "192.0.2.1", "--port", "80/tcp",
		"--agent", "unix://"+filepath.Join(l.Dir(), "{node}", "status.sock"))
	if err == nil || !strings.Contains(out, "outside the cluster") {
		t.Errorf("explain packet --live to 192.0.2.1: %v, want a refusal naming the cluster:\n%s", err, out)
	}
}
