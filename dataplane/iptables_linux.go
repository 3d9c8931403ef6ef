package dataplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/coreos/go-iptables/iptables"

	"github.com/tabbynet/tabby/policy"
)

// Backends of iptables.
const (
	BackendAuto   = "auto"
	BackendLegacy = "legacy"
	BackendNFT    = "nft"
)

// FirewallConfig configures NewFirewall and NewIPTablesFirewall.
type FirewallConfig struct {
	// NetNS is the path of the network namespace to program; "" is the
	// calling process's.
	NetNS string
	// Firewall chooses the backend of NewFirewall: FirewallNFTables,
	// FirewallIPTables or FirewallAuto ("", nftables where the kernel
	// has it).
	Firewall string
	// FlowLog says which policy rules log to NFLOG (flow logs).
	FlowLog FlowLogRules
	// Backend is the iptables mode: BackendLegacy, BackendNFT or BackendAuto (""): what the
	// `iptables` command uses, unless only the other backend holds rules in
	// the namespace (then Tabby's rules go beside those, e.g. kube-proxy's).
	Backend string
	// LockWait bounds the wait for the xtables lock that legacy iptables
	// shares between all its users on the machine. Default 10s.
	LockWait time.Duration
	// Resync is how long Apply trusts its record of what it wrote instead
	// of reading the kernel again (iptables-save of thousands of rules
	// takes hundreds of milliseconds). The kernel is always read on the
	// first Apply and after any failure. Default DefaultFirewallResync for
	// iptables, DefaultNFTResync for nftables (whose record is also
	// dropped at any commit by anyone); a negative value reads the kernel
	// on every Apply.
	Resync time.Duration
	// Log is for what the firewall notices between Applies (nftables:
	// a ruleset generation it cannot read); nil logs nothing.
	Log *slog.Logger
}

// DefaultFirewallResync is FirewallConfig.Resync's default: changes made
// behind Tabby's back (a flushed chain) are repaired within it.
const DefaultFirewallResync = 30 * time.Second

// LinuxFirewall implements Firewall with iptables-save/iptables-restore and
// ipset save/restore for atomic batches, and go-iptables for single rules
// in base chains. It is safe for concurrent use.
type LinuxFirewall struct {
	mu      sync.Mutex
	netns   string
	backend string
	// family is the table this firewall programs: iptables and family
	// inet ipsets, or ip6tables and family inet6 ones. The IPv4 firewall
	// NewIPTablesFirewall returns holds the IPv6 one in six (nil when the
	// kernel has no IPv6) and applies to both.
	family  policy.Family
	six     *LinuxFirewall
	ipt     *iptables.IPTables
	save    string
	restore string
	wait    int // seconds
	resync  time.Duration
	flowLog FlowLogRules

	// What the kernel held when last read, updated with what Apply wrote
	// since; guarded by mu.
	tables map[string]*cachedTable
	sets   map[string]*kernelSet
	setsAt time.Time
	reads  int
	// origins are those of the rules the last Apply rendered, each once,
	// for RuleCounters; guarded by mu.
	origins []*policy.Origin
}

type cachedTable struct {
	ts     tableState
	readAt time.Time
}

var _ Firewall = (*LinuxFirewall)(nil)

// NewIPTablesFirewall detects the iptables mode and returns an iptables
// Firewall acting in the configured namespace.
func NewIPTablesFirewall(cfg FirewallConfig) (*LinuxFirewall, error) {
	f, err := newIPTablesFirewall(cfg, policy.IPv4)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat("/proc/net/if_inet6"); err != nil {
		return f, nil // a kernel without IPv6 carries no IPv6 to police
	}
	cfg.Backend = f.backend
	if f.six, err = newIPTablesFirewall(cfg, policy.IPv6); err != nil {
		return nil, fmt.Errorf("ip6tables (IPv6 is policed with it): %w", err)
	}
	return f, nil
}

