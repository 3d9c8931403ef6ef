package dataplane

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetlinkVXLAN implements VXLAN over netlink in one network namespace. It
// is safe for concurrent use.
type NetlinkVXLAN struct {
	mu sync.Mutex // serialises use of h's socket
	h  *netlink.Handle
}

var _ VXLAN = (*NetlinkVXLAN)(nil)

// NewVXLAN returns VXLAN acting in the network namespace at netnsPath
// ("" = the namespace of the calling thread). The caller must Close it.
func NewVXLAN(netnsPath string) (*NetlinkVXLAN, error) {
	nsh, err := openNetNS(netnsPath)
	if err != nil {
		return nil, err
	}
	defer nsh.Close()
	return newVXLANAt(nsh)
}

func newVXLANAt(nsh netns.NsHandle) (*NetlinkVXLAN, error) {
	h, err := newHandleAt(nsh)
	if err != nil {
		return nil, err
	}
	return &NetlinkVXLAN{h: h}, nil
}

// Close releases the netlink socket.
func (v *NetlinkVXLAN) Close() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.h != nil {
		v.h.Close()
		v.h = nil
	}
	return nil
}

// Ensure implements VXLAN.
func (v *NetlinkVXLAN) Ensure(spec VXLANSpec) (VXLANStatus, error) {
	if err := spec.Validate(); err != nil {
		return VXLANStatus{}, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.h == nil {
		return VXLANStatus{}, errClosed
	}
	under, err := v.underlay(spec)
	if err != nil {
		return VXLANStatus{}, fmt.Errorf("vxlan device %s: %w", spec.Name, err)
	}
	if spec.MTU == 0 {
		spec.MTU = under.Attrs().MTU - VXLANOverhead(spec.Local.Is6())
	}
	links, err := retryDump(v.h.LinkList)
	if err != nil {
		return VXLANStatus{}, fmt.Errorf("vxlan device %s: listing links: %w", spec.Name, err)
	}
	var have *netlink.Vxlan
	for _, l := range links {
		vx, isVX := l.(*netlink.Vxlan)
		if l.Attrs().Name == spec.Name {
			if !isVX {
				return VXLANStatus{}, fmt.Errorf("vxlan device %s: a %s device has the name: %w", spec.Name, l.Type(), ErrVXLANClash)
			}
			have = vx
			continue
		}
		if isVX && uint32(vx.VxlanId) == spec.VNI && vx.Port == int(spec.Port) && vxlanIs6(vx) == spec.Local.Is6() {
			return VXLANStatus{}, fmt.Errorf("vxlan device %s: device %s already uses VNI %d on port %d (%s): %w",
				spec.Name, vx.Name, spec.VNI, spec.Port, familyName(spec.Local.Is6()), ErrVXLANClash)
		}
	}
	created := false
	if have != nil && !vxlanMatches(have, spec, under.Attrs().Index) {
		if err := v.h.LinkDel(have); err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) {
			return VXLANStatus{}, fmt.Errorf("vxlan device %s: removing it to change VNI, port, local address or underlay: %w", spec.Name, err)
		}
		have = nil
	}
	if have == nil {
		vx := &netlink.Vxlan{
			LinkAttrs:    netlink.LinkAttrs{Name: spec.Name, MTU: spec.MTU, HardwareAddr: spec.MAC},
			VxlanId:      int(spec.VNI),
			VtepDevIndex: under.Attrs().Index,
			SrcAddr:      net.IP(spec.Local.AsSlice()),
			Port:         int(spec.Port),
			Learning:     false,
		}
		if err := v.h.LinkAdd(vx); err != nil {
			if errors.Is(err, unix.EEXIST) {
				err = fmt.Errorf("%w (the kernel says the VNI and port are in use): %w", ErrVXLANClash, err)
			}
			return VXLANStatus{}, fmt.Errorf("vxlan device %s: creating it (VNI %d, port %d, local %v): %w", spec.Name, spec.VNI, spec.Port, spec.Local, err)
		}
		created = true
	}
	st, err := v.configure(spec)
	if err != nil && created {
		// Nothing half-made: a device we made and could not finish goes.
		if l, lerr := v.h.LinkByName(spec.Name); lerr == nil {
			err = errors.Join(err, v.h.LinkDel(l))
		}
	}
	st.Created = created
	return st, err
}

