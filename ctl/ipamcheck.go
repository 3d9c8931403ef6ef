package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/ipam"
)

// ErrProblems is returned (wrapped) by IPAMCheck when it found problems, so
// that the command exits non-zero.
var ErrProblems = errors.New("problems found")

// Report is the JSON form of an IPAM check, written by ipam check -o and
// read by ipam release --from-report.
type Report struct {
	Revision  int64     `json:"revision"`
	CheckedAt time.Time `json:"checkedAt"`
	// LeakGrace is the grace the check used; release --from-report checks
	// again with it.
	LeakGrace       api.Duration         `json:"leakGrace"`
	Checked         ReportCounts         `json:"checked"`
	Leaks           []ReportLeak         `json:"leaks"`
	OrphanHandles   []ReportOrphanHandle `json:"orphanHandles"`
	Inconsistencies []ReportInconsistent `json:"inconsistencies"`
}

// ReportCounts says how much the check looked at.
type ReportCounts struct {
	Blocks     int `json:"blocks"`
	Affinities int `json:"affinities"`
	Handles    int `json:"handles"`
	Endpoints  int `json:"endpoints"`
	Allocated  int `json:"allocated"`
}

// ReportLeak is an allocated address no workload endpoint uses.
type ReportLeak struct {
	Address     netip.Addr   `json:"address"`
	Block       netip.Prefix `json:"block"`
	Handle      string       `json:"handle"`
	Node        string       `json:"node,omitempty"`
	Namespace   string       `json:"namespace,omitempty"`
	Pod         string       `json:"pod,omitempty"`
	ContainerID string       `json:"containerID,omitempty"`
	Allocated   time.Time    `json:"allocated,omitzero"`
}

// ReportOrphanHandle is a handle record that disagrees with the blocks.
type ReportOrphanHandle struct {
	Handle  string     `json:"handle"`
	Address netip.Addr `json:"address,omitzero"`
	Reason  string     `json:"reason"`
}

// ReportInconsistent is any other problem.
type ReportInconsistent struct {
	Kind   string `json:"kind"`
	Key    string `json:"key"`
	Detail string `json:"detail"`
}

// Problems counts what is wrong.
func (r *Report) Problems() int { return len(r.Leaks) + len(r.OrphanHandles) + len(r.Inconsistencies) }

func newReport(r ipam.Report, at time.Time, grace time.Duration) Report {
	out := Report{
		Revision: r.Revision, CheckedAt: at.UTC(), LeakGrace: api.Duration{Duration: grace},
		Checked:         ReportCounts{r.Blocks, r.Affinities, r.Handles, r.Endpoints, r.Allocated},
		Leaks:           []ReportLeak{},
		OrphanHandles:   []ReportOrphanHandle{},
		Inconsistencies: []ReportInconsistent{},
	}
	for _, l := range r.Leaks {
		out.Leaks = append(out.Leaks, ReportLeak{l.Addr, l.Block, l.Handle, l.Node, l.Namespace, l.Pod, l.ContainerID, l.Allocated.UTC()})
	}
	for _, o := range r.OrphanHandles {
		out.OrphanHandles = append(out.OrphanHandles, ReportOrphanHandle{o.Handle, o.Addr, o.Reason})
	}
	for _, i := range r.Inconsistencies {
		out.Inconsistencies = append(out.Inconsistencies, ReportInconsistent{i.Kind, i.Key, i.Detail})
	}
	return out
}

// IPAMCheckOptions are the arguments of ipam check.
type IPAMCheckOptions struct {
	// Output is a file to write the JSON report to ("" = none).
	Output string
	// LeakGrace: allocations younger than this are not leaks yet (their
	// endpoint may be being written).
	LeakGrace time.Duration
}

// check runs IPAM's cross-check with the given grace.
func (c *Client) check(ctx context.Context, grace time.Duration) (Report, error) {
	r, err := ipam.New(c.Store, ipam.WithClock(c.Now), ipam.WithLeakGrace(grace)).Check(ctx)
	if err != nil {
		return Report{}, err
	}
	return newReport(r, c.Now(), grace), nil
}

