package agent

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strings"
)

// Interface is what address autodetection knows of a host interface.
type Interface struct {
	Name     string
	Up       bool
	Loopback bool
	Addrs    []netip.Prefix
}

// defaultSkip matches interfaces that never carry the node address: pod
// veths, container bridges and tunnels.
var defaultSkip = regexp.MustCompile(`^(lo|cali|tunl|vxlan|flannel|cni|docker|br-|virbr|veth|kube-ipvs|lxc|wg|nodelocaldns)`)

// AutodetectMethod is a parsed --ip-autodetection-method.
type AutodetectMethod struct {
	Kind    string // first-found, interface, skip-interface, can-reach, cidr
	Pattern *regexp.Regexp
	CIDR    netip.Prefix
	Target  netip.Addr
}

// ParseAutodetectMethod parses the Calico-style method string
// (IP_AUTODETECTION_METHOD: cidr and can-reach take IPv4).
func ParseAutodetectMethod(s string) (AutodetectMethod, error) { return parseAutodetect(s, false) }

// parseAutodetect parses a method whose cidr and can-reach values are of
// the family v6 says.
func parseAutodetect(s string, v6 bool) (AutodetectMethod, error) {
	fam := "IPv4"
	if v6 {
		fam = "IPv6"
	}
	if s == "" || s == "first-found" {
		return AutodetectMethod{Kind: "first-found"}, nil
	}
	kind, val, ok := strings.Cut(s, "=")
	if !ok || val == "" {
		return AutodetectMethod{}, fmt.Errorf("ip autodetection method %q: want first-found, interface=RE, skip-interface=RE, can-reach=ADDR or cidr=CIDR", s)
	}
	m := AutodetectMethod{Kind: kind}
	switch kind {
	case "interface", "skip-interface":
		re, err := regexp.Compile(val)
		if err != nil {
			return m, fmt.Errorf("ip autodetection method %q: %w", s, err)
		}
		m.Pattern = re
	case "cidr":
		p, err := netip.ParsePrefix(val)
		if err != nil || p.Addr().Is6() != v6 || p.Addr().Is4In6() {
			return m, fmt.Errorf("ip autodetection method %q: %q is not an %s CIDR", s, val, fam)
		}
		m.CIDR = p.Masked()
	case "can-reach":
		a, err := netip.ParseAddr(val)
		if err != nil || a.Is6() != v6 || a.Is4In6() {
			return m, fmt.Errorf("ip autodetection method %q: %q is not an %s address", s, val, fam)
		}
		m.Target = a
	default:
		return m, fmt.Errorf("ip autodetection method %q: unknown method %q", s, kind)
	}
	return m, nil
}

// String is the method as ParseAutodetectMethod reads it.
func (m AutodetectMethod) String() string {
	switch m.Kind {
	case "", "first-found":
		return "first-found"
	case "interface", "skip-interface":
		if m.Pattern != nil {
			return m.Kind + "=" + m.Pattern.String()
		}
	case "cidr":
		return m.Kind + "=" + m.CIDR.String()
	case "can-reach":
		return m.Kind + "=" + m.Target.String()
	}
	return m.Kind
}

// MarshalText implements encoding.TextMarshaler (flags print it).
func (m AutodetectMethod) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseAutodetectMethod.
func (m *AutodetectMethod) UnmarshalText(b []byte) error {
	p, err := ParseAutodetectMethod(string(b))
	if err != nil {
		return err
	}
	*m = p
	return nil
}

// AutodetectMethod6 is a parsed --ip6-autodetection-method (Calico's
// IP6_AUTODETECTION_METHOD): cidr and can-reach take IPv6.
type AutodetectMethod6 struct{ AutodetectMethod }

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *AutodetectMethod6) UnmarshalText(b []byte) error {
	p, err := parseAutodetect(string(b), true)
	if err != nil {
		return err
	}
	m.AutodetectMethod = p
	return nil
}

// SelectAddress picks the node's IPv4 address from ifaces. For can-reach,
// local is the source address the kernel chose towards the target.
func SelectAddress(ifaces []Interface, m AutodetectMethod, local netip.Addr) (netip.Prefix, string, error) {
	return selectAddress(ifaces, m, local, false)
}

// SelectAddress6 is SelectAddress for the node's IPv6 address (global
// unicast: link-local addresses are skipped).
func SelectAddress6(ifaces []Interface, m AutodetectMethod, local netip.Addr) (netip.Prefix, string, error) {
	return selectAddress(ifaces, m, local, true)
}

func selectAddress(ifaces []Interface, m AutodetectMethod, local netip.Addr, v6 bool) (netip.Prefix, string, error) {
	for _, ifc := range ifaces {
		if !ifc.Up || ifc.Loopback {
			continue
		}
		switch m.Kind {
		case "interface":
			if !m.Pattern.MatchString(ifc.Name) {
				continue
			}
		case "skip-interface":
			if m.Pattern.MatchString(ifc.Name) || defaultSkip.MatchString(ifc.Name) {
				continue
			}
		default:
			if defaultSkip.MatchString(ifc.Name) {
				continue
			}
		}
		for _, a := range ifc.Addrs {
			if a.Addr().Is6() != v6 || a.Addr().Is4In6() || !a.Addr().IsGlobalUnicast() {
				continue
			}
			switch m.Kind {
			case "cidr":
				if !m.CIDR.Contains(a.Addr()) {
					continue
				}
			case "can-reach":
				if a.Addr() != local {
					continue
				}
			}
			return a, ifc.Name, nil
		}
	}
	fam := "IPv4"
	if v6 {
		fam = "IPv6"
	}
	return netip.Prefix{}, "", fmt.Errorf("no %s address found by method %s on %d interfaces (loopback, down and cali/docker/bridge-like interfaces are skipped)", fam, m.Kind, len(ifaces))
}

// HostInterfaces lists this network namespace's interfaces.
func HostInterfaces() ([]Interface, error) {
	nifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	var out []Interface
	for _, n := range nifs {
		ifc := Interface{Name: n.Name, Up: n.Flags&net.FlagUp != 0, Loopback: n.Flags&net.FlagLoopback != 0}
		addrs, err := n.Addrs()
		if err != nil {
			return nil, fmt.Errorf("listing addresses of %s: %w", n.Name, err)
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if !ok {
				continue
			}
			ones, _ := ipn.Mask.Size()
			ifc.Addrs = append(ifc.Addrs, netip.PrefixFrom(ip.Unmap(), ones))
		}
		out = append(out, ifc)
	}
	return out, nil
}

// Autodetect finds the node's IPv4 address with the given method.
func Autodetect(m AutodetectMethod) (netip.Prefix, error) { return autodetect(m, false) }

// Autodetect6 finds the node's IPv6 address with the given method.
func Autodetect6(m AutodetectMethod) (netip.Prefix, error) { return autodetect(m, true) }

func autodetect(m AutodetectMethod, v6 bool) (netip.Prefix, error) {
	var local netip.Addr
	if m.Kind == "can-reach" {
		network := "udp4"
		if v6 {
			network = "udp6"
		}
		// A UDP "connection" sends nothing; it only asks the kernel for a route.
		c, err := net.Dial(network, netip.AddrPortFrom(m.Target, 9).String())
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("finding the route to %s: %w", m.Target, err)
		}
		local = c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
		if err := c.Close(); err != nil {
			return netip.Prefix{}, err
		}
	}
	ifaces, err := HostInterfaces()
	if err != nil {
		return netip.Prefix{}, err
	}
	p, _, err := selectAddress(ifaces, m, local, v6)
	return p, err
}
