package flowlog

import (
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/policy"
)

// Resolver tells what an address is, from the agent's cluster view. local
// says the address is a pod of this node. It is called at each interval's
// flush, once per record end, and must be thread-safe.
type Resolver interface {
	Endpoint(addr netip.Addr) (ep api.FlowEndpoint, local bool)
}

// Origins maps a log prefix's origin id (policy.Origin.ID) to the origin,
// from the ruleset the agent last applied. Thread-safe.
type Origins interface {
	Origin(id string) *policy.Origin
}

// Stats are the aggregator's counters (exported as metrics).
type Stats struct {
	Packets        uint64 // NFLOG packets taken
	Events         uint64 // conntrack events taken
	FlowsDropped   uint64 // new flows not tracked: MaxFlows reached
	RecordsEvicted uint64 // records overwritten in the full buffer
	Unattributed   uint64 // logged packets whose prefix names no known rule
	SourceLost     uint64 // overflows of the kernel's socket (packets lost there)
	Flows          int    // flows tracked now
	Records        int    // records held now
}

// entryKey is a tracked flow: the tuple, the side that reports it and the
// verdict.
type entryKey struct {
	key      dataplane.FlowKey
	reporter string
	action   string
}

// entry is a tracked flow's state.
type entry struct {
	origin *policy.Origin
	// first is the first event of the current interval (zero: no event
	// since the last flush).
	first, last time.Time
	// packets and bytes: counted this interval (denies), or, for allows,
	// the conntrack totals last seen and those reported so far.
	packets, bytes       uint64
	reportedP, reportedB uint64
	destroyed            bool
}

// Aggregator turns packet logs and conntrack events into flow records.
// Thread-safe; every method is O(1) in the flows tracked except Flush and
// Query, which are linear.
type Aggregator struct {
	cfg     Config
	node    string
	res     Resolver
	origins Origins

	mu      sync.Mutex
	entries map[entryKey]*entry
	ring    []api.FlowRecord // a circular buffer of cfg.MaxRecords
	head    int              // index of the oldest record
	n       int              // records held
	stats   Stats
}

// New returns an aggregator for node.
func New(cfg Config, node string, res Resolver, origins Origins) *Aggregator {
	return &Aggregator{cfg: cfg, node: node, res: res, origins: origins,
		entries: map[entryKey]*entry{}, ring: make([]api.FlowRecord, cfg.MaxRecords)}
}

// reporterOf is the side a rule of origin o reports from.
func reporterOf(o *policy.Origin) string {
	if o.Direction == policy.DirEgress {
		return api.FlowReporterSrc
	}
	return api.FlowReporterDst
}

// Packet takes one logged packet.
func (a *Aggregator) Packet(p dataplane.PacketLog) {
	id, ok := cutPrefix(p.Prefix)
	var o *policy.Origin
	if ok {
		o = a.origins.Origin(id)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.Packets++
	if o == nil {
		a.stats.Unattributed++
		return
	}
	action := api.FlowAllow
	if o.Action == "Deny" {
		action = api.FlowDeny
	}
	k := entryKey{p.Key, reporterOf(o), action}
	e := a.entries[k]
	if e == nil && action == api.FlowAllow {
		// A conntrack event may have come first: it made an entry
		// without an origin, which this packet attributes.
		if e = a.entries[entryKey{p.Key, "", api.FlowAllow}]; e != nil {
			delete(a.entries, entryKey{p.Key, "", api.FlowAllow})
			a.entries[k] = e
		}
	}
	if e == nil {
		if e = a.newEntry(k); e == nil {
			return
		}
	}
	e.origin = o
	e.touch(p.Time)
	if action == api.FlowDeny {
		e.packets++
		e.bytes += uint64(p.Bytes)
	}
}

func cutPrefix(s string) (string, bool) {
	if len(s) <= len(dataplane.FlowLogPrefixTag) || s[:len(dataplane.FlowLogPrefixTag)] != dataplane.FlowLogPrefixTag {
		return "", false
	}
	return s[len(dataplane.FlowLogPrefixTag):], true
}

// newEntry adds an entry unless the table is full. Locked.
func (a *Aggregator) newEntry(k entryKey) *entry {
	if len(a.entries) >= a.cfg.MaxFlows {
		a.stats.FlowsDropped++
		return nil
	}
	e := &entry{}
	a.entries[k] = e
	return e
}

func (e *entry) touch(t time.Time) {
	if e.first.IsZero() {
		e.first = t
	}
	e.last = t
}

// Conn takes one conntrack event. It updates the allowed flows of its
// tuple; a flow not seen yet is tracked (without an origin until a logged
// packet names one) when one end is a pod of this node.
func (a *Aggregator) Conn(ev dataplane.ConnEvent) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.Events++
	found := false
	for _, r := range []string{api.FlowReporterSrc, api.FlowReporterDst, ""} {
		if e := a.entries[entryKey{ev.Key, r, api.FlowAllow}]; e != nil {
			e.update(ev)
			found = true
		}
	}
	if found || ev.Destroy {
		return
	}
	if _, local := a.res.Endpoint(ev.Key.Src.Addr()); !local {
		if _, local := a.res.Endpoint(ev.Key.Dst.Addr()); !local {
			return
		}
	}
	if e := a.newEntry(entryKey{ev.Key, "", api.FlowAllow}); e != nil {
		e.update(ev)
	}
}

