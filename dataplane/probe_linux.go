package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ProbeSpec is one probe sent from inside a workload's network namespace:
// a TCP connect or a UDP datagram, `tabbyctl explain packet --live`.
type ProbeSpec struct {
	// HostIf is the workload's host-side veth in this process's network
	// namespace; its peer's namespace is the one the probe leaves from.
	HostIf  string
	Src     netip.Addr // the workload's address (the probe's source)
	Dst     netip.AddrPort
	Proto   string // "tcp" or "udp"
	Timeout time.Duration
}

// Probe outcomes.
const (
	ProbeConnected   = "connected"   // TCP handshake completed
	ProbeRefused     = "refused"     // a TCP RST or an ICMP port unreachable came back
	ProbeAnswered    = "answered"    // a UDP reply came back
	ProbeTimeout     = "timeout"     // nothing came back within the timeout
	ProbeUnreachable = "unreachable" // an ICMP host, network or admin unreachable
)

// ProbeResult is what the probe saw.
type ProbeResult struct {
	Outcome string `json:"outcome"`
	// Passed: an answer came from the destination, so the packet went
	// through every filter on the way (connected, refused, answered).
	Passed bool          `json:"passed"`
	NetNS  string        `json:"netns"`
	Took   time.Duration `json:"took"`
	Detail string        `json:"detail,omitempty"`
}

// netnsDirs are where CNI runtimes and `ip netns add` put namespace files.
var netnsDirs = []string{"/run/netns", "/var/run/netns"}

// Probe finds the namespace of spec.HostIf's peer and sends one probe from
// it, from spec.Src to spec.Dst. Only the socket is made inside the
// namespace; the caller's thread returns to its own at once.
func Probe(ctx context.Context, spec ProbeSpec) (ProbeResult, error) {
	path, err := PeerNetNS(spec.HostIf)
	if err != nil {
		return ProbeResult{}, err
	}
	nsh, err := openNetNS(path)
	if err != nil {
		return ProbeResult{}, err
	}
	defer nsh.Close()
	res := ProbeResult{NetNS: path}
	start := time.Now()
	err = withNetNS(nsh, func() error {
		res.Outcome, res.Detail = probeOnce(ctx, spec)
		return nil
	})
	res.Took = time.Since(start)
	if err != nil {
		return ProbeResult{}, err
	}
	res.Passed = res.Outcome == ProbeConnected || res.Outcome == ProbeRefused || res.Outcome == ProbeAnswered
	return res, nil
}

// probeOnce sends the probe from the namespace the thread is in.
func probeOnce(ctx context.Context, spec ProbeSpec) (outcome, detail string) {
	ctx, cancel := context.WithTimeout(ctx, spec.Timeout)
	defer cancel()
	d := net.Dialer{LocalAddr: localAddr(spec)}
	c, err := d.DialContext(ctx, spec.Proto, spec.Dst.String())
	if err != nil {
		return probeError(err)
	}
	defer c.Close()
	if spec.Proto == "tcp" {
		return ProbeConnected, ""
	}
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	if _, err := c.Write([]byte("tabby-probe\n")); err != nil {
		return probeError(err)
	}
	buf := make([]byte, 512)
	if _, err := c.Read(buf); err != nil {
		return probeError(err)
	}
	return ProbeAnswered, ""
}

func localAddr(spec ProbeSpec) net.Addr {
	if !spec.Src.IsValid() {
		return nil
	}
	if spec.Proto == "udp" {
		return net.UDPAddrFromAddrPort(netip.AddrPortFrom(spec.Src, 0))
	}
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(spec.Src, 0))
}

func probeError(err error) (string, string) {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return ProbeRefused, err.Error()
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return ProbeUnreachable, err.Error()
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return ProbeTimeout, ""
	}
	return ProbeUnreachable, err.Error()
}

// PeerNetNS is the path of the network namespace that holds the peer of
// the veth hostIf (in this process's namespace): the namespace file under
// /run/netns whose id, as this namespace knows it, is the link's.
func PeerNetNS(hostIf string) (string, error) {
	link, err := netlink.LinkByName(hostIf)
	if err != nil {
		return "", fmt.Errorf("interface %s: %w", hostIf, err)
	}
	id := link.Attrs().NetNsID
	if _, ok := link.(*netlink.Veth); !ok || id < 0 {
		return "", fmt.Errorf("interface %s is not a veth with its peer in another namespace", hostIf)
	}
	seen := map[uint64]bool{}
	for _, dir := range netnsDirs {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			if ok, err := nsidIs(p, id, seen); err == nil && ok {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("the namespace of %s's peer (id %d) has no file under %v", hostIf, id, netnsDirs)
}

// nsidIs reports whether the namespace file at p has the id id here.
func nsidIs(p string, id int, seen map[uint64]bool) (bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || seen[st.Ino] {
		return false, err
	}
	seen[st.Ino] = true
	got, err := netlink.GetNetNsIdByFd(int(f.Fd()))
	return err == nil && got == id, err
}
