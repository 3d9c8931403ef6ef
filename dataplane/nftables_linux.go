package dataplane

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tabbynet/tabby/policy"
)

// NFTFirewall implements Firewall with nftables over netlink (no process is
// started): one inet table, NFTTable, that Tabby owns entirely, with
//
//   - a base chain per hook ("forward" and "input", filter; "postrouting", nat) holding
//     the jumps to Tabby's chains;
//   - a regular chain per neutral chain, each rule commented with a hash of
//     its position and content ("tabby:<hash>");
//   - a verdict map per dispatch chain (interface → goto endpoint chain);
//   - interval sets of IPv4 or IPv6 addresses and concatenated address .
//     protocol . port sets of either family.
//
// Apply diffs desired against the table as read back over netlink and
// programs the difference in one batch (one transaction, atomic): only
// chains whose hash list differs are flushed and refilled, sets and maps
// change element by element, so a pod's ADD writes its own chains and a few
// elements. Between full reads it trusts its record of the table as long as
// the kernel's ruleset generation is the one its last batch left (any
// commit by anyone bumps it), and for at most Resync since the last full
// read: an unchanged table costs one generation request, not a dump of
// every chain and set element.
type NFTFirewall struct {
	mu     sync.Mutex
	conn   *nftables.Conn
	gen    *nlGen
	table  *nftables.Table
	resync time.Duration
	log    *slog.Logger
	now    func() time.Time // the clock of the resync bound (a seam for tests)
	// flowLog is fixed for the firewall's life (the memo's hashes
	// depend on it).
	flowLog FlowLogRules

	rec    *nftState // the table as last read and written; nil = read it
	recGen uint32    // the generation rec is at; valid when recGenOK
	// recGenOK says the generation could be read when rec was: without
	// it, rec is never trusted and every Apply reads the table.
	recGenOK bool
	recVer   uint64 // counts the records read (nftChainMemo.recVer)
	readAt   time.Time
	reads    int
	trusted  int  // Applies that diffed against the record, unread
	genDown  bool // the last generation request failed (logged once)
	memo     nftMemo
	status   []nftChainStatus // program's per-chain scratch, reused
}

// nftChainStatus is where a wanted chain stands in the kernel's table.
type nftChainStatus uint8

const (
	nftChainMissing nftChainStatus = iota
	nftChainSame                   // same rule hashes
	nftChainDiffers
)

var _ Firewall = (*NFTFirewall)(nil)

// NFTConfig configures NewNFTFirewall.
type NFTConfig struct {
	// NetNS is the path of the network namespace to program; "" is the
	// calling process's.
	NetNS string
	// Resync bounds how long Apply trusts its record of the table while
	// the ruleset generation is the one its own last batch left; the
	// kernel is always read on the first Apply, after a failure, when the
	// generation moved and when it cannot be read. Default
	// DefaultNFTResync; negative reads on every Apply.
	Resync time.Duration
	// FlowLog says which policy rules log to NFLOG.
	FlowLog FlowLogRules
	// Log receives the one warning when the generation cannot be read
	// (and the note when it can again); nil logs nothing.
	Log *slog.Logger
}

// DefaultNFTResync is NFTConfig.Resync's default: the longest Apply
// trusts its record of the table without reading it back, provided the
// kernel's ruleset generation is still the one its own last batch left.
// Any commit in the namespace, by anyone (`nft flush chain`, a deleted
// element, kube-proxy), bumps the generation, so the next Apply (the
// agent's periodic pass, every 30 s) reads the table and repairs it
// whatever this bound is. The bound is the safety net for what a
// generation cannot show: a record gone wrong without a commit (a bug of
// the agent's own). A full read dumps every chain and every set's
// elements, O(cluster) (docs/scale.md, "nftables generation check").
// iptables has no generation and keeps DefaultFirewallResync.
const DefaultNFTResync = 5 * time.Minute

// NewNFTFirewall opens netlink connections in the namespace and checks that
// the kernel has nf_tables. Close releases them.
func NewNFTFirewall(cfg NFTConfig) (*NFTFirewall, error) {
	f := &NFTFirewall{resync: cfg.Resync, flowLog: cfg.FlowLog, log: cfg.Log, now: time.Now,
		table: &nftables.Table{Name: NFTTable, Family: nftables.TableFamilyINet}}
	if f.resync == 0 {
		f.resync = DefaultNFTResync
	}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	fd := 0
	if cfg.NetNS != "" {
		h, err := netns.GetFromPath(cfg.NetNS)
		if err != nil {
			return nil, fmt.Errorf("opening netns %s: %w", cfg.NetNS, err)
		}
		defer h.Close()
		fd = int(h)
	}
	var opts []nftables.ConnOption
	if fd != 0 {
		opts = append(opts, nftables.WithNetNSFd(fd))
	}
	opts = append(opts, nftables.WithSockOptions(bigBuffers))
	conn, err := nftables.New(append(opts, nftables.AsLasting())...)
	if err != nil {
		return nil, fmt.Errorf("nftables netlink: %w", err)
	}
	gen, err := dialGen(fd)
	if err != nil {
		_ = conn.CloseLasting()
		return nil, err
	}
	f.conn, f.gen = conn, gen
	if _, err := f.gen.id(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("nftables not available: %w", err)
	}
	return f, nil
}

