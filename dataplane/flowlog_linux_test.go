package dataplane_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/policy"
)

// TestPrivilegedNFTablesRuleCountersAndNFLOG: rules with an Origin count
// what they match (read back in one dump, by origin) and log it to the
// NFLOG group, where ListenNFLOG reads the prefix naming the rule and the
// packet's five-tuple.
func TestPrivilegedNFTablesRuleCountersAndNFLOG(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	n := testkit.NewNetNS(t, "flw")
	fw, err := dataplane.NewNFTFirewall(dataplane.NFTConfig{NetNS: n.Path, FlowLog: flowLogAll})
	if err != nil {
		t.Fatal(err)
	}
	defer fw.Close()
	ruleCountersAndNFLOG(t, n, fw)
}

// TestPrivilegedIPTablesRuleCountersAndNFLOG is the same on the iptables
// backend, legacy and nft: counters read with one iptables-save -c per
// family, NFLOG rules before the deciding ones.
func TestPrivilegedIPTablesRuleCountersAndNFLOG(t *testing.T) {
	testkit.RequirePrivileged(t, "ip", "iptables", "ipset")
	for _, b := range []string{dataplane.BackendLegacy, dataplane.BackendNFT} {
		t.Run(b, func(t *testing.T) {
			n := testkit.NewNetNS(t, "flw")
			fw, err := dataplane.NewIPTablesFirewall(dataplane.FirewallConfig{NetNS: n.Path, Backend: b, Resync: -1, FlowLog: flowLogAll})
			if err != nil {
				t.Skipf("iptables backend %s: %v", b, err)
			}
			ruleCountersAndNFLOG(t, n, fw)
			if err := fw.Remove(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

const flowLogGroup = 1777

var flowLogAll = dataplane.FlowLogRules{Deny: true, Allow: true, Group: flowLogGroup}

func ruleCountersAndNFLOG(t *testing.T, n testkit.NetNS, fw interface {
	dataplane.Firewall
	RuleCounters(context.Context) ([]dataplane.RuleCounter, error)
}) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const group = flowLogGroup
	deny := &policy.Origin{Kind: policy.OriginGlobal, Name: "g", Direction: policy.DirIngress, Index: 0, Action: "Deny"}
	allow := &policy.Origin{Kind: policy.OriginGlobal, Name: "g", Direction: policy.DirIngress, Index: 1, Action: "Allow"}
	udp := func(port uint16) []policy.Match {
		return []policy.Match{{Kind: policy.MatchProto, Proto: "udp"}, {Kind: policy.MatchDstPorts, Ports: []policy.PortRange{{Lo: port, Hi: port}}}}
	}
	rs := policy.Ruleset{
		Chains: []policy.Chain{{Table: policy.TableFilter, Name: policy.ChainInput, Rules: []policy.Rule{
			{Match: udp(9), Verdict: policy.Verdict{Kind: policy.VerdictDrop}, Origin: deny},
			{Match: udp(10), Verdict: policy.Verdict{Kind: policy.VerdictAccept}, Origin: allow},
			{Match: udp(11), Verdict: policy.Verdict{Kind: policy.VerdictAccept}}, // Tabby's own: no counter
		}}},
		Jumps: []policy.Jump{{Table: policy.TableFilter, From: "INPUT", To: policy.ChainInput}},
	}
	if _, err := fw.Apply(ctx, rs); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	logged := map[string]int{}
	lctx, lcancel := context.WithCancel(ctx)
	ready := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- n.Do(func() error {
			ready <- nil
			return dataplane.ListenNFLOG(lctx, group, func(p dataplane.PacketLog) {
				mu.Lock()
				logged[p.Prefix+" "+p.Key.Dst.String()]++
				mu.Unlock()
			}, func() { t.Log("nflog overflow") })
		})
	}()
	<-ready
	send := func() {
		if err := n.Do(func() error {
			for _, port := range []int{9, 9, 9, 10, 10, 11} {
				c, err := net.Dial("udp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
				if err != nil {
					return err
				}
				_, _ = c.Write([]byte("hello"))
				c.Close()
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	send()
	testkit.Eventually(t, 10*time.Second, "counters and logs", func() error {
		cs, err := fw.RuleCounters(ctx)
		if err != nil {
			return err
		}
		got := map[string]uint64{}
		for _, c := range cs {
			got[c.Origin.String()] = c.Packets
		}
		if got[deny.String()] < 3 || got[allow.String()] < 2 || len(got) != 2 || got[deny.String()]*2 != got[allow.String()]*3 {
			return fmt.Errorf("counters %v, want 3 denied for 2 allowed per round, nothing else", got)
		}
		mu.Lock()
		defer mu.Unlock()
		if logged[dataplane.FlowLogPrefix(deny)+" 127.0.0.1:9"] < 3 || logged[dataplane.FlowLogPrefix(allow)+" 127.0.0.1:10"] < 2 || len(logged) != 2 {
			if len(logged) == 0 {
				send() // the listener may have bound after the first packets
			}
			return fmt.Errorf("logged %v", logged)
		}
		return nil
	})
	lcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