// configure sets what the kernel lets change on a live device (MTU, MAC,
// the tunnel address, up) and reads its status back; v.mu is held.
func (v *NetlinkVXLAN) configure(spec VXLANSpec) (VXLANStatus, error) {
	l, err := v.h.LinkByName(spec.Name)
	if err != nil {
		return VXLANStatus{}, fmt.Errorf("vxlan device %s: %w", spec.Name, err)
	}
	if l.Attrs().MTU != spec.MTU {
		if err := v.h.LinkSetMTU(l, spec.MTU); err != nil {
			return VXLANStatus{}, fmt.Errorf("vxlan device %s: setting mtu %d: %w", spec.Name, spec.MTU, err)
		}
	}
	if spec.MAC != nil && !bytes.Equal(l.Attrs().HardwareAddr, spec.MAC) {
		if err := v.h.LinkSetHardwareAddr(l, spec.MAC); err != nil {
			return VXLANStatus{}, fmt.Errorf("vxlan device %s: setting mac %v: %w", spec.Name, spec.MAC, err)
		}
	}
	if spec.Local.Is6() {
		// No SLAAC or router solicitations on the tunnel; its link-local
		// address stays (the kernel uses it for nothing Tabby needs).
		_ = writeSysctl("/proc/sys/net/ipv6/conf/"+spec.Name+"/accept_ra", "0")
	}
	if err := v.syncAddr(l, spec); err != nil {
		return VXLANStatus{}, err
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := v.h.LinkSetUp(l); err != nil {
			return VXLANStatus{}, fmt.Errorf("vxlan device %s: setting it up: %w", spec.Name, err)
		}
	}
	st, ok, err := v.status(spec.Name)
	if err == nil && !ok {
		err = fmt.Errorf("vxlan device %s: gone while configuring it", spec.Name)
	}
	return st, err
}

// syncAddr makes the device's global addresses exactly spec.Addr (as a
// host prefix); v.mu is held.
func (v *NetlinkVXLAN) syncAddr(l netlink.Link, spec VXLANSpec) error {
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return v.h.AddrList(l, familyOf(spec.Local)) })
	if err != nil {
		return fmt.Errorf("vxlan device %s: listing addresses: %w", spec.Name, err)
	}
	has := false
	var stale []netlink.Addr
	for _, a := range addrs {
		ip, ok := addrOf(a.IP)
		if !ok || ip.IsLinkLocalUnicast() {
			continue
		}
		ones, _ := a.Mask.Size()
		if ip == spec.Addr && ones == ip.BitLen() {
			has = true
			continue
		}
		stale = append(stale, a)
	}
	if spec.Addr.IsValid() && !has {
		na := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(spec.Addr, spec.Addr.BitLen()))}
		if spec.Addr.Is6() {
			na.Flags = unix.IFA_F_NODAD
		}
		if err := v.h.AddrReplace(l, na); err != nil {
			return fmt.Errorf("vxlan device %s: adding tunnel address %v: %w", spec.Name, spec.Addr, err)
		}
	}
	var errs []error
	for _, a := range stale {
		if err := v.h.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			errs = append(errs, fmt.Errorf("vxlan device %s: removing old address %v: %w", spec.Name, a.IPNet, err))
		}
	}
	return errors.Join(errs...)
}

