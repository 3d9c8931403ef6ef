package api

import (
	"net"
	"net/netip"
	"slices"
)

// VXLANMode is IPPoolSpec.VXLANMode (Calico's names).
type VXLANMode string

// VXLAN modes of an IPPool. The empty mode is Never.
const (
	VXLANModeNever       VXLANMode = "Never"
	VXLANModeAlways      VXLANMode = "Always"
	VXLANModeCrossSubnet VXLANMode = "CrossSubnet"
)

// Encapsulated reports whether the mode tunnels at all (Always or
// CrossSubnet).
func (m VXLANMode) Encapsulated() bool {
	return m == VXLANModeAlways || m == VXLANModeCrossSubnet
}

// Defaults of BGPConfigurationSpec's VXLAN settings (Calico's).
const (
	DefaultVXLANVNI  uint32 = 4096
	DefaultVXLANPort uint16 = 4789
	// MaxVXLANVNI is the largest VNI: 24 bits.
	MaxVXLANVNI uint32 = 1<<24 - 1
)

// VXLANSettings returns the cluster's VXLAN VNI and port, the defaults
// where unset. A nil configuration means the defaults.
func (c *BGPConfiguration) VXLANSettings() (vni uint32, port uint16) {
	vni, port = DefaultVXLANVNI, DefaultVXLANPort
	if c == nil {
		return vni, port
	}
	if c.Spec.VXLANVNI != nil {
		vni = *c.Spec.VXLANVNI
	}
	if c.Spec.VXLANPort != nil {
		port = *c.Spec.VXLANPort
	}
	return vni, port
}

// VXLANTunnel returns the node's tunnel address and device MAC in one
// family (IPv6 when is6), if the node has recorded both and they parse.
func (n *Node) VXLANTunnel(is6 bool) (netip.Addr, net.HardwareAddr, bool) {
	addr, mac := n.Spec.IPv4VXLANTunnelAddr, n.Spec.VXLANTunnelMACAddr
	if is6 {
		addr, mac = n.Spec.IPv6VXLANTunnelAddr, n.Spec.VXLANTunnelMACAddrV6
	}
	a, err := netip.ParseAddr(addr)
	if err != nil || a.Is6() != is6 || a.Zone() != "" || a.Is4In6() {
		return netip.Addr{}, nil, false
	}
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return netip.Addr{}, nil, false
	}
	return a, hw, true
}

// nodeVXLAN validates the node's tunnel fields.
func (v *validator) nodeVXLAN(s *NodeSpec) {
	for _, f := range []struct {
		path, addr, macPath, mac string
		is6                      bool
	}{
		{"spec.ipv4VXLANTunnelAddr", s.IPv4VXLANTunnelAddr, "spec.vxlanTunnelMACAddr", s.VXLANTunnelMACAddr, false},
		{"spec.ipv6VXLANTunnelAddr", s.IPv6VXLANTunnelAddr, "spec.vxlanTunnelMACAddrV6", s.VXLANTunnelMACAddrV6, true},
	} {
		if f.addr != "" {
			a, err := netip.ParseAddr(f.addr)
			switch {
			case err != nil:
				v.add(f.path, "%q is not an IP address", f.addr)
			case a.Is6() != f.is6 || a.Is4In6():
				v.add(f.path, "%q is not an %s address", f.addr, familyName(f.is6))
			case a.Zone() != "" || a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast():
				v.add(f.path, "%q cannot be a tunnel address (unspecified, loopback, multicast or link-local)", f.addr)
			}
		}
		if f.mac != "" {
			if hw, err := net.ParseMAC(f.mac); err != nil || len(hw) != 6 || hw[0]&1 == 1 {
				v.add(f.macPath, "%q is not a unicast Ethernet MAC address like \"66:a0:1b:2c:3d:4e\"", f.mac)
			}
		}
	}
}

// poolVXLAN validates the pool's vxlanMode against its other fields.
func (v *validator) poolVXLAN(s *IPPoolSpec) {
	if s.VXLANMode != "" && s.VXLANMode != VXLANModeNever && slices.Contains(s.AllowedUses, UseLoadBalancer) {
		// A LoadBalancer pool's addresses live on no node: nothing to
		// encapsulate towards.
		v.add("spec.vxlanMode", "%s does not apply to a LoadBalancer pool (allowedUses %v); leave it unset or Never", s.VXLANMode, s.AllowedUses)
		return
	}
	switch s.VXLANMode {
	case "", VXLANModeNever, VXLANModeAlways:
	case VXLANModeCrossSubnet:
		// CrossSubnet routes the pool natively between nodes of one
		// subnet, over the routes BGP carries between them; a pool kept
		// out of BGP would have no route there at all.
		if s.DisableBGPExport {
			v.add("spec.vxlanMode", "CrossSubnet routes same-subnet traffic natively over BGP, which disableBGPExport turns off for this pool; use Always, or export the pool")
		}
	default:
		v.add("spec.vxlanMode", "%q must be %s, %s or %s", s.VXLANMode, VXLANModeNever, VXLANModeAlways, VXLANModeCrossSubnet)
	}
}

// vxlanSettings validates BGPConfiguration's VXLAN VNI and port.
func (v *validator) vxlanSettings(s *BGPConfigurationSpec) {
	if s.VXLANVNI != nil && (*s.VXLANVNI == 0 || *s.VXLANVNI > MaxVXLANVNI) {
		v.add("spec.vxlanVNI", "%d must be between 1 and %d (24 bits)", *s.VXLANVNI, MaxVXLANVNI)
	}
	if s.VXLANPort != nil && *s.VXLANPort == 0 {
		v.add("spec.vxlanPort", "must be between 1 and 65535")
	}
	if s.VXLANPort != nil && s.ListenPort != nil && *s.VXLANPort == *s.ListenPort {
		// Different protocols, but one number for two jobs is a typo.
		v.add("spec.vxlanPort", "%d is the BGP listenPort", *s.VXLANPort)
	}
}

// TunnelStatus is one family's VXLAN tunnel of an agent, as its last pass
// left it.
type TunnelStatus struct {
	Device string `json:"device"`
	// Mode is "off", or the encapsulating pools' modes ("Always",
	// "Always,CrossSubnet").
	Mode  string     `json:"mode"`
	Pools []string   `json:"pools,omitempty"`
	Addr  netip.Addr `json:"addr,omitzero"`
	MAC   string     `json:"mac,omitempty"`
	MTU   int        `json:"mtu,omitempty"`
	VNI   uint32     `json:"vni,omitempty"`
	Port  uint16     `json:"port,omitempty"`
	// Peers counts the other nodes' tunnel ends programmed; Routes the
	// destinations routed through the tunnel, listed in Paths.
	Peers  int          `json:"peers"`
	Routes int          `json:"routes"`
	Paths  []TunnelPath `json:"paths,omitempty"`
	// Native are remote nodes whose encapsulated blocks are routed
	// natively because they have no tunnel yet; Direct are same-subnet
	// nodes CrossSubnet routes natively.
	Native []string `json:"native,omitempty"`
	Direct []string `json:"direct,omitempty"`
	// Error is the last pass's problem with this family's tunnel. (No
	// timestamp: the status record is written only when it changes.)
	Error string `json:"error,omitempty"`
}

// TunnelPath is one destination a tunnel carries, and the remote tunnel
// address it goes via.
type TunnelPath struct {
	Dst  netip.Prefix `json:"dst"`
	Via  netip.Addr   `json:"via"`
	Node string       `json:"node,omitempty"`
}
