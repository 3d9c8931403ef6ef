package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tabbynet/tabby/api"
)

// HostIfRestorer puts back the settings of every workload host interface
// that something changed behind the agent's back. NetlinkWorkloads
// implements it; the agent calls it at every resync.
type HostIfRestorer interface {
	// RestoreHostIfSettings checks the settings of every cali… veth of
	// the node (hostIfSysctls and, where the node has IPv6,
	// hostIfHardening6) and writes those that differ. It returns one
	// line per setting it put back ("net.ipv6.conf.cali1.accept_ra was 1,
	// now 0"). An interface removed meanwhile is skipped; every other
	// failure is returned, joined, after the others were tried.
	RestoreHostIfSettings(ctx context.Context) (restored []string, err error)
}

var _ HostIfRestorer = (*NetlinkWorkloads)(nil)

// RestoreHostIfSettings implements HostIfRestorer.
func (w *NetlinkWorkloads) RestoreHostIfSettings(ctx context.Context) ([]string, error) {
	nsh, err := w.nodeNSDup()
	if err != nil {
		return nil, err
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return nil, fmt.Errorf("opening netlink handle in the node namespace: %w", err)
	}
	defer h.Close()
	links, err := retryDump(h.LinkList)
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var names []string
	for _, l := range links {
		if n := l.Attrs().Name; strings.HasPrefix(n, api.WorkloadIfacePrefix) && l.Type() == "veth" {
			names = append(names, n)
		}
	}
	var restored []string
	var errs []error
	err = withNetNS(nsh, func() error {
		for _, name := range names {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			settings := hostIfSysctls(name)
			if hasIPv6Conf(name) {
				settings = append(settings, hostIfHardening6(name)...)
			}
			for _, s := range settings {
				got, err := readSysctl(s.Path)
				if errors.Is(err, fs.ErrNotExist) {
					break // the interface went away
				}
				if err != nil {
					errs = append(errs, err)
					continue
				}
				if got == s.Value {
					continue
				}
				if err := writeSysctl(s.Path, s.Value); err != nil {
					if !errors.Is(err, fs.ErrNotExist) {
						errs = append(errs, err)
					}
					continue
				}
				restored = append(restored, fmt.Sprintf("%s was %s, now %s", strings.ReplaceAll(s.Path, "/", "."), got, s.Value))
			}
		}
		return nil
	})
	return restored, errors.Join(append(errs, err)...)
}

// checkHardening6 returns an error for each IPv6 hardening setting of the
// interface that differs in nsh, none where the node has no IPv6.
func checkHardening6(nsh netns.NsHandle, ifName string) error {
	has := false
	if err := withNetNS(nsh, func() error { has = hasIPv6Conf(ifName); return nil }); err != nil {
		return err
	}
	if !has {
		return nil
	}
	return checkSysctls(nsh, hostIfHardening6(ifName))
}