// underlay finds the device the tunnel is bound to; v.mu is held.
func (v *NetlinkVXLAN) underlay(spec VXLANSpec) (netlink.Link, error) {
	if spec.Underlay != "" {
		l, err := v.h.LinkByName(spec.Underlay)
		if err != nil {
			return nil, fmt.Errorf("underlay device %s: %w", spec.Underlay, err)
		}
		return l, nil
	}
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return v.h.AddrList(nil, familyOf(spec.Local)) })
	if err != nil {
		return nil, fmt.Errorf("listing addresses to find the underlay of %v: %w", spec.Local, err)
	}
	for _, a := range addrs {
		if ip, ok := addrOf(a.IP); ok && ip == spec.Local {
			l, err := v.h.LinkByIndex(a.LinkIndex)
			if err != nil {
				return nil, fmt.Errorf("underlay device %d: %w", a.LinkIndex, err)
			}
			return l, nil
		}
	}
	return nil, fmt.Errorf("no device holds the local address %v", spec.Local)
}

// vxlanIs6 reports whether a VXLAN device tunnels over IPv6.
func vxlanIs6(vx *netlink.Vxlan) bool {
	if a, ok := addrOf(vx.SrcAddr); ok {
		return a.Is6()
	}
	if a, ok := addrOf(vx.Group); ok {
		return a.Is6()
	}
	return false
}

// vxlanMatches reports whether the device has the attributes the kernel
// cannot change in place.
func vxlanMatches(vx *netlink.Vxlan, spec VXLANSpec, underIndex int) bool {
	src, _ := addrOf(vx.SrcAddr)
	return uint32(vx.VxlanId) == spec.VNI && vx.Port == int(spec.Port) && src == spec.Local &&
		vx.VtepDevIndex == underIndex && !vx.Learning
}

// Status implements VXLAN.
func (v *NetlinkVXLAN) Status(dev string) (VXLANStatus, bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.h == nil {
		return VXLANStatus{}, false, errClosed
	}
	return v.status(dev)
}

func (v *NetlinkVXLAN) status(dev string) (VXLANStatus, bool, error) {
	l, err := v.h.LinkByName(dev)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return VXLANStatus{}, false, nil
	}
	if err != nil {
		return VXLANStatus{}, false, fmt.Errorf("vxlan device %s: %w", dev, err)
	}
	vx, ok := l.(*netlink.Vxlan)
	if !ok {
		return VXLANStatus{}, false, fmt.Errorf("vxlan device %s: a %s device has the name: %w", dev, l.Type(), ErrVXLANClash)
	}
	st := VXLANStatus{Name: dev, MAC: slices.Clone(vx.HardwareAddr), MTU: vx.MTU, VNI: uint32(vx.VxlanId), Port: uint16(vx.Port)}
	st.Local, _ = addrOf(vx.SrcAddr)
	fam := netlink.FAMILY_V4
	if vxlanIs6(vx) {
		fam = netlink.FAMILY_V6
	}
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return v.h.AddrList(l, fam) })
	if err != nil {
		return st, true, fmt.Errorf("vxlan device %s: listing addresses: %w", dev, err)
	}
	for _, a := range addrs {
		if ip, ok := addrOf(a.IP); ok && !ip.IsLinkLocalUnicast() {
			st.Addrs = append(st.Addrs, ip)
		}
	}
	slices.SortFunc(st.Addrs, netip.Addr.Compare)
	return st, true, nil
}

// Remove implements VXLAN.
func (v *NetlinkVXLAN) Remove(dev string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.h == nil {
		return errClosed
	}
	l, err := v.h.LinkByName(dev)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("removing vxlan device %s: %w", dev, err)
	}
	if _, ok := l.(*netlink.Vxlan); !ok {
		return fmt.Errorf("removing vxlan device %s: a %s device has the name: %w", dev, l.Type(), ErrVXLANClash)
	}
	if err := v.h.LinkDel(l); err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) {
		return fmt.Errorf("removing vxlan device %s: %w", dev, err)
	}
	return nil
}