// nftMaxBatchRules is how many rules one batch writes at most.
const nftMaxBatchRules = 4000

// nftSocketBuffer bounds one batch (and its acknowledgements): the first
// Apply on a node with a thousand endpoints sends tens of thousands of
// messages in one transaction, far beyond the default socket buffers.
const nftSocketBuffer = 64 << 20

// bigBuffers raises the socket's buffers past the sysctl limits (the
// agent runs as root), falling back to the plain options.
func bigBuffers(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		for _, o := range [][2]int{{unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}, {unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}} {
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], nftSocketBuffer); e != nil {
				if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], nftSocketBuffer); e != nil {
					serr = e
				}
			}
		}
	})
	return errors.Join(err, serr)
}

// Close releases the netlink connections.
func (f *NFTFirewall) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return errors.Join(f.conn.CloseLasting(), f.gen.close())
}

// Backend returns "nftables".
func (f *NFTFirewall) Backend() string { return FirewallNFTables }

// Reads returns how often Apply has read the table from the kernel.
func (f *NFTFirewall) Reads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// Trusted returns how many Applies diffed against the record without
// reading the table, the generation being unchanged.
func (f *NFTFirewall) Trusted() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.trusted
}

// nftState is the table's content as the diff sees it.
type nftState struct {
	exists bool
	// chains maps every chain to its rules' hashes ("" for a rule without
	// one); base chains included.
	chains map[string][]string
	sets   map[string]*nftSetState
}

type nftSetState struct {
	kind nftSetKind
	// elems maps a member's key to its kernel elements (a range's start
	// and end) and, in a verdict map, its target chain.
	elems map[string]nftMember
	// delta, when set, says how elems differs from another state's, so
	// that changing the kernel from that state needs no full comparison.
	delta *nftSetDelta
}

// nftSetDelta: the state is from's minus del plus add (keys, sorted); a key
// whose member changed is in both.
type nftSetDelta struct {
	from     *nftSetState
	del, add []string
}

type nftMember struct {
	els   []nftables.SetElement
	chain string // verdict maps: goto target
}

// nftWantChain is one desired chain.
type nftWantChain struct {
	name   string
	base   *nftBase
	src    *policy.Chain // regular chains: an element of the state's Chains
	jumps  []policy.Jump // base chains
	hashes []string
	memo   *nftChainMemo // regular chains
}

// nftMemo remembers, between Applies, each chain's rule hashes and each
// set's elements with the model they were computed from. A chain or set
// whose rules or members are the very slices of the last Apply (a
// policy.Compiler shares what did not change) is not rendered or hashed
// again; the state passed to Apply must not be modified afterwards. It is
// updated in place: entries carry the pass that last used them, and those
// an Apply did not use are dropped at its end.
type nftMemo struct {
	pass   uint64
	chains map[string]*nftChainMemo
	sets   map[string]nftSetMemo
	// want is the chain list of the last Apply, whose array the next one
	// refills (nothing keeps the list itself).
	want []nftWantChain
}

type nftChainMemo struct {
	pass   uint64
	table  string
	rules  []policy.Rule
	hashes []string
	// recVer, when it is NFTFirewall.recVer (not 0), says that the
	// record holds hashes for this chain, so program need not look.
	recVer uint64
}

type nftSetMemo struct {
	pass    uint64
	src     policy.Set
	targets []policy.DispatchTarget // verdict maps: a copy of the targets
	st      *nftSetState
}

// desiredNFT computes the desired chains and sets. With memo it reuses and
// updates memo's content; without, it computes everything.
func desiredNFT(s FirewallState, memo *nftMemo, fl FlowLogRules) ([]nftWantChain, map[string]*nftSetState, error) {
	record := memo != nil
	if !record {
		memo = &nftMemo{}
	}
	if memo.chains == nil {
		memo.chains = make(map[string]*nftChainMemo, len(s.Chains))
		memo.sets = make(map[string]nftSetMemo, len(s.Sets)+2)
	}
	memo.pass++
	d := &nftDesired{
		fl:     fl,
		memo:   memo,
		pass:   memo.pass,
		chains: slices.Grow(memo.want[:0], len(s.Chains)+len(nftBases)),
		sets:   make(map[string]*nftSetState, len(s.Sets)+2),
	}
	d.baseChains(s.Jumps)
	for i := range s.Chains {
		d.chain(&s.Chains[i])
	}
	for _, ps := range s.Sets {
		d.set(ps)
	}
	chains := d.chains
	clear(chains[len(chains):cap(chains)]) // no references left from a longer list
	if record {
		memo.want = chains
		if len(memo.chains) > d.usedChains {
			maps.DeleteFunc(memo.chains, func(_ string, m *nftChainMemo) bool { return m.pass != d.pass })
		}
		if len(memo.sets) > d.usedSets {
			maps.DeleteFunc(memo.sets, func(_ string, m nftSetMemo) bool { return m.pass != d.pass })
		}
	}
	return chains, d.sets, errors.Join(d.errs...)
}

