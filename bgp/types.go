// Package bgp owns Tabby's BGP side: a Speaker interface over an embedded
// GoBGP server (the only package that imports GoBGP), and pure functions that
// compute, from datastore resources, which peers a node should have and which
// prefixes it should advertise.
//
// Everything exported here uses net/netip and Tabby's own types; GoBGP types
// never leak out.
package bgp

import (
	"context"
	"net/netip"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp/session"
)

// PeerType says why a peering exists. It is informational: it shows up in
// status output and never changes how a session is configured (the other Peer
// fields do that).
type PeerType string

// Peer types produced by DesiredPeers.
const (
	// PeerMesh is a node-to-node full-mesh iBGP session.
	PeerMesh PeerType = "mesh"
	// PeerGlobal is an explicit BGPPeer with a peerIP that applies to all nodes.
	PeerGlobal PeerType = "global"
	// PeerNode is an explicit BGPPeer scoped to some nodes (node or
	// nodeSelector), or a peerSelector match that is neither a reflector
	// nor a reflector client.
	PeerNode PeerType = "node"
	// PeerRRClient is a session on a reflector towards one of its clients.
	PeerRRClient PeerType = "rr-client"
	// PeerRR is a session towards a route reflector.
	PeerRR PeerType = "rr"
)

// Peer is one desired BGP session. Zero durations mean "the speaker's
// default" (see DefaultHold, DefaultKeepalive; RestartTime falls back to
// Config.RestartTime). Port 0 means 179. A zero LocalAddress lets the kernel
// pick the source address.
type Peer struct {
	Address      netip.Addr
	ASN          uint32
	Type         PeerType
	Name         string // the peer node's name, or the BGPPeer's name for routers outside the cluster
	Password     string // TCP MD5 password; empty for none
	RRClient     bool   // we reflect routes to this peer
	Keepalive    time.Duration
	Hold         time.Duration
	RestartTime  time.Duration
	LocalAddress netip.Addr
	Port         uint16

	// ClusterNode says the peer is a node of this cluster (mesh, reflector
	// and node-to-node sessions). Cluster peers may send pool prefixes
	// only; every other peer is external (see docs/bgp.md).
	ClusterNode bool
	// AcceptDefault lets an external peer send 0.0.0.0/0.
	AcceptDefault bool
	// MaxPrefixes is the most prefixes the peer may send before the
	// session is shut down; 0 means DefaultExternalMaxPrefixes for
	// external peers and no limit for cluster peers.
	MaxPrefixes uint32
	// Import are the peer's import rules (from its BGPFilters), in order;
	// the first that matches a prefix decides. They apply to external
	// peers only: cluster peers always get the pool rule.
	Import []FilterRule
	// Export are the peer's export rules (from its BGPFilters), in order;
	// the first that matches a prefix decides, a prefix none matches is
	// sent. They never let through what the safe defaults withhold
	// (routes learned from external peers).
	Export []FilterRule
	// BFD, when set, runs BFD with the peer: the session goes down once
	// BFD.Multiplier × BFD.Interval pass without a BFD packet.
	BFD *BFD

	// PasswordRef, when set, names the Secret key that holds the
	// session's password (BGPPeer password.secretKeyRef): ResolvePasswords
	// fills Password from it.
	PasswordRef *api.SecretKeyRef
	// LocalASN is the AS number we speak as on this session; 0 means
	// Config.ASN (BGPPeer localASNumber).
	LocalASN uint32
	// NextHop says which next hop routes sent to the peer carry.
	NextHop NextHopMode
	// OwnRoutesOnly: the peer is a reflector of this reflector's cluster
	// (the same route-reflector cluster ID), which serves the same clients
	// and so learns their routes from them: only this node's own routes go
	// to it. RFC 4456 has the receiver drop routes that carry its own
	// cluster ID; GoBGP v4.8.0 strips the CLUSTER_LIST towards non-clients
	// and checks nothing on receipt, so without this the two reflectors
	// hold each other's copy of a client's route, may prefer it (by router
	// ID), and then never pass on its withdrawal (TestZoneReflectorRoutes).
	OwnRoutesOnly bool
}

// NextHopMode is a peer's next-hop handling (BGPPeer nextHopMode).
type NextHopMode string

// Next-hop modes. Auto (the zero value): this node for its own routes
// and towards eBGP peers, except a third-party next hop on the shared
// subnet (see nexthop.go); Self: always this node's session address; Keep:
// the route's original next hop (this node's for its own routes).
const (
	NextHopAuto NextHopMode = ""
	NextHopSelf NextHopMode = "Self"
	NextHopKeep NextHopMode = "Keep"
)

// BFD are a peer's BFD timers. Zero values mean DefaultBFDInterval and
// DefaultBFDMultiplier.
type BFD struct {
	Interval   time.Duration // desired transmit and required receive interval
	Multiplier uint8
}

// BFD defaults (300 ms × 3: a silent peer is noticed in under a second).
const (
	DefaultBFDInterval   = 300 * time.Millisecond
	DefaultBFDMultiplier = 3
)

