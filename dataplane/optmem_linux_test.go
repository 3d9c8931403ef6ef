package dataplane

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tabbynet/tabby/internal/testkit"
)

func TestOptmemFor(t *testing.T) {
	for _, c := range []struct{ keys, want int }{{-1, 65536}, {0, 65536}, {1000, 321536}} {
		if got := OptmemFor(c.keys); got != c.want {
			t.Errorf("OptmemFor(%d) = %d, want %d", c.keys, got, c.want)
		}
	}
}

// md5Keys sets a TCP-MD5 key for n peer addresses (198.19.x.y: no packet
// is sent) on a new listening socket in the calling thread's namespace and
// returns how many the kernel took before refusing one.
func md5Keys(t *testing.T, n int) (int, error) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	rc, err := l.(*net.TCPListener).SyscallConn()
	if err != nil {
		return 0, err
	}
	took := 0
	var serr error
	err = rc.Control(func(fd uintptr) {
		for i := range n {
			a := netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
			sig := &unix.TCPMD5Sig{Keylen: 8}
			sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&sig.Addr))
			sa.Family = unix.AF_INET
			sa.Addr = a.As4()
			copy(sig.Key[:], "password")
			if serr = unix.SetsockoptTCPMD5Sig(int(fd), unix.IPPROTO_TCP, unix.TCP_MD5SIG, sig); serr != nil {
				return
			}
			took++
		}
	})
	return took, errors.Join(err, serr)
}

// TestPrivilegedMD5KeyRoom: in a fresh namespace (default optmem_max) a
// listening socket refuses TCP-MD5 keys long before 2,000 signed peers
// (ENOMEM, as a reflector's did at 960 clients); EnsureMD5KeyRoom raises
// the limit so that it takes all 2,000, and never lowers it.
func TestPrivilegedMD5KeyRoom(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	ns := testkit.NewNetNS(t, "tbmd5")
	const peers = 2000
	var before int
	err := ns.Do(func() error {
		var err error
		before, err = md5Keys(t, peers)
		return err
	})
	if !errors.Is(err, syscall.ENOMEM) || before >= peers {
		t.Fatalf("default optmem_max: %d keys of %d taken, err %v; want ENOMEM before %d", before, peers, err, peers)
	}
	got, err := EnsureMD5KeyRoom(ns.Path, peers)
	if err != nil || got != OptmemFor(peers) {
		t.Fatalf("EnsureMD5KeyRoom(%d) = %d, %v; want %d", peers, got, err, OptmemFor(peers))
	}
	var after int
	if err := ns.Do(func() error {
		var err error
		after, err = md5Keys(t, peers)
		return err
	}); err != nil || after != peers {
		t.Fatalf("after EnsureMD5KeyRoom: %d keys of %d taken, err %v", after, peers, err)
	}
	if got, err := EnsureMD5KeyRoom(ns.Path, 10); err != nil || got != OptmemFor(peers) {
		t.Fatalf("EnsureMD5KeyRoom(10) after (%d) = %d, %v: want it left at %d", peers, got, err, OptmemFor(peers))
	}
	var v string
	if err := ns.Do(func() error { var err error; v, err = readSysctl(optmemPath); return err }); err != nil || strings.TrimSpace(v) != strconv.Itoa(OptmemFor(peers)) {
		t.Fatalf("optmem_max in the namespace: %q, %v", v, err)
	}
	t.Logf("default optmem_max took %d keys; raised to %d it took %d", before, OptmemFor(peers), after)
}