// nftDesired is one desiredNFT computation: what it has built so far and
// which memo entries this pass used.
type nftDesired struct {
	fl                   FlowLogRules
	memo                 *nftMemo
	pass                 uint64
	usedChains, usedSets int
	chains               []nftWantChain
	sets                 map[string]*nftSetState
	// dispatchNames are the dispatch chains seen (they have no chain memo
	// to tell a name listed twice).
	dispatchNames []string
	errs          []error
}

// baseChains adds one base chain per hook that jumps leave from.
func (d *nftDesired) baseChains(jumps []policy.Jump) {
	byBase := map[string][]policy.Jump{}
	for _, j := range jumps {
		k := nftBaseKey(j)
		if _, ok := nftBases[k]; !ok {
			d.errs = append(d.errs, fmt.Errorf("jump from %s: no such hook in the nftables backend", j.From))
			continue
		}
		byBase[k] = append(byBase[k], j)
	}
	for _, from := range slices.Sorted(maps.Keys(byBase)) {
		b := nftBases[from]
		c := nftWantChain{name: b.name, base: &b, jumps: byBase[from]}
		texts := make([]string, 0, len(c.jumps))
		for _, j := range c.jumps {
			texts = append(texts, "jump "+j.To)
		}
		c.hashes = nftRuleHashes(c.name, texts)
		d.chains = append(d.chains, c)
	}
}

// chain adds a regular or dispatch chain, its hashes from the memo when its
// rules are the last Apply's.
func (d *nftDesired) chain(pc *policy.Chain) {
	c := nftWantChain{name: pc.Name, src: pc}
	// One table holds every chain: a name must not come twice, from two
	// tables either.
	cm := d.memo.chains[pc.Name]
	if cm != nil && cm.pass == d.pass || slices.Contains(d.dispatchNames, pc.Name) {
		d.errs = append(d.errs, fmt.Errorf("chain %s listed twice", pc.Name))
		return
	}
	if pc.Dispatch != nil {
		d.dispatchNames = append(d.dispatchNames, pc.Name)
		c.hashes = nftRuleHashes(c.name, nftDispatchTexts(*pc))
		d.dispatchMap(pc)
		d.chains = append(d.chains, c)
		return
	}
	if cm != nil && cm.table == pc.Table && policy.SameSlice(cm.rules, pc.Rules) {
		c.hashes = cm.hashes
		cm.pass = d.pass
	} else {
		texts := make([]string, 0, len(pc.Rules))
		for _, r := range pc.Rules {
			texts = append(texts, r.String()+ruleExtrasText(r, d.fl))
		}
		c.hashes = nftRuleHashes(c.name, texts)
		if cm == nil {
			cm = &nftChainMemo{}
			d.memo.chains[pc.Name] = cm
		}
		*cm = nftChainMemo{pass: d.pass, table: pc.Table, rules: pc.Rules, hashes: c.hashes}
	}
	d.usedChains++
	c.memo = cm
	d.chains = append(d.chains, c)
}

// dispatchMap adds a dispatch chain's verdict map: the last Apply's when
// the targets are the same, else a change of it (or a new one).
func (d *nftDesired) dispatchMap(pc *policy.Chain) {
	name := nftMapName(pc.Name)
	mm, ok := d.memo.sets[name]
	if ok && mm.pass != d.pass && mm.st.kind == nftSetVmap && slices.Equal(mm.targets, pc.Dispatch.Targets) {
		d.sets[name] = mm.st
		mm.pass = d.pass
		d.memo.sets[name] = mm
	} else {
		var m *nftSetState
		if ok && mm.st.kind == nftSetVmap {
			m = vmapDelta(mm.st, mm.targets, pc.Dispatch.Targets)
		}
		if m == nil {
			m = &nftSetState{kind: nftSetVmap, elems: make(map[string]nftMember, len(pc.Dispatch.Targets))}
			for _, t := range pc.Dispatch.Targets {
				m.elems[t.Iface] = vmapMember(t)
			}
		}
		d.sets[name] = m
		d.memo.sets[name] = nftSetMemo{pass: d.pass, targets: slices.Clone(pc.Dispatch.Targets), st: m}
	}
	d.usedSets++
}

