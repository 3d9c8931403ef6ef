package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netlinkTimeout bounds every netlink request so that a wedged kernel call
// cannot hang the agent.
const netlinkTimeout = 10 * time.Second

// dumpRetries is how often a netlink dump interrupted by concurrent changes
// is tried again.
const dumpRetries = 5

// openNetNS opens the network namespace at path; "" is the network
// namespace of the calling thread.
func openNetNS(path string) (netns.NsHandle, error) {
	if path == "" {
		h, err := netns.Get()
		if err != nil {
			return netns.None(), fmt.Errorf("opening current netns: %w", err)
		}
		return h, nil
	}
	if err := ns.IsNSorErr(path); err != nil {
		return netns.None(), fmt.Errorf("opening netns %s: %w", path, err)
	}
	h, err := netns.GetFromPath(path)
	if err != nil {
		return netns.None(), fmt.Errorf("opening netns %s: %w", path, err)
	}
	return h, nil
}

// netnsGone reports whether err says the netns path does not exist or is no
// longer a network namespace (its bind mount was removed).
func netnsGone(err error) bool {
	var notExist ns.NSPathNotExistErr
	var notNS ns.NSPathNotNSErr
	return errors.As(err, &notExist) || errors.As(err, &notNS) || errors.Is(err, os.ErrNotExist)
}

// newHandleAt returns a netlink handle whose sockets live in the namespace
// nsh, so that requests act there without moving any thread.
func newHandleAt(nsh netns.NsHandle) (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening netlink socket: %w", err)
	}
	if err := h.SetSocketTimeout(netlinkTimeout); err != nil {
		h.Close()
		return nil, fmt.Errorf("setting netlink socket timeout: %w", err)
	}
	return h, nil
}

// withNetNS runs fn on a locked OS thread inside the namespace nsh. The
// thread goes back to its own namespace afterwards; if that fails it stays
// locked so that the Go runtime discards it instead of reusing it.
func withNetNS(nsh netns.NsHandle, fn func() error) error {
	nsn, err := ns.GetNS(fmt.Sprintf("/proc/self/fd/%d", int(nsh)))
	if err != nil {
		return fmt.Errorf("opening netns handle: %w", err)
	}
	defer nsn.Close()
	return nsn.Do(func(ns.NetNS) error { return fn() })
}

// retryDump repeats a netlink dump that the kernel interrupted because the
// table changed under it.
func retryDump[T any](dump func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	for range dumpRetries {
		v, err = dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, err
}

func ipNet(p netip.Prefix) *net.IPNet {
	p = p.Masked()
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	a = a.Unmap()
	return netip.PrefixFrom(a, ones).Masked(), true
}

func addrOf(ip net.IP) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}