func newIPTablesFirewall(cfg FirewallConfig, fam policy.Family) (*LinuxFirewall, error) {
	f := &LinuxFirewall{netns: cfg.NetNS, family: fam, wait: 10, resync: cfg.Resync, flowLog: cfg.FlowLog, tables: map[string]*cachedTable{}}
	if f.resync == 0 {
		f.resync = DefaultFirewallResync
	}
	if cfg.LockWait > 0 {
		f.wait = max(1, int(cfg.LockWait/time.Second))
	}
	backend := cfg.Backend
	switch backend {
	case "", BackendAuto:
		b, err := f.detectBackend()
		if err != nil {
			return nil, err
		}
		backend = b
	case BackendLegacy, BackendNFT:
	default:
		return nil, fmt.Errorf("iptables backend %q: want auto, legacy or nft", cfg.Backend)
	}
	ipt, save, restore, err := backendBinaries(backend, fam)
	if err != nil {
		return nil, err
	}
	f.backend, f.save, f.restore = backend, save, restore
	proto := iptables.ProtocolIPv4
	if fam == policy.IPv6 {
		proto = iptables.ProtocolIPv6
	}
	f.ipt, err = iptables.New(iptables.IPFamily(proto), iptables.Path(ipt), iptables.Timeout(f.wait))
	if err != nil {
		return nil, fmt.Errorf("iptables (%s): %w", ipt, err)
	}
	if _, err := exec.LookPath("ipset"); err != nil {
		return nil, fmt.Errorf("ipset: %w", err)
	}
	if cfg.FlowLog.Deny || cfg.FlowLog.Allow {
		if err := checkNFLOGTarget(ipt); err != nil {
			return nil, fmt.Errorf("flow logs: %w", err)
		}
	}
	return f, nil
}

// checkNFLOGTarget makes sure the iptables command at path knows the NFLOG
// target the flow logs' rules use, so that the agent refuses to start with
// flow logs it cannot write rather than failing at every Apply.
func checkNFLOGTarget(path string) error {
	out, err := exec.Command(path, "-j", "NFLOG", "--help").CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--nflog-group")) {
		return fmt.Errorf("%s has no NFLOG target (the iptables NFLOG extension, libxt_NFLOG): %v", path, err)
	}
	return nil
}

// Backend returns the iptables backend in use: "legacy" or "nft".
func (f *LinuxFirewall) Backend() string { return f.backend }

// backendBinaries finds iptables, iptables-save and iptables-restore (of
// IPv6: ip6tables…) of a backend: the -legacy/-nft variants, or the plain
// names when they are that backend.
func backendBinaries(backend string, fam policy.Family) (ipt, save, restore string, err error) {
	cmd := "iptables"
	if fam == policy.IPv6 {
		cmd = "ip6tables"
	}
	names := func(suffix string) [3]string {
		return [3]string{cmd + suffix, cmd + suffix + "-save", cmd + suffix + "-restore"}
	}
	for _, cand := range [][3]string{names("-" + backend), names("")} {
		paths := [3]string{}
		ok := true
		for i, n := range cand {
			p, lerr := exec.LookPath(n)
			if lerr != nil {
				ok = false
				break
			}
			paths[i] = p
		}
		if !ok {
			continue
		}
		if cand[0] == cmd {
			if m, merr := iptablesMode(paths[0]); merr != nil || m != backend {
				continue
			}
		}
		return paths[0], paths[1], paths[2], nil
	}
	return "", "", "", fmt.Errorf("no %s commands for the %s backend found", cmd, backend)
}

// iptablesMode runs `<path> --version` and returns "nft" or "legacy".
func iptablesMode(path string) (string, error) {
	out, err := exec.Command(path, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w: %s", path, err, bytes.TrimSpace(out))
	}
	if strings.Contains(string(out), "nf_tables") {
		return BackendNFT, nil
	}
	return BackendLegacy, nil
}

// detectBackend is the mode of `iptables`, unless that backend holds no
// rules in the namespace and the other does.
func (f *LinuxFirewall) detectBackend() (string, error) {
	path, err := exec.LookPath("iptables")
	if err != nil {
		return "", fmt.Errorf("iptables: %w", err)
	}
	mode, err := iptablesMode(path)
	if err != nil {
		return "", err
	}
	other := BackendLegacy
	if mode == BackendLegacy {
		other = BackendNFT
	}
	count := func(backend string) int {
		_, save, _, err := backendBinaries(backend, policy.IPv4)
		if err != nil {
			return 0
		}
		out, err := f.exec(context.Background(), nil, save)
		if err != nil {
			return 0
		}
		return strings.Count(string(out), "\n-A ")
	}
	if count(mode) == 0 && count(other) > 0 {
		return other, nil
	}
	return mode, nil
}