// set adds an address (or address-and-port) set: the last Apply's when its
// members are the same slices, else built anew.
func (d *nftDesired) set(ps policy.Set) {
	if sm, ok := d.memo.sets[ps.Name]; ok && sm.pass != d.pass && sm.st.kind != nftSetVmap && sm.src.Type == ps.Type && sm.src.AddrFamily() == ps.AddrFamily() &&
		policy.SameSlice(sm.src.Nets, ps.Nets) && policy.SameSlice(sm.src.AddrPorts, ps.AddrPorts) {
		d.sets[ps.Name] = sm.st
		sm.pass = d.pass
		d.memo.sets[ps.Name] = sm
		d.usedSets++
		return
	}
	st, err := nftSetStateOf(ps)
	if err != nil {
		d.errs = append(d.errs, err)
		if st == nil {
			return
		}
	}
	d.sets[ps.Name] = st
	if sm, ok := d.memo.sets[ps.Name]; !ok || sm.pass != d.pass {
		d.usedSets++
	}
	d.memo.sets[ps.Name] = nftSetMemo{pass: d.pass, src: ps, st: st}
}

// nftSetStateOf builds a set's elements. A member of the wrong family or
// that cannot be encoded is left out and reported; a set of an unknown
// kind is nil.
func nftSetStateOf(ps policy.Set) (*nftSetState, error) {
	kind, err := nftSetKindOf(ps)
	if err != nil {
		return nil, err
	}
	var errs []error
	st := &nftSetState{kind: kind, elems: map[string]nftMember{}}
	for _, p := range ps.Nets {
		if policy.FamilyOf(p.Addr()) != ps.AddrFamily() {
			errs = append(errs, fmt.Errorf("set %s of family %v: member %s", ps.Name, ps.Family, p))
			continue
		}
		r := prefixRange(p)
		st.elems[r.key()] = nftMember{els: r.elements()}
	}
	for _, a := range ps.AddrPorts {
		if policy.FamilyOf(a.Addr) != ps.AddrFamily() {
			errs = append(errs, fmt.Errorf("set %s of family %v: member %s", ps.Name, ps.Family, a))
			continue
		}
		k, err := addrPortKey(a)
		if err != nil {
			errs = append(errs, fmt.Errorf("set %s: %w", ps.Name, err))
			continue
		}
		st.elems[string(k)] = nftMember{els: []nftables.SetElement{{Key: k}}}
	}
	return st, errors.Join(errs...)
}

func vmapMember(t policy.DispatchTarget) nftMember {
	return nftMember{chain: t.Chain, els: []nftables.SetElement{{Key: ifnameKey(t.Iface),
		VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: t.Chain}}}}
}

// vmapDelta returns the verdict map of targets as a change of old, the map
// of oldTargets: a copy of old's elements with the targets that came, went
// or changed, found by walking both lists in interface order. It returns
// nil when a list is not sorted by interface and unique.
func vmapDelta(old *nftSetState, oldTargets, targets []policy.DispatchTarget) *nftSetState {
	d := &nftSetDelta{from: old}
	i, j := 0, 0
	for i < len(oldTargets) || j < len(targets) {
		if i > 0 && i < len(oldTargets) && oldTargets[i-1].Iface >= oldTargets[i].Iface ||
			j > 0 && j < len(targets) && targets[j-1].Iface >= targets[j].Iface {
			return nil
		}
		switch {
		case j == len(targets) || i < len(oldTargets) && oldTargets[i].Iface < targets[j].Iface:
			d.del = append(d.del, oldTargets[i].Iface)
			i++
		case i == len(oldTargets) || targets[j].Iface < oldTargets[i].Iface:
			d.add = append(d.add, targets[j].Iface)
			j++
		default:
			if oldTargets[i].Chain != targets[j].Chain {
				d.del = append(d.del, oldTargets[i].Iface)
				d.add = append(d.add, targets[j].Iface)
			}
			i++
			j++
		}
	}
	old.delta = nil // no chain of states back to the first
	m := &nftSetState{kind: nftSetVmap, elems: maps.Clone(old.elems), delta: d}
	if m.elems == nil {
		m.elems = map[string]nftMember{}
	}
	for _, k := range d.del {
		delete(m.elems, k)
	}
	for _, t := range targets {
		if _, ok := m.elems[t.Iface]; !ok {
			m.elems[t.Iface] = vmapMember(t)
		}
	}
	if len(m.elems) != len(targets) {
		return nil // old's elements were not oldTargets'
	}
	return m
}

