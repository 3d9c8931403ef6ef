package ipam

import "strings"

// TunnelHandlePrefix starts the handle of a node's VXLAN tunnel
// addresses (Calico's vxlan-tunnel-addr-<node>): one handle per node,
// holding at most one address per family.
const TunnelHandlePrefix = "vxlan-tunnel-addr-"

// TunnelHandle is the IPAM handle of node's tunnel addresses. The
// addresses are allocated with the node as their owner, so node GC's
// ReleaseNode frees them with the node's other addresses.
func TunnelHandle(node string) string { return TunnelHandlePrefix + node }

// IsTunnelHandle reports whether h is a node's tunnel handle: its
// addresses are used by the node's VXLAN devices, not by a workload
// endpoint, and are no leak.
func IsTunnelHandle(h string) bool { return strings.HasPrefix(h, TunnelHandlePrefix) }
