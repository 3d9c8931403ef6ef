package ctl

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/ipam"
)

// IPAMShowOptions are the arguments of ipam show.
type IPAMShowOptions struct {
	ShowBlocks   bool
	ShowBorrowed bool
	// IP, when set, asks who holds that address instead.
	IP string
}

// IPAMShow prints per-pool usage, optionally per block and the borrowed
// addresses, or who holds one address.
func (c *Client) IPAMShow(ctx context.Context, out io.Writer, o IPAMShowOptions) error {
	if o.IP != "" {
		addr, err := netip.ParseAddr(o.IP)
		if err != nil {
			return fmt.Errorf("--ip %q: not an IP address", o.IP)
		}
		return c.showIP(ctx, out, addr)
	}
	usage, err := c.IPAM.Usage(ctx)
	if err != nil {
		return err
	}
	if len(usage) == 0 {
		_, err := fmt.Fprintln(out, "No IP pools. Create one with tabbyctl apply -f pool.yaml.")
		return err
	}
	var t *table
	if o.ShowBlocks {
		t = newTable("GROUPING", "CIDR", "AFFINITY", "IPS TOTAL", "IPS IN USE", "IPS FREE", "BORROWED")
	} else {
		t = newTable("IP POOL", "CIDR", "BLOCKS", "IPS TOTAL", "IPS IN USE", "IPS FREE")
	}
	for _, p := range usage {
		name, cidr := p.Name, p.CIDR.String()
		switch {
		case name == "":
			name, cidr = "(blocks outside every pool)", ""
		case p.Disabled:
			name += " (disabled)"
		}
		blocks := strconv.Itoa(len(p.Blocks))
		if p.LoadBalancer {
			name += " (LoadBalancer)"
			blocks = "-"
		}
		total, free := strconv.Itoa(p.Total), percent(p.Free, p.Total)
		if p.SizeBits >= 62 {
			// An IPv6 pool: 2^SizeBits addresses, counted as 2^62.
			total, free = fmt.Sprintf("2^%d", p.SizeBits), fmt.Sprintf("≈2^%d (%s)", p.SizeBits, percentOnly(p.Free, p.Total))
		}
		if !o.ShowBlocks {
			t.add(name, cidr, blocks, total, percent(p.InUse, p.Total), free)
			continue
		}
		t.add("IP Pool "+name, cidr, "", total, percent(p.InUse, p.Total), free, strconv.Itoa(p.Borrowed))
		for _, b := range p.Blocks {
			t.add("  Block", b.CIDR.String(), orNone(b.Affinity), strconv.Itoa(b.Total), percent(b.InUse, b.Total), percent(b.Free, b.Total), strconv.Itoa(b.Borrowed))
		}
	}
	if err := t.writeBoxed(out); err != nil {
		return err
	}
	if err := showLoadBalancer(out, usage); err != nil {
		return err
	}
	if o.ShowBorrowed {
		return c.showBorrowed(ctx, out)
	}
	return nil
}

// showLoadBalancer lists which Service holds which address of the
// LoadBalancer pools, when there are such pools.
func showLoadBalancer(out io.Writer, usage []ipam.PoolUsage) error {
	t := newTable("IP", "SERVICE", "POOL")
	lbPools := 0
	for _, p := range usage {
		if !p.LoadBalancer {
			continue
		}
		lbPools++
		for _, x := range p.Services {
			t.add(x.Addr.String(), x.Service.String(), p.Name)
		}
	}
	if lbPools == 0 {
		return nil
	}
	if _, err := fmt.Fprintln(out, "\nLoadBalancer addresses (tabby-kube-controllers gives them to type LoadBalancer Services):"); err != nil {
		return err
	}
	if len(t.rows) == 0 {
		_, err := fmt.Fprintln(out, "none")
		return err
	}
	return t.writeBoxed(out)
}

// percent is "12 (5%)" (rounded to the nearest percent).
func percent(n, total int) string {
	if total == 0 {
		return strconv.Itoa(n)
	}
	return fmt.Sprintf("%d (%s)", n, percentOnly(n, total))
}

// percentOnly is "5%": n of total, rounded, in floating point (an IPv6
// pool's counts overflow n*100).
func percentOnly(n, total int) string {
	return fmt.Sprintf("%d%%", int(math.Round(float64(n)*100/float64(total))))
}

func (c *Client) showBorrowed(ctx context.Context, out io.Writer) error {
	all, err := c.IPAM.Allocations(ctx)
	if err != nil {
		return err
	}
	borrowed := slices.DeleteFunc(all, func(a ipam.Allocation) bool { return !a.IsBorrowed() })
	if _, err := fmt.Fprintln(out, "\nBorrowed addresses (used by a node other than the block's):"); err != nil {
		return err
	}
	if len(borrowed) == 0 {
		_, err := fmt.Fprintln(out, "none")
		return err
	}
	t := newTable("IP", "BORROWING NODE", "BLOCK", "BLOCK OWNER", "WORKLOAD", "HANDLE")
	for _, b := range borrowed {
		t.add(b.Addr.String(), b.Node, b.Block.String(), orNone(b.BlockNode), orNone(podOf(b)), orNone(b.Handle))
	}
	return t.writeBoxed(out)
}

