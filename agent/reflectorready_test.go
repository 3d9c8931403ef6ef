package agent

import (
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/bgp/session"
	"github.com/tabbynet/tabby/datastore"
)

// TestReflectorReady: a reflector is ready when every session to a live
// peer node is Established, and those to other reflectors (rr) past
// End-of-RIB; a dead node, a clients' missing End-of-RIB (a simulated
// node sends none) and an external peer do not hold it back.
func TestReflectorReady(t *testing.T) {
	a := netip.MustParseAddr
	desired := []bgp.Peer{
		{Address: a("198.18.0.1"), Name: "rr-b", Type: bgp.PeerRR, ClusterNode: true},
		{Address: a("198.18.0.2"), Name: "client", Type: bgp.PeerRRClient, ClusterNode: true},
		{Address: a("198.18.0.3"), Name: "dead", Type: bgp.PeerRRClient, ClusterNode: true},
		{Address: a("198.18.9.9"), Name: "tor", Type: bgp.PeerGlobal},
	}
	up := func(addr string, syncing bool) bgp.PeerStatus {
		return bgp.PeerStatus{Address: a(addr), State: session.Established, Syncing: syncing}
	}
	live := func(n string) bool { return n != "dead" }
	for _, tc := range []struct {
		name   string
		status []bgp.PeerStatus
		want   bool
	}{
		{"all up", []bgp.PeerStatus{up("198.18.0.1", false), up("198.18.0.2", true)}, true},
		{"reflector before End-of-RIB", []bgp.PeerStatus{up("198.18.0.1", true), up("198.18.0.2", false)}, false},
		{"client not up", []bgp.PeerStatus{up("198.18.0.1", false), {Address: a("198.18.0.2"), State: session.Active}}, false},
		{"reflector missing", []bgp.PeerStatus{up("198.18.0.2", false)}, false},
	} {
		if got := reflectorReady(desired, tc.status, live); got != tc.want {
			t.Errorf("%s: ready %v, want %v", tc.name, got, tc.want)
		}
	}
	if reflectorReady(desired, []bgp.PeerStatus{up("198.18.0.1", false), up("198.18.0.2", false)}, nil) {
		t.Error("with every node taken as live, the dead node's missing session did not hold the reflector back")
	}
}

// TestElectorReadiness: the elector takes each node's report from its
// liveness record and keeps it when the record goes or comes back
// without one (an agent restart), until a new report replaces it; only a
// change of a report counts as a change.
func TestElectorReadiness(t *testing.T) {
	e := newReflectorElector("n1", nil, nil, testLogger(), func() {})
	at := time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)
	rec := func(node string, ready *time.Time) datastore.KV {
		b, err := json.Marshal(liveness{Node: node, ReflectorReady: ready})
		if err != nil {
			t.Fatal(err)
		}
		return datastore.KV{Key: datastore.NodeLivenessKey(node), Value: b}
	}
	steps := []struct {
		what    string
		ev      datastore.Event
		changed bool
		want    map[string]time.Time
	}{
		{"resync, n2 ready", datastore.Event{Type: datastore.EventResync, Snapshot: []datastore.KV{rec("n2", &at), rec("n3", nil)}},
			true, map[string]time.Time{"n2": at}},
		{"n2 again", datastore.Event{Type: datastore.EventPut, KV: rec("n2", &at)}, false, map[string]time.Time{"n2": at}},
		{"n2 stops", datastore.Event{Type: datastore.EventDelete, KV: datastore.KV{Key: datastore.NodeLivenessKey("n2")}},
			false, map[string]time.Time{"n2": at}},
		{"n2 back without a report", datastore.Event{Type: datastore.EventPut, KV: rec("n2", nil)}, false, map[string]time.Time{"n2": at}},
		{"n3 ready", datastore.Event{Type: datastore.EventPut, KV: rec("n3", &at)}, true, map[string]time.Time{"n2": at, "n3": at}},
		{"n2 re-elected", datastore.Event{Type: datastore.EventPut, KV: rec("n2", new(at.Add(time.Hour)))},
			true, map[string]time.Time{"n2": at.Add(time.Hour), "n3": at}},
	}
	for _, s := range steps {
		if changed := e.applyLiveness(s.ev, at); changed != s.changed {
			t.Errorf("%s: changed %v, want %v", s.what, changed, s.changed)
		}
		if d := cmp.Diff(s.want, e.readyReflectors()); d != "" {
			t.Errorf("%s: ready (-want +got):\n%s", s.what, d)
		}
	}
	if !e.isLive("n3") || e.isLive("n4") {
		t.Errorf("live n3 %v (want true), n4 %v (want false)", e.isLive("n3"), e.isLive("n4"))
	}
	// The status shows, per elected reflector, whether it reported ready
	// for the election the choice has.
	rec2, err := json.Marshal(bgp.ReflectorChoice{Zones: map[string][]bgp.Reflector{"a": {{Node: "n2", Since: at}, {Node: "n3", Since: at}}}})
	if err != nil {
		t.Fatal(err)
	}
	e.applyRecord(datastore.Event{Type: datastore.EventPut, KV: datastore.KV{Key: datastore.BGPReflectorsKey, Value: rec2, ModRevision: 2}})
	bc := &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{AutoReflectorSpec: api.AutoReflectorSpec{RouteReflectorMode: api.RouteReflectorModeAuto}}}
	got := map[string]bool{}
	for _, r := range e.status(bc, nil).Elected {
		got[r.Node] = r.SessionsReady != nil && *r.SessionsReady
	}
	if d := cmp.Diff(map[string]bool{"n2": false, "n3": true}, got); d != "" {
		t.Errorf("status: sessions ready (-want +got):\n%s", d)
	}
}
