package ipam

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// Key layout, relative to the datastore prefix.
const (
	blocksPrefix     = "ipam/blocks/"
	affinitiesPrefix = "ipam/affinities/"
	handlesPrefix    = "ipam/handles/"
)

// blockName is the key-safe form of a block CIDR: "10.244.0.0-26".
func blockName(p netip.Prefix) string {
	return p.Addr().String() + "-" + strconv.Itoa(p.Bits())
}

// parseBlockName reverses blockName.
func parseBlockName(s string) (netip.Prefix, error) {
	i := strings.LastIndexByte(s, '-')
	if i < 0 {
		return netip.Prefix{}, fmt.Errorf("block name %q: want <addr>-<len>", s)
	}
	p, err := netip.ParsePrefix(s[:i] + "/" + s[i+1:])
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("block name %q: %w", s, err)
	}
	if p != p.Masked() {
		return netip.Prefix{}, fmt.Errorf("block name %q: address has host bits set", s)
	}
	return p, nil
}

func blockKey(p netip.Prefix) string { return blocksPrefix + blockName(p) }

func affinityNodePrefix(node string) string {
	return affinitiesPrefix + url.PathEscape(node) + "/"
}

func affinityKey(node string, p netip.Prefix) string {
	return affinityNodePrefix(node) + blockName(p)
}

// parseAffinityKey splits ipam/affinities/<node>/<block>.
func parseAffinityKey(key string) (node string, block netip.Prefix, err error) {
	rest, ok := strings.CutPrefix(key, affinitiesPrefix)
	if !ok {
		return "", netip.Prefix{}, fmt.Errorf("affinity key %q: wrong prefix", key)
	}
	n, b, ok := strings.Cut(rest, "/")
	if !ok {
		return "", netip.Prefix{}, fmt.Errorf("affinity key %q: want <node>/<block>", key)
	}
	node, err = url.PathUnescape(n)
	if err != nil {
		return "", netip.Prefix{}, fmt.Errorf("affinity key %q: %w", key, err)
	}
	block, err = parseBlockName(b)
	if err != nil {
		return "", netip.Prefix{}, fmt.Errorf("affinity key %q: %w", key, err)
	}
	return node, block, nil
}

func handleKey(handle string) string { return handlesPrefix + url.PathEscape(handle) }

// Block ordinal math. Blocks are IPv4 (block sizes 20–32, see api), so an
// ordinal is the address minus the block's first address.

func addrUint(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func uintAddr(u uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], u)
	return netip.AddrFrom4(b)
}

// blockSizeOf returns the number of addresses in the IPv4 prefix p.
func blockSizeOf(p netip.Prefix) int { return 1 << (32 - p.Bits()) }

// ordinal returns addr's index in block, or false when addr is outside it.
func ordinal(block netip.Prefix, addr netip.Addr) (int, bool) {
	if !addr.Is4() || !block.Contains(addr) {
		return 0, false
	}
	return int(addrUint(addr) - addrUint(block.Addr())), true
}

// addrAt returns the address at ordinal ord of block.
func addrAt(block netip.Prefix, ord int) netip.Addr {
	return uintAddr(addrUint(block.Addr()) + uint32(ord))
}

// blockFor returns the block of size bits that holds addr.
func blockFor(addr netip.Addr, bits int) netip.Prefix {
	return netip.PrefixFrom(addr, bits).Masked()
}

// numBlocks returns how many blocks of blockBits a pool prefix holds.
func numBlocks(pool netip.Prefix, blockBits int) int {
	if blockBits < pool.Bits() {
		return 0
	}
	return 1 << (blockBits - pool.Bits())
}

// nthBlock returns the n-th block of blockBits inside pool.
func nthBlock(pool netip.Prefix, blockBits, n int) netip.Prefix {
	base := addrUint(pool.Masked().Addr())
	return netip.PrefixFrom(uintAddr(base+uint32(n)<<(32-blockBits)), blockBits)
}