// IPAMCheck cross-checks blocks, affinities, handles and workload endpoints,
// prints what is wrong and, with Output, writes the JSON report. It returns
// an error wrapping ErrProblems when anything is wrong.
func (c *Client) IPAMCheck(ctx context.Context, out io.Writer, o IPAMCheckOptions) error {
	r, err := c.check(ctx, o.LeakGrace)
	if err != nil {
		return err
	}
	var b strings.Builder
	n := r.Checked
	fmt.Fprintf(&b, "Checked %s, %s, %s, %s and %s (etcd revision %d).\n",
		plural(n.Blocks, "block", "blocks"), plural(n.Affinities, "affinity", "affinities"), plural(n.Handles, "handle", "handles"),
		plural(n.Endpoints, "workload endpoint", "workload endpoints"), plural(n.Allocated, "allocated address", "allocated addresses"), r.Revision)
	if len(r.Leaks) > 0 {
		fmt.Fprintf(&b, "\nLeaked addresses (allocated more than %s ago, no workload endpoint uses them):\n", o.LeakGrace)
		t := newTable("IP", "HANDLE", "NODE", "POD", "ALLOCATED")
		for _, l := range r.Leaks {
			pod := ""
			if l.Pod != "" {
				pod = l.Namespace + "/" + l.Pod
			}
			at := ""
			if !l.Allocated.IsZero() {
				at = l.Allocated.Format(time.RFC3339)
			}
			t.add(l.Address.String(), l.Handle, orNone(l.Node), orNone(pod), orNone(at))
		}
		t.writePlain(&b)
	}
	if len(r.OrphanHandles) > 0 {
		b.WriteString("\nHandle records that disagree with the blocks:\n")
		t := newTable("HANDLE", "IP", "PROBLEM")
		for _, h := range r.OrphanHandles {
			ip := "-"
			if h.Address.IsValid() {
				ip = h.Address.String()
			}
			t.add(h.Handle, ip, h.Reason)
		}
		t.writePlain(&b)
	}
	if len(r.Inconsistencies) > 0 {
		b.WriteString("\nInconsistencies:\n")
		t := newTable("KIND", "KEY", "DETAIL")
		for _, i := range r.Inconsistencies {
			t.add(i.Kind, i.Key, i.Detail)
		}
		t.writePlain(&b)
	}
	if r.Problems() == 0 {
		b.WriteString("No problems found.\n")
	}
	if o.Output != "" {
		data, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return fmt.Errorf("encoding report: %w", err)
		}
		if err := os.WriteFile(o.Output, append(data, '\n'), 0o644); err != nil {
			return fmt.Errorf("writing report: %w", err)
		}
		fmt.Fprintf(&b, "\nReport written to %s.\n", o.Output)
		if len(r.Leaks) > 0 {
			fmt.Fprintf(&b, "Release the leaked addresses with: tabbyctl ipam release --from-report %s\n", o.Output)
		}
	}
	if _, err := io.WriteString(out, b.String()); err != nil {
		return err
	}
	if p := r.Problems(); p > 0 {
		return &wrapped{msg: "ipam check found " + plural(p, "problem", "problems"), err: ErrProblems}
	}
	return nil
}

// IPAMReleaseOptions are the arguments of ipam release.
type IPAMReleaseOptions struct {
	IPs []string
	// Handle is the handle that must hold each address; the release is
	// refused for an address another handle holds (checked in the same
	// transaction). Required with IPs unless Force.
	Handle string
	// Force releases an address whoever holds it (without Handle), even
	// while a workload endpoint uses it.
	Force bool
	// FromReport is a report of ipam check -o.
	FromReport string
	// LeakGrace is the grace of the fresh check that --from-report compares
	// the report with; nil = the report's.
	LeakGrace *time.Duration
}

