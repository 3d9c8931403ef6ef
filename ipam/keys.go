package ipam

import (
	"encoding/binary"
	"fmt"
	"math/bits"
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

// Block ordinal math, for both families. A block holds at most
// 1<<maxBlockHostBits addresses (IPv4 /20, IPv6 /116), so an ordinal is an
// int and only the address's low 64 bits change inside a block. Counting
// blocks in a pool needs 128-bit arithmetic for IPv6.

// maxBlockHostBits bounds a block's size in both families.
const maxBlockHostBits = 12

// u128 is an address as a 128-bit number (IPv4 in the low 32 bits).
type u128 struct{ hi, lo uint64 }

func addrU128(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{lo: uint64(binary.BigEndian.Uint32(b[:]))}
	}
	b := a.As16()
	return u128{hi: binary.BigEndian.Uint64(b[:8]), lo: binary.BigEndian.Uint64(b[8:])}
}

// u128Addr is the address of family is6 whose number is u.
func u128Addr(u u128, is6 bool) netip.Addr {
	if !is6 {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(u.lo))
		return netip.AddrFrom4(b)
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], u.hi)
	binary.BigEndian.PutUint64(b[8:], u.lo)
	return netip.AddrFrom16(b)
}

// add returns u + v (mod 2^128).
func (u u128) add(v u128) u128 {
	lo, carry := bits.Add64(u.lo, v.lo, 0)
	hi, _ := bits.Add64(u.hi, v.hi, carry)
	return u128{hi: hi, lo: lo}
}

// shl returns u << n for 0 <= n < 128.
func (u u128) shl(n int) u128 {
	switch {
	case n == 0:
		return u
	case n >= 64:
		return u128{hi: u.lo << (n - 64)}
	}
	return u128{hi: u.hi<<n | u.lo>>(64-n), lo: u.lo << n}
}

// hostBits is the number of host bits of p.
func hostBits(p netip.Prefix) int { return p.Addr().BitLen() - p.Bits() }

// validBlockPrefix reports whether p can be a block: masked, no zone, and
// at most 1<<maxBlockHostBits addresses.
func validBlockPrefix(p netip.Prefix) bool {
	return p.IsValid() && p == p.Masked() && p.Addr().Zone() == "" && hostBits(p) <= maxBlockHostBits && !p.Addr().Is4In6()
}

// blockSizeOf returns the number of addresses in block p (a valid block
// prefix).
func blockSizeOf(p netip.Prefix) int { return 1 << hostBits(p) }

// ordinal returns addr's index in block, or false when addr is outside it.
func ordinal(block netip.Prefix, addr netip.Addr) (int, bool) {
	if addr.Zone() != "" || !block.Contains(addr) {
		return 0, false
	}
	return int(addrU128(addr).lo - addrU128(block.Addr()).lo), true
}

// addrAt returns the address at ordinal ord of block.
func addrAt(block netip.Prefix, ord int) netip.Addr {
	return u128Addr(addrU128(block.Addr()).add(u128{lo: uint64(ord)}), block.Addr().Is6())
}

// hostPrefix is the single-address prefix of addr (/32 or /128).
func hostPrefix(addr netip.Addr) netip.Prefix { return netip.PrefixFrom(addr, addr.BitLen()) }

// blockFor returns the block of size bits that holds addr.
func blockFor(addr netip.Addr, bits int) netip.Prefix {
	return netip.PrefixFrom(addr, bits).Masked()
}

// maxBlocksScanned caps how many of a pool's blocks are numbered: an IPv6
// /48 pool of /122 blocks has 2^74 of them; the first 2^62 are plenty.
const maxBlocksScanned = 1 << 62

// numBlocks returns how many blocks of blockBits a pool prefix holds (at
// most maxBlocksScanned).
func numBlocks(pool netip.Prefix, blockBits int) int {
	switch d := blockBits - pool.Bits(); {
	case d < 0:
		return 0
	case d >= 62:
		return maxBlocksScanned
	default:
		return 1 << d
	}
}

// nthBlock returns the n-th block of blockBits inside pool.
func nthBlock(pool netip.Prefix, blockBits, n int) netip.Prefix {
	base := addrU128(pool.Masked().Addr())
	off := u128{lo: uint64(n)}.shl(pool.Addr().BitLen() - blockBits)
	return netip.PrefixFrom(u128Addr(base.add(off), pool.Addr().Is6()), blockBits)
}