// vxlanLink looks up a VXLAN device and its family; v.mu is held.
func (v *NetlinkVXLAN) vxlanLink(dev string) (*netlink.Vxlan, int, error) {
	l, err := v.h.LinkByName(dev)
	if err != nil {
		if errors.As(err, new(netlink.LinkNotFoundError)) {
			return nil, 0, fmt.Errorf("vxlan device %s: %w", dev, ErrNoDevice)
		}
		return nil, 0, fmt.Errorf("vxlan device %s: %w", dev, err)
	}
	vx, ok := l.(*netlink.Vxlan)
	if !ok {
		return nil, 0, fmt.Errorf("vxlan device %s: a %s device has the name: %w", dev, l.Type(), ErrVXLANClash)
	}
	fam := netlink.FAMILY_V4
	if vxlanIs6(vx) {
		fam = netlink.FAMILY_V6
	}
	return vx, fam, nil
}

// SetPeers implements VXLAN: forwarding entries first (a neighbour entry
// never points at a MAC the device cannot send to), then neighbours, then
// the deletion of what is no longer wanted.
func (v *NetlinkVXLAN) SetPeers(dev string, peers []VXLANPeer) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.h == nil {
		return errClosed
	}
	vx, fam, err := v.vxlanLink(dev)
	if err != nil {
		return err
	}
	idx := vx.Attrs().Index
	var errs []error
	wantNeigh := map[netip.Addr]string{}
	wantFDB := map[string]netip.Addr{}
	for _, p := range peers {
		if !p.TunnelAddr.IsValid() || !p.Node.IsValid() || len(p.MAC) != 6 ||
			(p.TunnelAddr.Is6() != (fam == netlink.FAMILY_V6)) || (p.Node.Is6() != (fam == netlink.FAMILY_V6)) {
			errs = append(errs, fmt.Errorf("vxlan device %s: peer %v is not a valid peer of an %s tunnel", dev, p, familyName(fam == netlink.FAMILY_V6)))
			continue
		}
		wantFDB[p.MAC.String()] = p.Node
		wantNeigh[p.TunnelAddr] = p.MAC.String()
	}
	fdb, neighs, err := v.entries(dev, idx, fam)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	haveFDB := map[string]netip.Addr{}
	for _, n := range fdb {
		ip, _ := addrOf(n.IP)
		haveFDB[n.HardwareAddr.String()] = ip
	}
	haveNeigh := map[netip.Addr]string{}
	for _, n := range neighs {
		ip, _ := addrOf(n.IP)
		haveNeigh[ip] = n.HardwareAddr.String()
	}
	for _, mac := range sortedKeys(wantFDB) {
		if haveFDB[mac] == wantFDB[mac] {
			continue
		}
		hw, _ := net.ParseMAC(mac)
		n := &netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, State: netlink.NUD_PERMANENT,
			IP: net.IP(wantFDB[mac].AsSlice()), HardwareAddr: hw}
		if err := v.h.NeighSet(n); err != nil {
			errs = append(errs, fmt.Errorf("vxlan device %s: forwarding entry %s dst %v: %w", dev, mac, wantFDB[mac], err))
		}
	}
	for _, ip := range slices.SortedFunc(maps.Keys(wantNeigh), netip.Addr.Compare) {
		if haveNeigh[ip] == wantNeigh[ip] {
			continue
		}
		hw, _ := net.ParseMAC(wantNeigh[ip])
		n := &netlink.Neigh{LinkIndex: idx, Family: fam, State: netlink.NUD_PERMANENT, IP: net.IP(ip.AsSlice()), HardwareAddr: hw}
		if err := v.h.NeighSet(n); err != nil {
			errs = append(errs, fmt.Errorf("vxlan device %s: neighbour %v lladdr %s: %w", dev, ip, wantNeigh[ip], err))
		}
	}
	for _, n := range neighs {
		ip, _ := addrOf(n.IP)
		if _, want := wantNeigh[ip]; want {
			continue
		}
		if err := v.h.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("vxlan device %s: removing neighbour %v: %w", dev, ip, err))
		}
	}
	for _, n := range fdb {
		ip, _ := addrOf(n.IP)
		if dst, want := wantFDB[n.HardwareAddr.String()]; want && dst == ip {
			continue
		}
		n.Family, n.Flags = unix.AF_BRIDGE, netlink.NTF_SELF
		if err := v.h.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("vxlan device %s: removing forwarding entry %s dst %v: %w", dev, n.HardwareAddr, ip, err))
		}
	}
	return errors.Join(errs...)
}

