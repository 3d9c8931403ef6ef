package dataplane

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netns"
)

// A sysctl is one /proc/sys setting, named by its path below /proc/sys
// ("net/ipv4/conf/cali1/proxy_arp"), so that interface names with dots
// need no escaping.
type sysctl struct {
	Path  string
	Value string
}

// hostIfSysctls are the IPv4 settings of a workload's host interface,
// whatever the workload's families: answer ARP for 169.254.1.1 (proxy ARP)
// at once, route the workload's traffic, drop what arrives from an address
// whose route back is not this interface (strict reverse-path filtering, a
// second anti-spoofing check beside the firewall's, which works even with
// policy off), and neither take redirects from the workload nor send it
// any (docs/agent.md, "Workload interfaces").
func hostIfSysctls(ifName string) []sysctl {
	return []sysctl{
		{"net/ipv4/conf/" + ifName + "/proxy_arp", "1"},
		{"net/ipv4/neigh/" + ifName + "/proxy_delay", "0"},
		{"net/ipv4/conf/" + ifName + "/forwarding", "1"},
		{"net/ipv4/conf/" + ifName + "/rp_filter", "1"},
		{"net/ipv4/conf/" + ifName + "/accept_redirects", "0"},
		{"net/ipv4/conf/" + ifName + "/send_redirects", "0"},
	}
}

// hostIfHardening6 are the IPv6 settings of every workload's host
// interface, of an IPv4-only workload too (the kernel gives the interface
// IPv6 and a link-local address anyway): no router advertisements, no
// address autoconfiguration, no redirects taken from the workload. They
// apply where the node has IPv6 (hasIPv6Conf).
func hostIfHardening6(ifName string) []sysctl {
	return []sysctl{
		{"net/ipv6/conf/" + ifName + "/accept_ra", "0"},
		{"net/ipv6/conf/" + ifName + "/autoconf", "0"},
		{"net/ipv6/conf/" + ifName + "/accept_redirects", "0"},
	}
}

// hostIfSysctls6 are the further IPv6 settings of a dual-stack or IPv6
// workload's host interface: no duplicate address detection (its
// link-local address, the workload's gateway, is usable at once) and
// forwarding.
func hostIfSysctls6(ifName string) []sysctl {
	return []sysctl{
		{"net/ipv6/conf/" + ifName + "/accept_dad", "0"},
		{"net/ipv6/conf/" + ifName + "/forwarding", "1"},
	}
}

// hasIPv6Conf reports whether the interface has IPv6 settings: not on a
// node booted with IPv6 disabled (ipv6.disable=1). Call it inside the
// namespace.
func hasIPv6Conf(ifName string) bool {
	_, err := os.Stat(filepath.Join("/proc/sys/net/ipv6/conf", ifName))
	return err == nil
}

// hardenIPv6 writes hostIfHardening6 in nsh where the interface has IPv6;
// with compare, only the settings that differ.
func hardenIPv6(nsh netns.NsHandle, ifName string, compare bool) error {
	return withNetNS(nsh, func() error {
		if !hasIPv6Conf(ifName) {
			return nil
		}
		return writeSysctls(hostIfHardening6(ifName), compare)
	})
}

// nodeSysctls6 are the node-wide IPv6 settings, ensured when the first
// IPv6 workload is wired (forwarding turns off router advertisements on a
// host that takes them, so a node without IPv6 pods is left alone).
var nodeSysctls6 = []sysctl{{"net/ipv6/conf/all/forwarding", "1"}}

// nodeSysctls are the node-wide settings the agent ensures.
var nodeSysctls = []sysctl{{"net/ipv4/ip_forward", "1"}}

// EnsureNodeSysctls sets the node-wide sysctls (net.ipv4.ip_forward=1) in
// the network namespace at netnsPath ("" = the calling thread's). It writes
// only values that differ.
func EnsureNodeSysctls(netnsPath string) error {
	nsh, err := openNetNS(netnsPath)
	if err != nil {
		return err
	}
	defer nsh.Close()
	return ensureSysctls(nsh, nodeSysctls)
}

// ensureSysctls writes each setting that differs, inside the namespace nsh.
// /proc/sys/net shows the namespace of the thread that opens it, so the
// files are opened on a thread moved into nsh.
func ensureSysctls(nsh netns.NsHandle, settings []sysctl) error {
	return setSysctls(nsh, settings, true)
}

// setSysctls writes the settings inside the namespace nsh; with compare,
// only those that differ (a new interface's are all still the defaults,
// so reading them first is wasted).
func setSysctls(nsh netns.NsHandle, settings []sysctl, compare bool) error {
	return withNetNS(nsh, func() error { return writeSysctls(settings, compare) })
}

// writeSysctls writes the settings in the calling thread's namespace.
func writeSysctls(settings []sysctl, compare bool) error {
	var errs []error
	for _, s := range settings {
		if compare {
			if got, err := readSysctl(s.Path); err == nil && got == s.Value {
				continue
			}
		}
		if err := writeSysctl(s.Path, s.Value); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkSysctls returns an error for each setting that differs in nsh.
func checkSysctls(nsh netns.NsHandle, settings []sysctl) error {
	var errs []error
	err := withNetNS(nsh, func() error {
		for _, s := range settings {
			got, err := readSysctl(s.Path)
			switch {
			case err != nil:
				errs = append(errs, err)
			case got != s.Value:
				errs = append(errs, fmt.Errorf("sysctl %s is %s, want %s", strings.ReplaceAll(s.Path, "/", "."), got, s.Value))
			}
		}
		return nil
	})
	return errors.Join(append(errs, err)...)
}

func readSysctl(path string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", path))
	if err != nil {
		return "", fmt.Errorf("reading sysctl %s: %w", strings.ReplaceAll(path, "/", "."), err)
	}
	return strings.TrimSpace(string(b)), nil
}

func writeSysctl(path, value string) error {
	if err := os.WriteFile(filepath.Join("/proc/sys", path), []byte(value), 0o644); err != nil {
		return fmt.Errorf("setting sysctl %s=%s: %w", strings.ReplaceAll(path, "/", "."), value, err)
	}
	return nil
}
