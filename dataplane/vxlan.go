package dataplane

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// Names of Tabby's VXLAN devices, one per address family (Calico's
// vxlan.calico and vxlan-v6.calico shape).
const (
	VXLANDevice4 = "vxlan.tabby"
	VXLANDevice6 = "vxlan-v6.tabby"
)

// VXLAN encapsulation overhead: outer IPv4 (20) or IPv6 (40) header, UDP
// (8), VXLAN (8) and inner Ethernet (14).
const (
	VXLANOverhead4 = 50
	VXLANOverhead6 = 70
)

// VXLANDeviceName is the device of the family (IPv6 when is6).
func VXLANDeviceName(is6 bool) string {
	if is6 {
		return VXLANDevice6
	}
	return VXLANDevice4
}

// VXLANOverhead is the encapsulation overhead over an underlay of the
// family (IPv6 when is6).
func VXLANOverhead(is6 bool) int {
	if is6 {
		return VXLANOverhead6
	}
	return VXLANOverhead4
}

// ErrVXLANClash is returned (wrapped) when a VXLAN device Tabby would make
// cannot be: another device already uses its VNI and port, or a device of
// another type holds its name.
var ErrVXLANClash = errors.New("vxlan device clash")

// VXLANSpec is one VXLAN device as Tabby wants it. Its family is Local's.
type VXLANSpec struct {
	Name string
	VNI  uint32
	Port uint16
	// Local is the node's underlay address: the outer source address and
	// the family of the tunnel.
	Local netip.Addr
	// Underlay is the device the tunnel is bound to; "" means the device
	// that holds Local.
	Underlay string
	// MTU of the device; 0 means the underlay's minus VXLANOverhead.
	MTU int
	// MAC of the device; nil leaves the kernel's (random) one.
	MAC net.HardwareAddr
	// Addr is the tunnel address (given as /32 or /128); invalid means
	// none yet.
	Addr netip.Addr
}

// Validate reports every problem with the spec.
func (s VXLANSpec) Validate() error {
	var errs []error
	if err := validIfName(s.Name); err != nil {
		errs = append(errs, fmt.Errorf("name: %w", err))
	}
	if s.VNI == 0 || s.VNI >= 1<<24 {
		errs = append(errs, fmt.Errorf("vni %d: want 1 to %d", s.VNI, 1<<24-1))
	}
	if s.Port == 0 {
		errs = append(errs, errors.New("port: 0"))
	}
	if !s.Local.IsValid() || s.Local.Is4In6() || s.Local.Zone() != "" || s.Local.IsUnspecified() {
		errs = append(errs, fmt.Errorf("local address %v: want a plain IPv4 or IPv6 address", s.Local))
	}
	if s.Addr.IsValid() && s.Local.IsValid() && s.Addr.Is4() != s.Local.Is4() {
		errs = append(errs, fmt.Errorf("tunnel address %v is not of the local address's family", s.Addr))
	}
	if s.MAC != nil && (len(s.MAC) != 6 || s.MAC[0]&1 == 1) {
		errs = append(errs, fmt.Errorf("mac %v: want a unicast Ethernet address", s.MAC))
	}
	if s.MTU < 0 || (s.MTU > 0 && s.MTU < 1280 && s.Local.Is6()) || (s.MTU > 0 && s.MTU < 576) {
		errs = append(errs, fmt.Errorf("mtu %d too small", s.MTU))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("vxlan device %s: %w", s.Name, err)
	}
	return nil
}

// VXLANStatus is a VXLAN device as the kernel has it.
type VXLANStatus struct {
	Name  string
	MAC   net.HardwareAddr
	MTU   int
	VNI   uint32
	Port  uint16
	Local netip.Addr
	Addrs []netip.Addr
	// Created: this call made the device (it did not exist or had to be
	// made again).
	Created bool
}

// VXLANPeer is one remote node's tunnel end: its tunnel address answers
// to MAC (a static neighbour entry) and MAC is reached at Node (a static
// forwarding entry), so that the device never has to learn or miss.
type VXLANPeer struct {
	TunnelAddr netip.Addr
	MAC        net.HardwareAddr
	Node       netip.Addr
}

func (p VXLANPeer) String() string {
	return fmt.Sprintf("%v lladdr %v dst %v", p.TunnelAddr, p.MAC, p.Node)
}

// ComparePeers orders peers by tunnel address, then by their text.
func ComparePeers(a, b VXLANPeer) int {
	if c := a.TunnelAddr.Compare(b.TunnelAddr); c != 0 {
		return c
	}
	return strings.Compare(a.String(), b.String())
}

// SortPeers sorts peers in place and returns them.
func SortPeers(ps []VXLANPeer) []VXLANPeer { slices.SortFunc(ps, ComparePeers); return ps }

// VXLAN manages Tabby's VXLAN devices and their static neighbour and
// forwarding entries. Every method is idempotent; implementations are
// safe for concurrent use.
type VXLAN interface {
	// Ensure makes the device match spec: created if missing, re-created
	// if an attribute the kernel cannot change (VNI, port, local address,
	// underlay) differs, else updated in place (MTU, MAC, address, up).
	// Another device with spec's VNI and port, or a non-VXLAN device of
	// spec's name, fails with ErrVXLANClash and changes nothing; a device
	// this call created is removed again if a later step fails.
	Ensure(spec VXLANSpec) (VXLANStatus, error)
	// SetPeers makes the device's static neighbour and forwarding entries
	// exactly peers (of the device's family): missing ones are replaced
	// in, others deleted, every error reported.
	SetPeers(dev string, peers []VXLANPeer) error
	// Peers returns the device's entries as SetPeers programs them: each
	// neighbour entry with its MAC's forwarding destination, sorted.
	Peers(dev string) ([]VXLANPeer, error)
	// Remove deletes the device (and with it its entries and routes); a
	// missing device is success, a non-VXLAN device of that name is left
	// alone (ErrVXLANClash).
	Remove(dev string) error
	// Status returns the device as the kernel has it; ok is false when
	// it does not exist.
	Status(dev string) (VXLANStatus, bool, error)
}

// TunnelMAC is the MAC a node's VXLAN device of a family gets: derived
// from the node's name, so that it survives device re-creation and agent
// restarts (peers' entries stay right), locally administered and unicast.
func TunnelMAC(node string, is6 bool) net.HardwareAddr {
	fam := "4"
	if is6 {
		fam = "6"
	}
	h := sha256.Sum256([]byte("tabby-vxlan/" + fam + "/" + node))
	mac := net.HardwareAddr(h[:6:6])
	mac[0] = (mac[0] | 0x02) &^ 0x01
	return mac
}