// read returns the table as the kernel holds it.
func (f *NFTFirewall) read() (*nftState, error) {
	st := &nftState{chains: map[string][]string{}, sets: map[string]*nftSetState{}}
	tables, err := f.conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("listing tables: %w", err)
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == NFTTable }) {
		return st, nil
	}
	st.exists = true
	chains, err := f.conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("listing chains: %w", err)
	}
	for _, c := range chains {
		if c.Table.Name != NFTTable {
			continue
		}
		rules, err := f.conn.GetRules(f.table, c)
		if err != nil {
			return nil, fmt.Errorf("listing rules of %s: %w", c.Name, err)
		}
		hashes := make([]string, 0, len(rules))
		for _, r := range rules {
			h, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			hashes = append(hashes, strings.TrimPrefix(h, "tabby:"))
		}
		st.chains[c.Name] = hashes
	}
	sets, err := f.conn.GetSets(f.table)
	if err != nil {
		return nil, fmt.Errorf("listing sets: %w", err)
	}
	for _, s := range sets {
		if s.Anonymous || strings.HasPrefix(s.Name, "__") {
			continue
		}
		els, err := f.conn.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("listing elements of %s: %w", s.Name, err)
		}
		ks := &nftSetState{kind: kindOf(s), elems: map[string]nftMember{}}
		switch ks.kind {
		case nftSetNet, nftSetNet6:
			for _, r := range rangesOf(els) {
				ks.elems[r.key()] = nftMember{els: r.elements()}
			}
		case nftSetVmap:
			for _, e := range els {
				name := strings.TrimRight(string(e.Key), "\x00")
				ks.elems[name] = nftMember{chain: verdictChain(e.Val), els: []nftables.SetElement{{Key: e.Key}}}
			}
		default:
			for _, e := range els {
				ks.elems[string(e.Key)] = nftMember{els: []nftables.SetElement{{Key: e.Key}}}
			}
		}
		st.sets[s.Name] = ks
	}
	return st, nil
}

// verdictChain decodes the chain of a goto or jump verdict as the kernel
// dumps a verdict map's data.
func verdictChain(b []byte) string {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return ""
	}
	ad.ByteOrder = binary.BigEndian
	chain := ""
	for ad.Next() {
		if ad.Type() == unix.NFTA_VERDICT_CHAIN {
			chain = strings.TrimRight(ad.String(), "\x00")
		}
	}
	return chain
}

