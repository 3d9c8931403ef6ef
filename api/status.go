package api

import "time"

// AgentStatus is what an agent serves on GET /status and publishes (with
// Ready false: it flaps with time) at status/bgp/<node> under its liveness
// lease; tabbyctl node status and the lab read it.
type AgentStatus struct {
	Node       string       `json:"node"`
	Address    string       `json:"address"`
	ASN        uint32       `json:"asn"`
	Ready      bool         `json:"ready,omitempty"`
	Peers      []PeerStatus `json:"peers"`
	Blocks     []string     `json:"blocks"`
	Advertised []string     `json:"advertised"`
	Workloads  int          `json:"workloads"`
	// Services are the node's decisions on Service prefixes: advertised,
	// not (and why), refused by the configuration.
	Services []ServiceAdvertisementStatus `json:"services,omitempty"`
	// HostEndpoints are the node's host endpoints, when it has any.
	HostEndpoints []HostEndpointStatus `json:"hostEndpoints,omitempty"`
	// Tunnels are the node's VXLAN tunnels, IPv4 then IPv6 (docs/vxlan.md).
	Tunnels []TunnelStatus `json:"tunnels,omitempty"`
	// BGPProblems are BGP settings the node could not apply as asked (a
	// nodeMeshPassword whose Secret key does not resolve, a localASNumber
	// ignored); sessions left out for their password are in Peers, Idle,
	// with the reason as Info.
	BGPProblems []string `json:"bgpProblems,omitempty"`
	// RefusedPeers are sessions the configuration asks for that this
	// node cannot have.
	RefusedPeers []RefusedPeerStatus `json:"refusedPeers,omitempty"`
	// Reflectors is the route reflector election (routeReflectorMode Auto).
	Reflectors *ReflectorStatus `json:"reflectors,omitempty"`
}

// PeerStatus is one BGP session of an agent.
type PeerStatus struct {
	Address string    `json:"address"`
	Type    string    `json:"type"`
	State   string    `json:"state"`
	Since   time.Time `json:"since,omitzero"`
	Info    string    `json:"info,omitempty"`
	// PrefixLimitExceeded says the session was shut down because the peer
	// sent more than MaxPrefixes; it stays down until the BGPPeer changes.
	PrefixLimitExceeded bool   `json:"prefixLimitExceeded,omitempty"`
	Received            uint32 `json:"received,omitempty"`    // prefixes the peer sent
	MaxPrefixes         uint32 `json:"maxPrefixes,omitempty"` // its limit, 0 for none
	// BFD is the BFD session state (Up, Down, Init, AdminDown), empty when
	// BFD is off for the peer.
	BFD string `json:"bfd,omitempty"`
	// Families are the address families the established session carries
	// ("ipv4", "ipv6"; IPv6 over MP-BGP on the same session).
	Families []string `json:"families,omitempty"`
}

// HostEndpointStatus is one host endpoint of an agent's node.
type HostEndpointStatus struct {
	Name      string `json:"name"`
	Interface string `json:"interface"`
	// State is HostEndpointPoliced or HostEndpointNoInterface.
	State string `json:"state"`
}

// Host endpoint states.
const (
	HostEndpointPoliced = "policed"
	// HostEndpointNoInterface: the node has no interface of that name
	// (yet); its rules apply once it appears.
	HostEndpointNoInterface = "interface missing"
)

// ReflectorStatus is the automatic route reflector election as one agent
// sees it (routeReflectorMode Auto).
type ReflectorStatus struct {
	Mode      string `json:"mode"`
	ZoneLabel string `json:"zoneLabel"`
	PerZone   int    `json:"perZone"`
	Grace     string `json:"grace"`
	// Peering is routeReflectorPeering in effect (NonClient or Client).
	Peering string `json:"peering"`
	Zone    string `json:"zone"` // this node's
	Role    string `json:"role"` // reflector or client
	Reason  string `json:"reason,omitempty"`
	// Elected are every zone's reflectors.
	Elected []ElectedReflector `json:"elected,omitempty"`
	// LastDropped explains the reflectors this agent's last write
	// replaced.
	LastDropped []string `json:"lastDropped,omitempty"`
}

// ElectedReflector is one elected reflector.
type ElectedReflector struct {
	Zone      string    `json:"zone"`
	Node      string    `json:"node"`
	ClusterID string    `json:"clusterID"`
	Since     time.Time `json:"since"`
	Reason    string    `json:"reason"`
	Live      bool      `json:"live"`
	// SessionsReady: the reflector reported every session of this
	// election up (docs/bgp.md, "Promotion"); until then a reflector of
	// its zone elected before it sends it every route. Nil from an agent
	// older than the report.
	SessionsReady *bool `json:"sessionsReady,omitempty"`
}

// RefusedPeerStatus is a BGP session the configuration asks for that the
// node cannot have, and why (an IPv6 peer on a node without an IPv6
// address, say).
type RefusedPeerStatus struct {
	Address string `json:"address,omitempty"`
	Name    string `json:"name"`
	Reason  string `json:"reason"`
}