func (e *entry) update(ev dataplane.ConnEvent) {
	e.touch(ev.Time)
	// Totals only grow; a smaller one is a new flow reusing the tuple.
	if ev.Packets < e.reportedP {
		e.reportedP, e.reportedB = 0, 0
	}
	e.packets, e.bytes = ev.Packets, ev.Bytes
	e.destroyed = e.destroyed || ev.Destroy
}

// Flush turns the flows with events since the last flush into records
// ending at now, and forgets flows that ended or have been idle too long.
func (a *Aggregator) Flush(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, e := range a.entries {
		if !e.first.IsZero() {
			a.push(a.record(k, e, now))
			e.first = time.Time{}
		}
		if k.action == api.FlowDeny {
			e.packets, e.bytes = 0, 0
		}
		if e.destroyed || k.action == api.FlowDeny || now.Sub(e.last) > a.cfg.Idle {
			delete(a.entries, k)
		}
	}
}

// record makes the record of an entry's interval. Locked.
func (a *Aggregator) record(k entryKey, e *entry, now time.Time) api.FlowRecord {
	r := api.FlowRecord{
		Node: a.node, Start: e.first, End: now, Proto: protoName(k.key.Proto),
		SrcAddr: k.key.Src.Addr(), SrcPort: k.key.Src.Port(), DstAddr: k.key.Dst.Addr(), DstPort: k.key.Dst.Port(),
		Action: k.action, Reporter: k.reporter,
	}
	var srcLocal bool
	r.Src, srcLocal = a.res.Endpoint(r.SrcAddr)
	r.Dst, _ = a.res.Endpoint(r.DstAddr)
	if r.Reporter == "" {
		r.Reporter = api.FlowReporterDst
		if srcLocal {
			r.Reporter = api.FlowReporterSrc
		}
	}
	if o := e.origin; o != nil {
		r.Policy = api.FlowPolicyRule{Tier: o.Tier, Kind: o.Kind, Namespace: o.Namespace, Name: o.Name, Direction: o.Direction, Index: o.Index, Action: o.Action}
	}
	if k.action == api.FlowDeny {
		r.Packets, r.Bytes = e.packets, e.bytes
	} else {
		r.Packets, r.Bytes = e.packets-min(e.packets, e.reportedP), e.bytes-min(e.bytes, e.reportedB)
		e.reportedP, e.reportedB = max(e.packets, e.reportedP), max(e.bytes, e.reportedB)
	}
	return r
}

// push appends a record, overwriting the oldest when full. Locked.
func (a *Aggregator) push(r api.FlowRecord) {
	if a.n == len(a.ring) {
		a.ring[a.head] = r
		a.head = (a.head + 1) % len(a.ring)
		a.stats.RecordsEvicted++
		return
	}
	a.ring[(a.head+a.n)%len(a.ring)] = r
	a.n++
}

// Query returns the records f keeps, oldest first.
func (a *Aggregator) Query(f api.FlowFilter) []api.FlowRecord {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []api.FlowRecord
	for i := range a.n {
		if r := a.ring[(a.head+i)%len(a.ring)]; f.Matches(r) {
			out = append(out, r)
		}
	}
	return out
}

// Lost counts an overflow of a kernel socket.
func (a *Aggregator) Lost() {
	a.mu.Lock()
	a.stats.SourceLost++
	a.mu.Unlock()
}

// Stats returns the counters.
func (a *Aggregator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.stats
	s.Flows, s.Records = len(a.entries), a.n
	return s
}

func protoName(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "icmpv6"
	case 132:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}