// ipOwner is everything known about one address.
type ipOwner struct {
	addr      netip.Addr
	pool      *ipam.PoolUsage
	block     *ipam.BlockUsage
	alloc     *ipam.Allocation
	endpoints []*api.WorkloadEndpoint
}

func (c *Client) lookupIP(ctx context.Context, addr netip.Addr) (ipOwner, error) {
	o := ipOwner{addr: addr}
	usage, err := c.IPAM.Usage(ctx)
	if err != nil {
		return o, err
	}
	for i := range usage {
		p := &usage[i]
		if p.Name != "" && p.CIDR.Contains(addr) {
			o.pool = p
		}
		for j := range p.Blocks {
			if p.Blocks[j].CIDR.Contains(addr) {
				o.block = &p.Blocks[j]
			}
		}
	}
	a, ok, err := c.IPAM.Lookup(ctx, addr)
	if err != nil {
		return o, err
	}
	if ok {
		o.alloc = &a
	}
	byAddr, err := c.endpointsByAddr(ctx)
	if err != nil {
		return o, err
	}
	o.endpoints = byAddr[addr]
	return o, nil
}

func (c *Client) showIP(ctx context.Context, out io.Writer, addr netip.Addr) error {
	o, err := c.lookupIP(ctx, addr)
	if err != nil {
		return err
	}
	var b strings.Builder
	line := func(k, format string, args ...any) { fmt.Fprintf(&b, "  %-10s %s\n", k, fmt.Sprintf(format, args...)) }
	if o.pool != nil && o.pool.LoadBalancer {
		i := slices.IndexFunc(o.pool.Services, func(x ipam.LBAllocation) bool { return x.Addr == addr })
		if i >= 0 {
			fmt.Fprintf(&b, "%s is assigned to Service %s\n", addr, o.pool.Services[i].Service)
		} else {
			fmt.Fprintf(&b, "%s is not assigned\n", addr)
		}
		line("pool", "%s (%s), a LoadBalancer pool: its addresses go to Services, not pods", o.pool.Name, o.pool.CIDR)
		_, err = io.WriteString(out, b.String())
		return err
	}
	if o.alloc != nil {
		fmt.Fprintf(&b, "%s is allocated\n", addr)
	} else {
		fmt.Fprintf(&b, "%s is not allocated\n", addr)
	}
	if o.pool != nil {
		line("pool", "%s (%s)", o.pool.Name, o.pool.CIDR)
	} else {
		line("pool", "none: no IP pool holds %s", addr)
	}
	if o.block != nil {
		line("block", "%s, %s", o.block.CIDR, affinityText(o.block.Affinity))
	} else if o.pool != nil {
		line("block", "none yet: no node has claimed the block of %s", addr)
	}
	if a := o.alloc; a != nil {
		line("handle", "%s", a.Handle)
		line("node", "%s", orNone(a.Node))
		if a.IsBorrowed() {
			line("borrowed", "yes: %s uses it from a block affine to %s", a.Node, orNone(a.BlockNode))
		} else {
			line("borrowed", "no")
		}
		if a.Pod != "" {
			line("pod", "%s", podOf(*a))
		}
		if a.ContainerID != "" {
			line("container", "%s", a.ContainerID)
		}
		if !a.Time.IsZero() {
			line("allocated", "%s", a.Time.UTC().Format(time.RFC3339))
		}
	}
	for _, w := range o.endpoints {
		line("endpoint", "%s on %s (interface %s, handle %s)", wepName(w), w.Spec.Node, orNone(w.Spec.InterfaceName), orNone(w.Spec.IPAMHandle))
	}
	switch {
	case o.alloc != nil && len(o.endpoints) == 0:
		b.WriteString("No workload endpoint uses it: if no pod is being set up with it right now, it has leaked (see tabbyctl ipam check).\n")
	case o.alloc == nil && len(o.endpoints) > 0:
		b.WriteString("Warning: a workload endpoint uses it but IPAM has not allocated it; IPAM may hand it to another pod.\n")
	case o.alloc != nil:
		for _, w := range o.endpoints {
			if w.Spec.IPAMHandle != "" && w.Spec.IPAMHandle != o.alloc.Handle {
				fmt.Fprintf(&b, "Warning: endpoint %s names handle %s, but the address is allocated to %s.\n", wepName(w), w.Spec.IPAMHandle, o.alloc.Handle)
			}
		}
	}
	_, err = io.WriteString(out, b.String())
	return err
}

func affinityText(node string) string {
	if node == "" {
		return "affine to no node"
	}
	return "affine to " + node
}
