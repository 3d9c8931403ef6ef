package flowlog

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/policy"
)

type fakeView map[netip.Addr]api.FlowEndpoint

func (v fakeView) Endpoint(a netip.Addr) (api.FlowEndpoint, bool) {
	if ep, ok := v[a]; ok {
		return ep, ep.Name != "remote"
	}
	return api.FlowEndpoint{Kind: api.FlowEndpointExternal}, false
}

type fakeOrigins []*policy.Origin

func (f fakeOrigins) Origin(id string) *policy.Origin {
	for _, o := range f {
		if o.ID() == id {
			return o
		}
	}
	return nil
}

var (
	client = netip.MustParseAddr("10.244.1.2")
	server = netip.MustParseAddr("10.244.1.3")
	view   = fakeView{
		client: {Kind: api.FlowEndpointPod, Namespace: "dev", Name: "client", Labels: map[string]string{"app": "client"}},
		server: {Kind: api.FlowEndpointPod, Namespace: "prod", Name: "web"},
	}
	denyIn  = &policy.Origin{Direction: policy.DirIngress, Index: -1, Action: "Deny"}
	allowEg = &policy.Origin{Kind: policy.OriginNamespaced, Namespace: "dev", Name: "out", Direction: policy.DirEgress, Index: 0, Action: "Allow"}
	t0      = time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
)

func key(sport, dport uint16) dataplane.FlowKey {
	return dataplane.FlowKey{Proto: 6, Src: netip.AddrPortFrom(client, sport), Dst: netip.AddrPortFrom(server, dport)}
}

func testConfig() Config {
	c := Default()
	c.Mode = ModeAll
	return c
}

func TestDenyAggregated(t *testing.T) {
	a := New(testConfig(), "n1", view, fakeOrigins{denyIn})
	for i := range 3 {
		a.Packet(dataplane.PacketLog{Key: key(40000, 81), Prefix: dataplane.FlowLogPrefix(denyIn), Bytes: 60, Time: t0.Add(time.Duration(i) * time.Millisecond)})
	}
	a.Packet(dataplane.PacketLog{Key: key(40000, 81), Prefix: "tabby:000000000000", Bytes: 60, Time: t0})
	a.Packet(dataplane.PacketLog{Key: key(40000, 81), Prefix: "someone else", Bytes: 60, Time: t0})
	a.Flush(t0.Add(time.Second))
	want := []api.FlowRecord{{
		Node: "n1", Start: t0, End: t0.Add(time.Second), Proto: "tcp",
		SrcAddr: client, SrcPort: 40000, DstAddr: server, DstPort: 81,
		Src: view[client], Dst: view[server], Action: api.FlowDeny,
		Policy:  api.FlowPolicyRule{Direction: "ingress", Index: -1, Action: "Deny"},
		Packets: 3, Bytes: 180, Reporter: api.FlowReporterDst,
	}}
	if diff := cmp.Diff(want, a.Query(api.FlowFilter{}), cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
	if s := a.Stats(); s.Unattributed != 2 || s.Packets != 5 || s.Flows != 0 {
		t.Errorf("stats %+v", s)
	}
	// Nothing new: no new record.
	a.Flush(t0.Add(2 * time.Second))
	if n := len(a.Query(api.FlowFilter{})); n != 1 {
		t.Errorf("%d records after an empty interval", n)
	}
}

func TestAllowAttributedEitherOrder(t *testing.T) {
	for _, conntrackFirst := range []bool{true, false} {
		a := New(testConfig(), "n1", view, fakeOrigins{allowEg})
		ev := dataplane.ConnEvent{Key: key(40001, 80), Packets: 1, Bytes: 60, Time: t0}
		pkt := dataplane.PacketLog{Key: key(40001, 80), Prefix: dataplane.FlowLogPrefix(allowEg), Bytes: 60, Time: t0}
		if conntrackFirst {
			a.Conn(ev)
			a.Packet(pkt)
		} else {
			a.Packet(pkt)
			a.Conn(ev)
		}
		a.Flush(t0.Add(time.Second))
		a.Conn(dataplane.ConnEvent{Key: key(40001, 80), Packets: 10, Bytes: 1000, Time: t0.Add(1500 * time.Millisecond), Destroy: true})
		a.Flush(t0.Add(2 * time.Second))
		var got []string
		for _, r := range a.Query(api.FlowFilter{}) {
			got = append(got, fmt.Sprintf("%s %s %s %d/%d %s", r.Action, r.Reporter, r.Policy.PolicyName(), r.Packets, r.Bytes, r.End.Sub(t0)))
		}
		want := []string{"allow src dev/out 1/60 1s", "allow src dev/out 9/940 2s"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("conntrack first %v: (-want +got):\n%s", conntrackFirst, diff)
		}
		if s := a.Stats(); s.Flows != 0 {
			t.Errorf("destroyed flow still tracked: %+v", s)
		}
	}
}

func TestNotLocalNotTracked(t *testing.T) {
	a := New(testConfig(), "n1", view, fakeOrigins{})
	other := netip.MustParseAddr("198.18.0.5")
	a.Conn(dataplane.ConnEvent{Key: dataplane.FlowKey{Proto: 6, Src: netip.AddrPortFrom(other, 1), Dst: netip.AddrPortFrom(other, 2)}, Packets: 1, Time: t0})
	a.Conn(dataplane.ConnEvent{Key: key(5, 6), Packets: 1, Time: t0})
	a.Flush(t0.Add(time.Second))
	got := a.Query(api.FlowFilter{})
	if len(got) != 1 || got[0].Policy != (api.FlowPolicyRule{}) || got[0].Reporter != api.FlowReporterSrc {
		t.Errorf("records %+v, want the local pod's flow only, no policy, reported by src", got)
	}
}

// TestFloodBounded: a flood of short flows from many goroutines keeps to
// MaxFlows and MaxRecords and counts what it dropped.
func TestFloodBounded(t *testing.T) {
	cfg := testConfig()
	cfg.MaxFlows, cfg.MaxRecords = 100, 50
	a := New(cfg, "n1", view, fakeOrigins{denyIn})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 1000 {
				a.Packet(dataplane.PacketLog{Key: key(uint16(g*1000+i+1), 81), Prefix: dataplane.FlowLogPrefix(denyIn), Bytes: 60, Time: t0})
				a.Conn(dataplane.ConnEvent{Key: key(uint16(g*1000+i+1), 80), Packets: 2, Time: t0})
			}
		})
	}
	wg.Go(func() {
		for range 10 {
			a.Flush(t0.Add(time.Second))
			a.Query(api.FlowFilter{Action: api.FlowDeny})
		}
	})
	wg.Wait()
	a.Flush(t0.Add(2 * time.Second))
	s := a.Stats()
	if s.Records > 50 || s.Flows > 100 || s.FlowsDropped == 0 || s.RecordsEvicted == 0 {
		t.Errorf("stats %+v: want at most 50 records and 100 flows, drops counted", s)
	}
	if n := len(a.Query(api.FlowFilter{})); n != s.Records {
		t.Errorf("query returned %d of %d records", n, s.Records)
	}
}