// inNetNS runs fn in the firewall's namespace; commands it starts inherit it.
func (f *LinuxFirewall) inNetNS(fn func() error) error {
	if f.netns == "" {
		return fn()
	}
	return ns.WithNetNSPath(f.netns, func(ns.NetNS) error { return fn() })
}

// exec runs a command in the namespace with stdin and returns its stdout.
func (f *LinuxFirewall) exec(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	var out []byte
	err := f.inNetNS(func() error {
		cmd := exec.CommandContext(ctx, name, args...)
		if stdin != nil {
			cmd.Stdin = bytes.NewReader(stdin)
		}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		out = stdout.Bytes()
		return nil
	})
	return out, err
}

// Apply implements Firewall: the IPv4 part of the state with iptables,
// then the IPv6 part with ip6tables.
func (f *LinuxFirewall) Apply(ctx context.Context, state FirewallState) (ApplyStats, error) {
	if err := ValidateFirewallState(state); err != nil {
		return ApplyStats{}, err
	}
	stats, err := f.apply(ctx, state)
	if f.six != nil {
		st6, err6 := f.six.apply(ctx, state)
		addStats(&stats, st6)
		if err6 != nil {
			err = errors.Join(err, fmt.Errorf("ip6tables: %w", err6))
		}
	}
	return stats, err
}

// apply programs the part of state of this firewall's family.
func (f *LinuxFirewall) apply(ctx context.Context, state FirewallState) (ApplyStats, error) {
	desired := renderIPTables(state, f.family, f.flowLog)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.origins = originsOf(desired.Chains)
	var stats ApplyStats
	var errs []error

	// 1. Sets first: new rules may reference them.
	sp, err := f.planSets(ctx, desired.Sets)
	if err != nil {
		return stats, err
	}
	if sp.script != "" {
		if _, err := f.exec(ctx, []byte(sp.script), "ipset", "-exist", "restore"); err != nil {
			errs = append(errs, fmt.Errorf("updating ipsets: %w", err))
			f.sets = nil
		} else {
			maps.Copy(f.sets, sp.want)
			stats.SetsCreated += sp.stats.SetsCreated
			stats.MembersAdded += sp.stats.MembersAdded
			stats.MembersRemoved += sp.stats.MembersRemoved
		}
	}

	// 2. Each table in one transaction.
	for _, table := range tablesOf(desired) {
		st, err := f.applyTable(ctx, table, desired)
		addStats(&stats, st)
		if err != nil {
			errs = append(errs, fmt.Errorf("table %s: %w", table, err))
		}
	}

	// 3. Sets no rule of ours references any more.
	for _, name := range sp.destroy {
		if _, err := f.exec(ctx, nil, "ipset", "destroy", name); err != nil {
			errs = append(errs, fmt.Errorf("%w: destroying ipset: %w", ErrStaleCleanup, err))
			f.sets = nil
			continue
		}
		if f.sets != nil {
			delete(f.sets, name)
		}
		stats.SetsDeleted++
	}
	return stats, errors.Join(errs...)
}

func (f *LinuxFirewall) planSets(ctx context.Context, desired []IPSet) (setPlan, error) {
	if f.sets == nil || f.stale(f.setsAt) {
		out, err := f.exec(ctx, nil, "ipset", "save")
		if err != nil {
			return setPlan{}, fmt.Errorf("reading ipsets: %w", err)
		}
		actual, err := parseIPSetSave(string(out))
		if err != nil {
			return setPlan{}, err
		}
		f.sets, f.setsAt = actual, time.Now()
		f.reads++
	}
	return planSets(desired, f.sets, f.family), nil
}