// IsCluster reports whether p is a cluster peer (see Peer.ClusterNode).
func (p Peer) IsCluster() bool {
	switch p.Type {
	case PeerMesh, PeerRR, PeerRRClient:
		return true
	}
	return p.ClusterNode
}

// DefaultExternalMaxPrefixes is the prefix limit of an external peer
// without one.
const DefaultExternalMaxPrefixes = 10000

// MatchOperator says how a FilterRule's CIDR is compared with a prefix.
type MatchOperator string

// Match operators of FilterRule (Calico's BGPFilter operators).
const (
	MatchEqual MatchOperator = "Equal" // the prefix is CIDR
	MatchIn    MatchOperator = "In"    // the prefix is CIDR or inside it
	MatchNotIn MatchOperator = "NotIn" // the prefix is not inside CIDR
)

// FilterRule is one import or export rule. With PrefixLength set, In and NotIn
// consider prefixes of those lengths only (Min..Max, inclusive; 0 means
// the CIDR's own length, respectively 32).
type FilterRule struct {
	CIDR         netip.Prefix
	Operator     MatchOperator
	PrefixLength *PrefixLengthRange
	// Community, when set, narrows the rule to routes carrying it.
	Community *api.FilterCommunity
	// ASPathPrefix, when set, narrows the rule to routes whose AS path
	// begins with it (on export to an eBGP peer: after this node's own AS,
	// which GoBGP has put in front already).
	ASPathPrefix []uint32
	Accept       bool // false rejects
	// Operations change what an Accept rule accepts.
	Operations RuleOperations
}

// RuleOperations are the changes an Accept rule makes to a route.
type RuleOperations struct {
	AddCommunities []api.FilterCommunity
	// Prepend are the AS numbers to prepend, as runs; the path then
	// begins with them in this order.
	Prepend   []api.ASRun
	LocalPref *uint32
}

// PrefixLengthRange bounds the prefix length a FilterRule matches.
type PrefixLengthRange struct {
	Min, Max uint8
}

// Policy is the cluster-wide input of the speaker's import policy.
type Policy struct {
	// Pools are the IP pool CIDRs of both families: the only prefixes
	// cluster peers may send, and prefixes no external peer may send.
	Pools []netip.Prefix
	// Communities are added to every route sent to any peer whose prefix
	// is inside one of the CIDRs (per-pool communities: blocks and
	// borrowed addresses of the pool).
	Communities []PrefixCommunities
	// Aggregates are the pools whose CIDR is advertised to external
	// peers (IPPool bgpAggregate). Cluster peers never get an aggregate;
	// external peers get nothing more specific inside an aggregate that
	// is not WithBlocks.
	Aggregates []Aggregate
}

// PrefixCommunities tags the routes inside Prefix with standard BGP
// communities (RFC 1997, high 16 bits the AS, low 16 bits the value) and
// large communities (RFC 8092).
type PrefixCommunities struct {
	Prefix           netip.Prefix
	Communities      []uint32
	LargeCommunities []api.LargeCommunity
}

// Aggregate is a pool advertised as a whole to external peers.
type Aggregate struct {
	Prefix netip.Prefix
	// WithBlocks sends external peers the pool's blocks and borrowed
	// addresses too; without it they get the aggregate only.
	WithBlocks bool
}

// Config configures a Speaker. RouterID is also the next hop of every
// IPv4 prefix the speaker originates (but with IPv6Only). Sessions go to
// IPv4 and, with RouterID6, IPv6 peer addresses; every session negotiates
// the families the speaker carries (IPv4 unicast, IPv6 unicast), so IPv4
// routes can ride on an IPv6 session and the other way round. GoBGP
// announces the extended next hop capability (RFC 8950) for IPv4 unicast
// on every session; Tabby's IPv4 routes keep an IPv4 next hop.
type Config struct {
	RouterID netip.Addr
	ASN      uint32
	// RouterID6 is the node's IPv6 address, zero when it has none. With
	// it every session also negotiates IPv6 unicast (MP-BGP, RFC 4760,
	// still over the IPv4 session addresses) and it is the next hop of
	// every IPv6 prefix the speaker originates; without it the speaker
	// carries IPv4 only.
	RouterID6 netip.Addr
	// Subnet6 is the node's IPv6 subnet (RouterID6's interface prefix).
	// A learned IPv6 route sent to an eBGP peer on Subnet keeps its
	// original next hop when that lies inside Subnet6 (see Subnet).
	Subnet6 netip.Prefix
	// Subnet is the node's own subnet (the router ID's interface prefix).
	// A route sent to an eBGP peer inside it keeps its original next hop
	// when that lies inside it too (RFC 4271 third-party next hop), as
	// BIRD does; zero means next-hop-self for every eBGP peer.
	Subnet netip.Prefix
	// ListenAddr is the address BGP listens on; zero means all IPv4
	// addresses (0.0.0.0), or none with IPv6Only.
	ListenAddr netip.Addr
	// ListenAddr6 is the IPv6 address BGP also listens on, for sessions
	// to IPv6 peer addresses; zero means none, or all IPv6 addresses
	// (::) with IPv6Only.
	ListenAddr6 netip.Addr
	// IPv6Only says the node has no IPv4 underlay address: RouterID is
	// an identifier only (never a next hop), every session is IPv6 and
	// carries IPv6 unicast only, and RouterID6 is required.
	IPv6Only bool
	// ListenPort is the BGP port; 0 means 179 and -1 means do not listen
	// (the speaker only connects out).
	ListenPort int32
	// ClusterID is this node's route-reflector cluster ID (dotted IPv4),
	// empty when it is not a reflector.
	ClusterID string
	// GracefulRestart enables RFC 4724 graceful restart (helper and
	// restarting speaker) for every family the speaker carries.
	GracefulRestart bool
	// RestartTime is the restart time we announce to peers; 0 means
	// DefaultRestartTime.
	RestartTime time.Duration
	// LocalRestarting announces that this speaker has just restarted (the
	// "R" bit), so peers keep our stale routes until we send End-of-RIB.
	// Set it when the agent finds its own routes still in the kernel.
	LocalRestarting bool
	// APIListen, when set, exposes GoBGP's gRPC API on this host:port so
	// that the gobgp CLI can inspect the speaker. It must be a loopback
	// address.
	APIListen string
}