// Apply implements Firewall.
func (f *NFTFirewall) Apply(ctx context.Context, state FirewallState) (ApplyStats, error) {
	if err := ValidateFirewallState(state); err != nil {
		return ApplyStats{}, err
	}
	if err := ctx.Err(); err != nil {
		return ApplyStats{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	chains, sets, err := desiredNFT(state, &f.memo, f.flowLog)
	if err != nil {
		f.memo = nftMemo{}
		return ApplyStats{}, err
	}
	actual, err := f.actual()
	if err != nil {
		return ApplyStats{}, err
	}
	stats, err := f.program(actual, chains, sets)
	if err != nil {
		f.rec = nil
		return ApplyStats{}, err
	}
	return stats, nil
}

// actual returns the record when it can be trusted, else the kernel's
// table. The record is trusted when the ruleset generation is the one it
// is at (nobody committed since this firewall read the table or made its
// own last batch) and the last full read is younger than resync. A
// generation that cannot be read is logged once and costs a full read
// per Apply until it can be read again.
func (f *NFTFirewall) actual() (*nftState, error) {
	g, gerr := f.genID()
	if f.rec != nil && gerr == nil && f.recGenOK && g == f.recGen && f.resync >= 0 && f.now().Sub(f.readAt) < f.resync {
		f.trusted++
		return f.rec, nil
	}
	st, err := f.read()
	if err != nil {
		return nil, err
	}
	f.reads++
	// A change between reading the generation and the table makes the
	// generation stale, so the next Apply reads again.
	f.rec, f.recGen, f.recGenOK, f.readAt = st, g, gerr == nil, f.now()
	f.recVer++
	return st, nil
}

// genID reads the ruleset generation and logs the first failure after a
// success (and the first success after a failure).
func (f *NFTFirewall) genID() (uint32, error) {
	g, err := f.gen.id()
	switch {
	case err != nil && !f.genDown:
		f.genDown = true
		f.log.Warn("cannot read the nftables ruleset generation; reading the whole table on every pass until it can", "err", err)
	case err == nil && f.genDown:
		f.genDown = false
		f.log.Info("nftables ruleset generation readable again")
	}
	return g, err
}

// program sends one batch that turns actual into desired, and updates the
// record.
func (f *NFTFirewall) program(actual *nftState, chains []nftWantChain, sets map[string]*nftSetState) (ApplyStats, error) {
	p := &nftProgram{f: f, c: f.conn, t: f.table, actual: actual, chains: chains, sets: sets}
	p.classify()
	// Render the rules to be written once before queuing anything, so
	// that an unrenderable rule fails the Apply with nothing sent.
	if err := p.checkRules(); err != nil {
		return p.st, err
	}
	if !actual.exists {
		p.c.AddTable(p.t)
	}
	p.changeSets()
	p.addChains()
	if err := p.writeChains(); err != nil {
		return ApplyStats{}, err
	}
	p.changeMaps()
	p.removeStale()
	return p.commit()
}

// nftProgram is one program call: the batch being queued on c, in the
// order its steps run, and what the record learns from it.
type nftProgram struct {
	f      *NFTFirewall
	c      *nftables.Conn
	t      *nftables.Table
	actual *nftState
	chains []nftWantChain
	sets   map[string]*nftSetState
	// status says where each of chains stands in the kernel; found counts
	// the wanted chains the table has.
	status []nftChainStatus
	found  int
	// recVer is f.recVer when actual is the record, else 0.
	recVer uint64
	st     ApplyStats
	errs   []error
	// flushes counts the batches already sent (a large first Apply);
	// written are the chains rewritten; stale the chains removed.
	flushes int
	written []int
	stale   []string
}

// classify looks up once where each chain stands in the kernel. Names are
// unique (desiredNFT checks), so that stale chains are looked for only
// when found says there are.
func (p *nftProgram) classify() {
	status := slices.Grow(p.f.status[:0], len(p.chains))
	p.recVer = p.f.recVer
	if p.actual != p.f.rec {
		p.recVer = 0
	}
	for _, ch := range p.chains {
		if ch.memo != nil && p.recVer != 0 && ch.memo.recVer == p.recVer {
			status = append(status, nftChainSame)
			p.found++
			continue
		}
		old, ok := p.actual.chains[ch.name]
		switch {
		case !ok:
			status = append(status, nftChainMissing)
		case slices.Equal(old, ch.hashes):
			status = append(status, nftChainSame)
			if ch.memo != nil {
				ch.memo.recVer = p.recVer
			}
			p.found++
		default:
			status = append(status, nftChainDiffers)
			p.found++
		}
	}
	p.f.status = status
	p.status = status
}

// checkRules renders every rule of the chains to be written.
func (p *nftProgram) checkRules() error {
	for i, ch := range p.chains {
		if p.status[i] == nftChainSame || ch.base != nil || ch.src.Dispatch != nil {
			continue
		}
		for _, r := range ch.src.Rules {
			if _, _, err := nftRuleExprs(p.t, r, p.f.flowLog); err != nil {
				return fmt.Errorf("chain %s: rule %s: %w", ch.name, r, err)
			}
		}
	}
	return nil
}

func (p *nftProgram) setObj(name string, kind nftSetKind) *nftables.Set {
	return nftSetTemplate(p.t, name, kind)
}

// changeSets is step 1. Sets (not maps, whose elements name chains): create
// or change members. Within the one transaction order does not open a
// window, and removals first keep interval sets free of overlaps.
func (p *nftProgram) changeSets() {
	for _, name := range slices.Sorted(maps.Keys(p.sets)) {
		want := p.sets[name]
		if want.kind == nftSetVmap {
			continue
		}
		cur := p.actual.sets[name]
		if cur != nil && cur.kind != want.kind {
			p.errs = append(p.errs, fmt.Errorf("set %s has another type in the kernel; remove the table (tabby-agent cleanup) to recreate it", name))
			continue
		}
		if cur == nil {
			var els []nftables.SetElement
			for _, k := range slices.Sorted(maps.Keys(want.elems)) {
				els = append(els, want.elems[k].els...)
			}
			so := p.setObj(name, want.kind)
			if err := p.c.AddSet(so, nil); err != nil {
				p.errs = append(p.errs, fmt.Errorf("set %s: %w", name, err))
			}
			p.errs = append(p.errs, p.f.elements(so, els, false)...)
			p.st.SetsCreated++
			p.st.MembersAdded += len(want.elems)
			continue
		}
		p.errs = append(p.errs, p.f.changeMembers(name, want, cur, &p.st)...)
	}
}

// addChains is step 2. Chains: create the missing ones (so that jumps and
// map elements find them), then create the verdict maps.
func (p *nftProgram) addChains() {
	for i, ch := range p.chains {
		if p.status[i] != nftChainMissing {
			continue
		}
		nc := &nftables.Chain{Name: ch.name, Table: p.t}
		if ch.base != nil {
			accept := nftables.ChainPolicyAccept
			nc.Type, nc.Hooknum, nc.Priority, nc.Policy = ch.base.typ, ch.base.hook, ch.base.priority, &accept
		}
		p.c.AddChain(nc)
	}
	for _, name := range slices.Sorted(maps.Keys(p.sets)) {
		if p.sets[name].kind == nftSetVmap && p.actual.sets[name] == nil {
			if err := p.c.AddSet(p.setObj(name, nftSetVmap), nil); err != nil {
				p.errs = append(p.errs, fmt.Errorf("map %s: %w", name, err))
			}
			p.st.SetsCreated++
		}
	}
}

// writeChains is step 3. Rewrite the chains whose rules differ. A batch
// beyond nftMaxBatchRules rules (the first Apply on a large node) is split
// between chains: the kernel refuses very large transactions. Chains are
// complete in every part, and the dispatch maps only point to new chains
// in the last part.
func (p *nftProgram) writeChains() error {
	pending := 0
	for i, ch := range p.chains {
		if p.status[i] == nftChainSame {
			continue
		}
		p.written = append(p.written, i)
		nc := &nftables.Chain{Name: ch.name, Table: p.t}
		if p.status[i] == nftChainDiffers {
			p.c.FlushChain(nc)
		}
		if err := p.f.addRules(nc, ch); err != nil {
			p.errs = append(p.errs, fmt.Errorf("chain %s: %w", ch.name, err))
		}
		p.st.ChainsWritten++
		p.st.RulesWritten += len(ch.hashes)
		if ch.base != nil {
			p.st.JumpsInserted += len(ch.hashes)
		}
		if pending += len(ch.hashes); pending >= nftMaxBatchRules && len(p.errs) == 0 {
			if err := p.c.Flush(); err != nil {
				return fmt.Errorf("nftables batch: %w", err)
			}
			p.flushes++
			pending = 0
		}
	}
	return nil
}

// changeMaps changes the verdict maps' elements, now that every chain they
// name is filled.
func (p *nftProgram) changeMaps() {
	for _, name := range slices.Sorted(maps.Keys(p.sets)) {
		want := p.sets[name]
		if want.kind != nftSetVmap {
			continue
		}
		cur := p.actual.sets[name]
		if cur == nil {
			cur = &nftSetState{kind: nftSetVmap}
		}
		p.errs = append(p.errs, p.f.changeMembers(name, want, cur, &p.st)...)
	}
}

// removeStale is step 4. Stale state: flush stale chains (dropping their
// references), then delete stale maps and sets, then the chains.
func (p *nftProgram) removeStale() {
	if p.found < len(p.actual.chains) {
		wantChain := make(map[string]bool, len(p.chains))
		for _, ch := range p.chains {
			wantChain[ch.name] = true
		}
		for name := range p.actual.chains {
			if !wantChain[name] {
				p.stale = append(p.stale, name)
			}
		}
		slices.Sort(p.stale)
	}
	for _, name := range p.stale {
		p.c.FlushChain(&nftables.Chain{Name: name, Table: p.t})
	}
	for _, name := range slices.Sorted(maps.Keys(p.actual.sets)) {
		if p.sets[name] == nil {
			p.c.DelSet(&nftables.Set{Table: p.t, Name: name})
			p.st.SetsDeleted++
		}
	}
	for _, name := range p.stale {
		p.c.DelChain(&nftables.Chain{Name: name, Table: p.t})
		if _, isBase := baseNames()[name]; isBase {
			p.st.JumpsDeleted += len(p.actual.chains[name])
		} else {
			p.st.ChainsDeleted++
		}
	}
}

// commit sends the batch, unless an error or nothing was queued, and makes
// the record the desired state.
func (p *nftProgram) commit() (ApplyStats, error) {
	f, actual := p.f, p.actual
	if len(p.errs) > 0 {
		// Rules were checked before anything was queued, so these are
		// encoding errors, which make Flush drop the queue unsent.
		_ = p.c.Flush()
		return ApplyStats{}, errors.Join(p.errs...)
	}
	if !p.st.Changed() && actual.exists && p.flushes == 0 {
		return p.st, nil // nothing queued, nothing committed: the record stands
	}
	if err := p.c.Flush(); err != nil {
		return ApplyStats{}, fmt.Errorf("nftables batch: %w", err)
	}
	// The record (actual is f.rec) becomes the desired state, at the
	// generation this batch made, provided nobody committed in between.
	// Chains not written have equal hashes already.
	for _, i := range p.written {
		actual.chains[p.chains[i].name] = p.chains[i].hashes
		if m := p.chains[i].memo; m != nil {
			m.recVer = p.recVer
		}
	}
	for _, name := range p.stale {
		delete(actual.chains, name)
	}
	actual.exists, actual.sets = true, p.sets
	g, err := f.genID()
	if err != nil || f.rec != actual || !f.recGenOK || g != f.recGen+1+uint32(p.flushes) {
		f.rec = nil // read again next time
	} else {
		f.recGen = g
	}
	return p.st, nil
}

func baseNames() map[string]bool {
	out := map[string]bool{}
	for _, b := range nftBases {
		out[b.name] = true
	}
	return out
}

// changeMembers queues the element changes of one set or map.
func (f *NFTFirewall) changeMembers(name string, want, cur *nftSetState, st *ApplyStats) []error {
	if want == cur {
		return nil // the record holds the very state rendered last time
	}
	s := nftSetTemplate(f.table, name, want.kind)
	var del, add []nftables.SetElement
	if d := want.delta; d != nil && d.from == cur {
		for _, k := range d.del {
			del = append(del, cur.elems[k].els...)
			if _, ok := want.elems[k]; !ok {
				st.MembersRemoved++
			}
		}
		for _, k := range d.add {
			add = append(add, want.elems[k].els...)
			st.MembersAdded++
		}
		return append(f.elements(s, del, true), f.elements(s, add, false)...)
	}
	for _, k := range slices.Sorted(maps.Keys(cur.elems)) {
		w, ok := want.elems[k]
		if !ok || w.chain != cur.elems[k].chain {
			del = append(del, cur.elems[k].els...)
			if !ok {
				st.MembersRemoved++
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(want.elems)) {
		if old, ok := cur.elems[k]; !ok || old.chain != want.elems[k].chain {
			add = append(add, want.elems[k].els...)
			st.MembersAdded++
		}
	}
	return append(f.elements(s, del, true), f.elements(s, add, false)...)
}

// nftElemsPerMessage bounds the elements of one message: the element list
// is one netlink attribute, whose length field has 16 bits.
const nftElemsPerMessage = 256

// elements queues element additions (or deletions) in messages small
// enough for one attribute; a range's start and end stay together.
func (f *NFTFirewall) elements(s *nftables.Set, els []nftables.SetElement, del bool) []error {
	var errs []error
	for len(els) > 0 {
		n := min(len(els), nftElemsPerMessage)
		if n < len(els) && els[n].IntervalEnd {
			n++
		}
		op := f.conn.SetAddElements
		if del {
			op = f.conn.SetDeleteElements
		}
		if err := op(s, els[:n]); err != nil {
			errs = append(errs, fmt.Errorf("set %s: %w", s.Name, err))
		}
		els = els[n:]
	}
	return errs
}

// addRules queues a chain's rules, each with its hash comment.
func (f *NFTFirewall) addRules(nc *nftables.Chain, ch nftWantChain) error {
	var exprs [][]expr.Any
	switch {
	case ch.base != nil:
		for _, j := range ch.jumps {
			exprs = append(exprs, []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: j.To}})
		}
	case ch.src != nil && ch.src.Dispatch != nil:
		exprs = nftDispatchExprs(*ch.src)
	default:
		for _, r := range ch.src.Rules {
			ex, anon, err := nftRuleExprs(f.table, r, f.flowLog)
			if err != nil {
				return err
			}
			// Anonymous sets go into the batch first; the rule's lookups
			// (in order) refer to them by the ID AddSet assigned.
			i := 0
			for _, e := range ex {
				if l, ok := e.(*expr.Lookup); ok && l.SetName == "" {
					a := anon[i]
					i++
					if err := f.conn.AddSet(a.set, a.elems); err != nil {
						return err
					}
					l.SetName, l.SetID = a.set.Name, a.set.ID
				}
			}
			exprs = append(exprs, ex)
		}
	}
	for i, ex := range exprs {
		f.conn.AddRule(&nftables.Rule{Table: f.table, Chain: nc, Exprs: ex,
			UserData: userdata.AppendString(nil, userdata.TypeComment, "tabby:"+ch.hashes[i])})
	}
	return nil
}

// Remove implements Firewall: the table goes, with everything in it.
func (f *NFTFirewall) Remove(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rec = nil
	return removeNFTTable(f.conn)
}

func removeNFTTable(c *nftables.Conn) error {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("listing tables: %w", err)
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == NFTTable }) {
		return nil
	}
	c.DelTable(&nftables.Table{Name: NFTTable, Family: nftables.TableFamilyINet})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("deleting table %s: %w", NFTTable, err)
	}
	return nil
}

