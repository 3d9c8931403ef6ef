package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/datastore"
)

// Cluster BGP sessions are signed with TCP-MD5 (docs/bgp.md, "Mesh
// authentication"): a reflector's kernel silently drops an unsigned SYN
// from a peer it has a key for, so a simulated node's connection would stay
// in SYN-SENT. The simulated node signs with the password the agents give
// its session: BGPConfiguration's plain nodeMeshPassword, else the
// cluster's mesh key (bgp.MeshPassword).

// meshPassword reads the cluster sessions' password from the datastore;
// "" when there is none (the reflectors then expect no signature).
func (n *simNode) meshPassword(ctx context.Context) (string, error) {
	var key string
	kv, err := n.store.GetKV(ctx, datastore.BGPMeshKeyKey)
	switch {
	case err == nil:
		k, err := datastore.DecodeBGPMeshKey(kv.Value)
		if err != nil {
			return "", err
		}
		key = k.Key
	case !errors.Is(err, datastore.ErrNotFound):
		return "", fmt.Errorf("%s: reading the mesh key: %w", n.name, err)
	}
	var cfg *api.BGPConfiguration
	o, err := n.store.Get(ctx, api.KindBGPConfiguration, "", "default")
	switch {
	case err == nil:
		cfg, _ = o.(*api.BGPConfiguration)
	case !errors.Is(err, datastore.ErrNotFound):
		return "", fmt.Errorf("%s: reading the BGP configuration: %w", n.name, err)
	}
	return bgp.MeshPassword(cfg, key), nil
}

// md5Control is a net.Dialer Control that sets the TCP-MD5 key for peer
// on the socket before it connects; an empty password sets none.
func md5Control(peer netip.Addr, password string) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		if password == "" {
			return nil
		}
		sig, err := tcpMD5Sig(peer, password)
		if err != nil {
			return err
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptTCPMD5Sig(int(fd), unix.IPPROTO_TCP, unix.TCP_MD5SIG, sig)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("setting TCP-MD5 key for %s: %w", peer, serr)
		}
		return nil
	}
}

// tcpMD5Sig is the kernel's struct tcp_md5sig for an IPv4 peer.
func tcpMD5Sig(peer netip.Addr, password string) (*unix.TCPMD5Sig, error) {
	if !peer.Is4() {
		return nil, fmt.Errorf("TCP-MD5 key for %s: only IPv4 peers", peer)
	}
	if len(password) > unix.TCP_MD5SIG_MAXKEYLEN {
		return nil, fmt.Errorf("TCP-MD5 key for %s: %d bytes, at most %d", peer, len(password), unix.TCP_MD5SIG_MAXKEYLEN)
	}
	sig := &unix.TCPMD5Sig{Keylen: uint16(len(password))}
	sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&sig.Addr))
	sa.Family = unix.AF_INET
	sa.Addr = peer.As4()
	copy(sig.Key[:], password)
	return sig, nil
}