// LearnedRoute is one prefix learned from peers with all of its equal-cost
// next hops, sorted. The next hops are of the prefix's family.
type LearnedRoute struct {
	Prefix   netip.Prefix
	NextHops []netip.Addr
}

// PeerStatus is the state of one configured peer. It never carries the
// peer's password.
type PeerStatus struct {
	Address netip.Addr
	Type    PeerType
	State   session.State
	Since   time.Time // when the session entered its current state, if known
	Info    string    // e.g. the last error or disconnect reason
	// PrefixLimitExceeded says the session was shut down because the
	// peer sent more than its MaxPrefixes; it stays down until the
	// peer's configuration changes (see SetPeers).
	PrefixLimitExceeded bool
	// Received counts the prefixes the peer sent (before import policy).
	Received uint32
	// MaxPrefixes is the peer's effective prefix limit, 0 for none.
	MaxPrefixes uint32
	// BFD is the BFD session state ("Up", "Down", "Init", "AdminDown"),
	// empty when BFD is off for the peer.
	BFD string
	// Families are the address families the established session carries
	// (both sides announced them): "ipv4", "ipv6"; empty when the session
	// is not established.
	Families []string
	// Syncing says the session is Established but the peer has not sent
	// End-of-RIB since it came up: its routes may still be on their way
	// (a peer that restarted sends them only after its own deferral).
	Syncing bool
}

// Speaker is a BGP speaker. Its methods are safe for concurrent use.
// SetPeers and SetAdvertisements are level-triggered and idempotent: each call
// states the complete desired set and may be repeated with the same value.
type Speaker interface {
	// Start starts the speaker. It may be called once.
	Start(ctx context.Context, cfg Config) error
	// SetPeers reconciles the configured peers with peers: it adds
	// missing ones, updates changed ones and deletes the rest.
	SetPeers(ctx context.Context, peers []Peer) error
	// SetAdvertisements reconciles the paths we originate (next hop =
	// RouterID, RouterID6 for IPv6 prefixes; origin IGP; the
	// advertisement's communities), withdrawing those no longer listed
	// and re-sending those whose attributes changed. Each prefix may be
	// listed once. IPv6 prefixes need Config.RouterID6.
	SetAdvertisements(ctx context.Context, ads []Advertisement) error
	// SetPolicy replaces the cluster-wide import policy input (pools).
	// Changes apply to live sessions without resetting them (the
	// speaker re-applies its policies to what it already received).
	SetPolicy(ctx context.Context, pol Policy) error
	// Routes delivers, after each change, the full current set of best
	// routes learned from peers. Only the latest set matters: a slow
	// reader misses intermediate sets, never the last one. With
	// Config.LocalRestarting the first set waits until every peer has
	// sent End-of-RIB (at most DeferralTime). The channel is closed by
	// Stop.
	Routes() <-chan []LearnedRoute
	// Peers reports the state of every configured peer, sorted by address,
	// as GoBGP lists it, with the prefixes each peer sent (Received). It
	// is a GoBGP management call that counts every peer's Adj-RIB-In
	// while it stops every session's UPDATE handling, and it can wait
	// seconds while GoBGP resets a session: call it when the counts are
	// wanted, at a slow pace (see Sessions).
	Peers(ctx context.Context) ([]PeerStatus, error)
	// Sessions reports every configured peer's session, sorted by
	// address, as the speaker follows it from GoBGP's events: the same
	// fields as Peers but Received (zero), without asking GoBGP, so it
	// never waits. SessionsChanged is signalled (coalesced; never closed)
	// after each change of what Sessions reports.
	Sessions() []PeerStatus
	SessionsChanged() <-chan struct{}
	// Stop stops the speaker. Graceful keeps our routes at peers that
	// support graceful restart: the sessions are closed without a BGP
	// NOTIFICATION, which the peers treat as a restart and so keep our
	// routes (as stale) for the restart time.
	Stop(graceful bool) error
}
