package api

// Kernel conventions every node follows, in one place: the dataplane
// programs them, policy matches them, tabbyctl explains them.
const (
	// WorkloadIfacePrefix starts every host-side workload interface name
	// ("cali" + 11 hex characters, Calico's scheme).
	WorkloadIfacePrefix = "cali"
	// WorkloadGatewayIPv4 is the fake next hop of every IPv4 workload; the
	// host side answers ARP for it by proxy ARP.
	WorkloadGatewayIPv4 = "169.254.1.1"
	// WorkloadGatewayIPv6 is the next hop of every IPv6 workload: the
	// link-local address the host side's MAC (WorkloadHostMAC) gives by
	// EUI-64, which the dataplane also sets on the host side explicitly.
	WorkloadGatewayIPv6 = "fe80::ecee:eeff:feee:eeee"
	// WorkloadHostMAC is the MAC address of every host-side workload
	// interface.
	WorkloadHostMAC = "ee:ee:ee:ee:ee:ee"
	// RouteProtoWorkload marks the routes Tabby installs for local
	// workloads and blackholes for affine blocks.
	RouteProtoWorkload = 80
	// RouteProtoBGP marks the routes Tabby installs from BGP.
	RouteProtoBGP = 81
)