// IPAMRelease frees addresses: the ones named, or the leaks of a report
// that a fresh check still finds.
func (c *Client) IPAMRelease(ctx context.Context, out io.Writer, o IPAMReleaseOptions) error {
	switch {
	case (len(o.IPs) > 0) == (o.FromReport != ""):
		return errors.New("give either --ip or --from-report")
	case o.FromReport != "":
		return c.releaseFromReport(ctx, out, o)
	case o.Handle == "" && !o.Force:
		return errors.New("give --handle (the holder, as 'tabbyctl ipam show --ip' prints it), or --force to release whoever holds the address")
	}
	var addrs []netip.Addr
	for _, s := range o.IPs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("--ip %q: not an IP address", s)
		}
		addrs = append(addrs, a)
	}
	var errs []error
	for _, addr := range addrs {
		if err := c.releaseIP(ctx, out, addr, o.Handle, o.Force); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *Client) releaseIP(ctx context.Context, out io.Writer, addr netip.Addr, handle string, force bool) error {
	o, err := c.lookupIP(ctx, addr)
	if err != nil {
		return err
	}
	if o.alloc == nil {
		_, err := fmt.Fprintf(out, "%s is not allocated: nothing to release\n", addr)
		return err
	}
	if handle != "" && o.alloc.Handle != handle {
		return fmt.Errorf("%s is held by handle %s (node %s), not %s: not released", addr, o.alloc.Handle, orNone(o.alloc.Node), handle)
	}
	if len(o.endpoints) > 0 && !force {
		w := o.endpoints[0]
		return fmt.Errorf("%s is used by workload endpoint %s on %s: releasing it would let IPAM give it to another pod while this one still has it (use --force if the endpoint is stale)",
			addr, wepName(w), w.Spec.Node)
	}
	if handle != "" {
		err = c.IPAM.ReleaseAddrHeldBy(ctx, addr, handle)
	} else {
		err = c.IPAM.ReleaseAddr(ctx, addr)
	}
	if err != nil {
		return fmt.Errorf("releasing %s: %w", addr, err)
	}
	_, err = fmt.Fprintf(out, "released %s (handle %s, node %s)\n", addr, o.alloc.Handle, orNone(o.alloc.Node))
	return err
}

// releaseFromReport releases what the report calls leaked, but only what a
// fresh check still calls leaked under the same handle: between the report
// and now a pod may have got the address. Empty handle records are removed
// the same way. Other problems need a person.
func (c *Client) releaseFromReport(ctx context.Context, out io.Writer, o IPAMReleaseOptions) error {
	data, err := os.ReadFile(o.FromReport)
	if err != nil {
		return fmt.Errorf("reading report: %w", err)
	}
	var old Report
	if err := json.Unmarshal(data, &old); err != nil {
		return fmt.Errorf("report %s: %w", o.FromReport, err)
	}
	grace := old.LeakGrace.Duration
	if o.LeakGrace != nil {
		grace = *o.LeakGrace
	}
	now, err := c.check(ctx, grace)
	if err != nil {
		return err
	}
	stillLeaked := map[netip.Addr]string{}
	for _, l := range now.Leaks {
		stillLeaked[l.Address] = l.Handle
	}
	emptyHandles := map[string]bool{}
	for _, h := range now.OrphanHandles {
		if !h.Address.IsValid() {
			emptyHandles[h.Handle] = true
		}
	}
	var errs []error
	released := 0
	for _, l := range old.Leaks {
		h, ok := stillLeaked[l.Address]
		switch {
		case !ok:
			fmt.Fprintf(out, "skipped %s: a fresh check (leak grace %s) does not find it leaked\n", l.Address, grace)
			continue
		case h != l.Handle:
			fmt.Fprintf(out, "skipped %s: now held by handle %s, not %s\n", l.Address, h, l.Handle)
			continue
		}
		// Held by the same handle at the release, not only at the check.
		if err := c.IPAM.ReleaseAddrHeldBy(ctx, l.Address, l.Handle); err != nil {
			errs = append(errs, fmt.Errorf("releasing %s: %w", l.Address, err))
			continue
		}
		released++
		fmt.Fprintf(out, "released %s (handle %s)\n", l.Address, l.Handle)
	}
	for _, h := range old.OrphanHandles {
		if h.Address.IsValid() || !emptyHandles[h.Handle] {
			continue
		}
		if err := c.IPAM.ReleaseHandle(ctx, h.Handle); err != nil {
			errs = append(errs, fmt.Errorf("removing handle %s: %w", h.Handle, err))
			continue
		}
		fmt.Fprintf(out, "removed empty handle record %s\n", h.Handle)
	}
	if rest := len(old.Inconsistencies) + countAddressed(old.OrphanHandles); rest > 0 {
		fmt.Fprintf(out, "%s of the report not repaired automatically; see tabbyctl ipam check\n", plural(rest, "other problem", "other problems"))
	}
	fmt.Fprintf(out, "%s released\n", plural(released, "address", "addresses"))
	return errors.Join(errs...)
}

func countAddressed(hs []ReportOrphanHandle) int {
	n := 0
	for _, h := range hs {
		if h.Address.IsValid() {
			n++
		}
	}
	return n
}
