package dataplane

import "time"

// SetHostIfOverNetlink sets a host interface's settings (hostIfSysctls)
// in the namespace at nsPath the way Setup does, without the /proc/sys
// fallback, so that a test sees the netlink path work.
func SetHostIfOverNetlink(nsPath string, ifindex int) error {
	nsh, err := openNetNS(nsPath)
	if err != nil {
		return err
	}
	defer nsh.Close()
	d, err := newDevconfSocket(nsh)
	if err != nil {
		return err
	}
	defer d.close()
	return d.setHostIf(ifindex)
}

// HardenIPv6 writes a host interface's IPv6 hardening (hostIfHardening6)
// in the namespace at nsPath as ADD does on a new pair, for benchmarks.
func HardenIPv6(nsPath, ifName string) error {
	nsh, err := openNetNS(nsPath)
	if err != nil {
		return err
	}
	defer nsh.Close()
	return hardenIPv6(nsh, ifName, false)
}

// CheckNFLOGTarget is checkNFLOGTarget: whether the iptables command at
// path knows the NFLOG target.
var CheckNFLOGTarget = checkNFLOGTarget

// SetNFTClock makes f's resync bound (the longest it trusts its record
// without a full read) run on now instead of the wall clock.
func SetNFTClock(f *NFTFirewall, now func() time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = now
}

// SetNFTGenFault makes f's ruleset generation requests fail with err; nil
// lets them read the kernel again.
func SetNFTGenFault(f *NFTFirewall, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen.fault = err
}