// stale reports whether a record read at t must be read again.
func (f *LinuxFirewall) stale(t time.Time) bool {
	return f.resync < 0 || time.Since(t) >= f.resync
}

// readTable returns the table's state: the record, or the kernel's when
// the record is missing or too old.
func (f *LinuxFirewall) readTable(ctx context.Context, table string) (tableState, error) {
	if c := f.tables[table]; c != nil && !f.stale(c.readAt) {
		return c.ts, nil
	}
	out, err := f.exec(ctx, nil, f.save, "-t", table)
	if err != nil {
		return tableState{}, fmt.Errorf("reading rules: %w", err)
	}
	ts, err := parseSave(string(out))
	if err != nil {
		return tableState{}, err
	}
	f.tables[table] = &cachedTable{ts: ts, readAt: time.Now()}
	f.reads++
	return ts, nil
}

// Reads returns how often Apply has read the kernel's tables and sets (of
// both families).
func (f *LinuxFirewall) Reads() int {
	f.mu.Lock()
	n := f.reads
	f.mu.Unlock()
	if f.six != nil {
		n += f.six.Reads()
	}
	return n
}

// applyTable reconciles one table: stale jumps out, changed chains
// rewritten and stale chains deleted in one restore, missing jumps in.
func (f *LinuxFirewall) applyTable(ctx context.Context, table string, desired IPTablesState) (ApplyStats, error) {
	var stats ApplyStats
	var chains []IPTChain
	for _, c := range desired.Chains {
		if c.Table == table {
			chains = append(chains, c)
		}
	}
	var jumps []policy.Jump
	for _, j := range desired.Jumps {
		if j.Table == table {
			jumps = append(jumps, j)
		}
	}
	ts, err := f.readTable(ctx, table)
	if err != nil {
		return stats, err
	}
	plan := planTable(table, chains, jumps, ts)
	// The record is updated with every change below and dropped after any
	// failure, so that the next Apply reads the kernel again.
	keep := true
	defer func() {
		if !keep {
			delete(f.tables, table)
		}
	}()
	var errs []error
	for _, r := range plan.staleJumps {
		err := f.inNetNS(func() error { return f.ipt.Delete(table, r.chain, r.args...) })
		if err != nil && !isNotExist(err) {
			errs = append(errs, fmt.Errorf("%w: deleting jump %s -> %s: %w", ErrStaleCleanup, r.chain, jumpTarget(r.args), err))
			keep = false
			continue
		}
		ts.forgetRule(r)
		stats.JumpsDeleted++
	}
	if !plan.emptyRestore() {
		if err := f.restoreChains(ctx, &plan, ts, &stats); err != nil {
			errs = append(errs, err)
			keep = false
		}
	}
	for _, j := range plan.missingJumps {
		err := f.inNetNS(func() error {
			ok, err := f.ipt.Exists(j.Table, j.From, "-j", j.To)
			if err != nil || ok {
				return err
			}
			return f.ipt.Insert(j.Table, j.From, 1, "-j", j.To)
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("inserting jump %s -> %s: %w", j.From, j.To, err))
			keep = false
			continue
		}
		ts.rules[j.From] = append([][]string{{"-j", j.To}}, ts.rules[j.From]...)
		ts.chains[j.From] = append([]string{""}, ts.chains[j.From]...)
		ts.builtin[j.From] = true
		stats.JumpsInserted++
	}
	for _, j := range plan.firstJumps {
		// The kernel is read again at the next Apply: the chain holds
		// rules of others that the record does not follow.
		keep = false
		var ins, del int
		err := f.inNetNS(func() (err error) { ins, del, err = f.putJumpFirst(j); return err })
		stats.JumpsInserted += ins
		stats.JumpsDeleted += del
		if err != nil {
			errs = append(errs, fmt.Errorf("putting jump %s -> %s first: %w", j.From, j.To, err))
		}
	}
	return stats, errors.Join(errs...)
}

