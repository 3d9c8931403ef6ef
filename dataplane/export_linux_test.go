package dataplane

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