// Diff reads the kernel's table and lists how it differs from desired (an
// empty list: Apply would change nothing). It changes nothing; tests and
// diagnostics use it.
func (f *NFTFirewall) Diff(ctx context.Context, desired FirewallState) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	chains, sets, err := desiredNFT(desired, nil, f.flowLog)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	actual, err := f.read()
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []string
	want := map[string]bool{}
	for _, c := range chains {
		want[c.name] = true
		if got, ok := actual.chains[c.name]; !ok {
			out = append(out, "chain "+c.name+": missing")
		} else if !slices.Equal(got, c.hashes) {
			out = append(out, fmt.Sprintf("chain %s: %d rules differ from the %d wanted", c.name, len(got), len(c.hashes)))
		}
	}
	for name := range actual.chains {
		if !want[name] {
			out = append(out, "chain "+name+": not wanted")
		}
	}
	for name, s := range sets {
		cur := actual.sets[name]
		if cur == nil {
			out = append(out, "set "+name+": missing")
			continue
		}
		for k, m := range s.elems {
			if c, ok := cur.elems[k]; !ok || c.chain != m.chain {
				out = append(out, fmt.Sprintf("set %s: member %q missing", name, k))
			}
		}
		for k := range cur.elems {
			if _, ok := s.elems[k]; !ok {
				out = append(out, fmt.Sprintf("set %s: member %q not wanted", name, k))
			}
		}
	}
	for name := range actual.sets {
		if sets[name] == nil {
			out = append(out, "set "+name+": not wanted")
		}
	}
	slices.Sort(out)
	return out, nil
}

// HasTable reports whether the namespace holds Tabby's nftables table.
func (f *NFTFirewall) HasTable() (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tables, err := f.conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, fmt.Errorf("listing tables: %w", err)
	}
	return slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == NFTTable }), nil
}