// restoreChains writes the plan's changed chains and deletes its stale
// ones in one restore, and records the result in ts. When the deletions
// fail (something outside Tabby may still reference a stale chain), the
// desired chains are programmed without them and the failure reported.
func (f *LinuxFirewall) restoreChains(ctx context.Context, plan *tablePlan, ts tableState, stats *ApplyStats) error {
	var errs []error
	_, err := f.exec(ctx, []byte(plan.restoreInput(true)), f.restore, "--noflush", "-w", strconv.Itoa(f.wait))
	if err != nil && len(plan.delete) > 0 {
		errs = append(errs, fmt.Errorf("%w: restore with deletions of %v: %w", ErrStaleCleanup, plan.delete, err))
		plan.delete = nil
		if plan.emptyRestore() {
			err = nil
		} else {
			_, err = f.exec(ctx, []byte(plan.restoreInput(false)), f.restore, "--noflush", "-w", strconv.Itoa(f.wait))
		}
	}
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, c := range plan.write {
		ts.chains[c.Name] = ruleHashes(c)
		ts.rules[c.Name] = c.Rules
		stats.RulesWritten += len(c.Rules)
	}
	for _, name := range plan.delete {
		delete(ts.chains, name)
		delete(ts.rules, name)
	}
	stats.ChainsWritten += len(plan.write)
	stats.ChainsDeleted += len(plan.delete)
	return errors.Join(errs...)
}

// putJumpFirst makes j the first rule of its base chain and its only copy:
// a new copy goes on top before the others are deleted, so that traffic
// never passes the chain without it. Copies are deleted by number, last
// first, each checked just before (iptables has no transaction that spans
// the listing and the deletion; a rule another tool inserts in between
// shifts the numbers and the check stops the deletion until the next
// pass). Runs in the firewall's namespace.
func (f *LinuxFirewall) putJumpFirst(j policy.Jump) (inserted, deleted int, err error) {
	rules, err := f.ipt.List(j.Table, j.From)
	if err != nil {
		return 0, 0, err
	}
	nums := jumpRuleNumbers(rules, j.From, j.To)
	if len(nums) == 0 || nums[0] != 1 {
		if err := f.ipt.Insert(j.Table, j.From, 1, "-j", j.To); err != nil {
			return 0, 0, err
		}
		inserted = 1
		if rules, err = f.ipt.List(j.Table, j.From); err != nil {
			return inserted, 0, err
		}
		nums = jumpRuleNumbers(rules, j.From, j.To)
	}
	if len(nums) == 0 || nums[0] != 1 {
		return inserted, 0, errors.New("the jump is not first after inserting it (the chain is changing)")
	}
	for i := len(nums) - 1; i >= 1; i-- {
		rule, err := f.ipt.ListById(j.Table, j.From, nums[i])
		if err != nil {
			return inserted, deleted, err
		}
		if got := jumpRuleNumbers([]string{rule}, j.From, j.To); len(got) != 1 {
			return inserted, deleted, fmt.Errorf("rule %d changed under us (%q)", nums[i], rule)
		}
		if err := f.ipt.DeleteById(j.Table, j.From, nums[i]); err != nil {
			return inserted, deleted, err
		}
		deleted++
	}
	return inserted, deleted, nil
}

func isNotExist(err error) bool {
	var e *iptables.Error
	return errors.As(err, &e) && e.IsNotExist()
}

// Remove implements Firewall: everything Tabby owns goes, jumps first.
func (f *LinuxFirewall) Remove(ctx context.Context) error {
	_, err := f.Apply(ctx, FirewallState{})
	return err
}

// Save returns iptables-save output of a table in the firewall's namespace,
// for diagnostics and tests.
func (f *LinuxFirewall) Save(ctx context.Context, table string) (string, error) {
	out, err := f.exec(ctx, nil, f.save, "-t", table)
	return string(out), err
}

// Save6 returns ip6tables-save output of a table ("" without IPv6).
func (f *LinuxFirewall) Save6(ctx context.Context, table string) (string, error) {
	if f.six == nil {
		return "", nil
	}
	return f.six.Save(ctx, table)
}

// SaveSets returns `ipset save` output in the firewall's namespace.
func (f *LinuxFirewall) SaveSets(ctx context.Context) (string, error) {
	out, err := f.exec(ctx, nil, "ipset", "save")
	return string(out), err
}
