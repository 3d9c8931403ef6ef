package dataplane

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The host interface's settings (hostIfSysctls) over netlink, on a socket
// opened once in the node namespace: writing them through /proc/sys needs
// a thread moved into the namespace and back, and six file operations, for
// each new workload (about a third of Setup's time). The kernel stores the
// same values either way: RTM_SETLINK's IFLA_INET_CONF for
// net.ipv4.conf.<if>.{forwarding,proxy_arp,rp_filter}, RTM_SETNEIGHTBL for
// net.ipv4.neigh.<if>.proxy_delay.

// From linux/ip.h and linux/neighbour.h (not in x/sys/unix).
const (
	ipv4DevconfForwarding      = 1 // IPV4_DEVCONF_FORWARDING
	ipv4DevconfProxyARP        = 3 // IPV4_DEVCONF_PROXY_ARP
	ipv4DevconfAcceptRedirects = 4 // IPV4_DEVCONF_ACCEPT_REDIRECTS
	ipv4DevconfSendRedirects   = 6 // IPV4_DEVCONF_SEND_REDIRECTS
	ipv4DevconfRPFilter        = 8 // IPV4_DEVCONF_RP_FILTER
	ndtaName                   = 1 // NDTA_NAME
	ndtaParms                  = 6 // NDTA_PARMS
	ndtpaIfindex               = 1 // NDTPA_IFINDEX
	ndtpaProxyDelay            = 13
)

// devconfSocket sends the requests; it is safe for concurrent use (the
// socket is locked per request).
type devconfSocket struct {
	sh *nl.SocketHandle
}

func newDevconfSocket(nsh netns.NsHandle) (*devconfSocket, error) {
	s, err := nl.GetNetlinkSocketAt(nsh, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening netlink socket: %w", err)
	}
	tv := unix.NsecToTimeval(netlinkTimeout.Nanoseconds())
	if err := errors.Join(s.SetSendTimeout(&tv), s.SetReceiveTimeout(&tv)); err != nil {
		s.Close()
		return nil, fmt.Errorf("setting netlink socket timeout: %w", err)
	}
	return &devconfSocket{sh: &nl.SocketHandle{Socket: s}}, nil
}

func (d *devconfSocket) close() { d.sh.Socket.Close() }

// setHostIf gives the host interface ifindex proxy ARP without delay,
// forwarding, strict reverse-path filtering and no redirects either way,
// as hostIfSysctls says. (IPv6's settings cannot be set over netlink:
// RTM_SETLINK takes no IFLA_INET6_CONF.)
func (d *devconfSocket) setHostIf(ifindex int) error {
	req := d.request(unix.RTM_SETLINK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	req.AddData(msg)
	spec := nl.NewRtAttr(unix.IFLA_AF_SPEC, nil)
	conf := spec.AddRtAttr(unix.AF_INET, nil).AddRtAttr(unix.IFLA_INET_CONF, nil)
	conf.AddRtAttr(ipv4DevconfProxyARP, nl.Uint32Attr(1))
	conf.AddRtAttr(ipv4DevconfForwarding, nl.Uint32Attr(1))
	conf.AddRtAttr(ipv4DevconfRPFilter, nl.Uint32Attr(1))
	conf.AddRtAttr(ipv4DevconfAcceptRedirects, nl.Uint32Attr(0))
	conf.AddRtAttr(ipv4DevconfSendRedirects, nl.Uint32Attr(0))
	req.AddData(spec)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("setting proxy_arp, forwarding, rp_filter and redirects: %w", err)
	}

	req = d.request(unix.RTM_SETNEIGHTBL)
	req.AddData(ndtmsg{family: unix.AF_INET})
	req.AddData(nl.NewRtAttr(ndtaName, nl.ZeroTerminated("arp_cache")))
	parms := nl.NewRtAttr(ndtaParms, nil)
	parms.AddRtAttr(ndtpaIfindex, nl.Uint32Attr(uint32(ifindex)))
	parms.AddRtAttr(ndtpaProxyDelay, nl.Uint64Attr(0))
	req.AddData(parms)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("setting proxy_delay: %w", err)
	}
	return nil
}

func (d *devconfSocket) request(typ int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(typ, unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: d.sh}
	return req
}

// ndtmsg is struct ndtmsg: the family and padding to 4 bytes.
type ndtmsg struct{ family uint8 }

func (m ndtmsg) Len() int          { return 4 }
func (m ndtmsg) Serialize() []byte { return []byte{m.family, 0, 0, 0} }