// entries lists the device's forwarding entries with a destination and its
// permanent neighbour entries (the ones SetPeers programs; the kernel's own
// incomplete or failed ones are left alone); v.mu is held.
func (v *NetlinkVXLAN) entries(dev string, idx, fam int) (fdb, neighs []netlink.Neigh, _ error) {
	all, err := retryDump(func() ([]netlink.Neigh, error) { return v.h.NeighList(idx, unix.AF_BRIDGE) })
	if err != nil {
		return nil, nil, fmt.Errorf("vxlan device %s: listing forwarding entries: %w", dev, err)
	}
	for _, n := range all {
		if _, ok := addrOf(n.IP); ok && n.LinkIndex == idx {
			fdb = append(fdb, n)
		}
	}
	if all, err = retryDump(func() ([]netlink.Neigh, error) { return v.h.NeighList(idx, fam) }); err != nil {
		return nil, nil, fmt.Errorf("vxlan device %s: listing neighbours: %w", dev, err)
	}
	for _, n := range all {
		if _, ok := addrOf(n.IP); ok && n.LinkIndex == idx && n.State&netlink.NUD_PERMANENT != 0 {
			neighs = append(neighs, n)
		}
	}
	return fdb, neighs, nil
}

// Peers implements VXLAN.
func (v *NetlinkVXLAN) Peers(dev string) ([]VXLANPeer, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.h == nil {
		return nil, errClosed
	}
	vx, fam, err := v.vxlanLink(dev)
	if err != nil {
		return nil, err
	}
	fdb, neighs, err := v.entries(dev, vx.Attrs().Index, fam)
	if err != nil {
		return nil, err
	}
	dst := map[string]netip.Addr{}
	for _, n := range fdb {
		ip, _ := addrOf(n.IP)
		dst[n.HardwareAddr.String()] = ip
	}
	var out []VXLANPeer
	for _, n := range neighs {
		ip, _ := addrOf(n.IP)
		out = append(out, VXLANPeer{TunnelAddr: ip, MAC: slices.Clone(n.HardwareAddr), Node: dst[n.HardwareAddr.String()]})
	}
	return SortPeers(out), nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// familyName is "IPv4" or "IPv6".
func familyName(is6 bool) string {
	if is6 {
		return "IPv6"
	}
	return "IPv4"
}

// RemoveVXLANDevices deletes Tabby's VXLAN devices (VXLANDevice4,
// VXLANDevice6) in the namespace at netnsPath ("" = this thread's), for
// `tabby-agent cleanup`, and returns the names of those it removed. A
// device of another type with one of the names is left alone.
func RemoveVXLANDevices(netnsPath string) ([]string, error) {
	v, err := NewVXLAN(netnsPath)
	if err != nil {
		return nil, err
	}
	defer v.Close()
	var removed []string
	var errs []error
	for _, dev := range []string{VXLANDevice4, VXLANDevice6} {
		_, ok, err := v.Status(dev)
		if err != nil {
			if !errors.Is(err, ErrVXLANClash) {
				errs = append(errs, err)
			}
			continue
		}
		if !ok {
			continue
		}
		if err := v.Remove(dev); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, dev)
	}
	return removed, errors.Join(errs...)
}
