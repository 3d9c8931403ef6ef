package bgp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	gobgpapi "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"

	"github.com/tabbynet/tabby/bgp/session"
)

// sessionKey holds the Peer fields that need the session to be re-created
// when they change. GoBGP's UpdatePeer would not apply a change of the
// route-reflector flags, so we delete and re-add instead.
type sessionKey struct {
	asn          uint32
	password     string
	rrClient     bool
	restartTime  time.Duration
	localAddress netip.Addr
	port         uint16
	passive      bool
	maxPrefixes  uint32
	bfd          BFD // zero when off
	localASN     uint32
}

func (s *speaker) keyOf(p Peer) sessionKey {
	return sessionKey{p.ASN, p.Password, p.RRClient, p.RestartTime, p.LocalAddress, p.Port, s.passive(p), maxPrefixes(p), bfdTimers(p), p.LocalASN}
}

// bfdTimers returns p's effective BFD timers, the zero BFD when it is off.
func bfdTimers(p Peer) BFD {
	if p.BFD == nil {
		return BFD{}
	}
	b := *p.BFD
	if b.Interval <= 0 {
		b.Interval = DefaultBFDInterval
	}
	if b.Multiplier == 0 {
		b.Multiplier = DefaultBFDMultiplier
	}
	return b
}

// maxPrefixes is p's effective prefix limit, 0 for none.
func maxPrefixes(p Peer) uint32 {
	if p.MaxPrefixes == 0 && !p.IsCluster() {
		return DefaultExternalMaxPrefixes
	}
	return p.MaxPrefixes
}

// passive reports whether we wait for p to connect instead of connecting
// ourselves. Between two cluster nodes (mesh and reflector sessions, where
// both sides run this code) only the side with the higher address
// connects: GoBGP (v4.8.0 and v4.9.0) can leave both sides stuck in OpenConfirm when
// both connect at the same moment. Sessions with other routers stay active
// on our side.
func (s *speaker) passive(p Peer) bool {
	switch p.Type {
	case PeerMesh, PeerRR, PeerRRClient:
		local := p.LocalAddress
		if !local.IsValid() {
			local = s.cfg.RouterID
			if !p.Address.Is4() {
				local = s.cfg.RouterID6
			}
		}
		return local.Less(p.Address)
	}
	return false
}

// timers are p's hold time and keepalive interval, its own or the
// defaults of its kind of session (DefaultHold, DefaultReflectorHold).
func timers(p Peer) (hold, keepalive time.Duration) {
	defHold, defKeepalive := DefaultHold, DefaultKeepalive
	if p.Type == PeerRR || p.Type == PeerRRClient {
		defHold, defKeepalive = DefaultReflectorHold, DefaultReflectorKeepalive
	}
	hold, keepalive = p.Hold, p.Keepalive
	if hold <= 0 {
		hold = defHold
	}
	if keepalive <= 0 {
		keepalive = min(defKeepalive, hold/3)
	}
	return hold, keepalive
}

func seconds(d time.Duration) uint64 { return uint64((d + time.Second - 1) / time.Second) }

func (s *speaker) config() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// toAPIPeer builds GoBGP's peer configuration for p.
func (s *speaker) toAPIPeer(p Peer, localRestarting bool) *gobgpapi.Peer {
	hold, keepalive := timers(p)
	restart := p.RestartTime
	if restart <= 0 {
		restart = s.cfg.RestartTime
	}
	if restart <= 0 {
		restart = DefaultRestartTime
	}
	ap := &gobgpapi.Peer{
		Conf: &gobgpapi.PeerConf{
			NeighborAddress: p.Address.String(),
			PeerAsn:         p.ASN,
			LocalAsn:        p.LocalASN, // 0: the speaker's AS
			AuthPassword:    p.Password,
		},
		Timers: &gobgpapi.Timers{Config: &gobgpapi.TimersConfig{
			ConnectRetry:           seconds(ConnectRetry),
			HoldTime:               seconds(hold),
			KeepaliveInterval:      max(1, seconds(keepalive)),
			IdleHoldTimeAfterReset: seconds(ConnectRetry),
		}},
		Transport: &gobgpapi.Transport{RemotePort: uint32(p.Port), PassiveMode: s.passive(p)},
	}
	var afis []gobgpapi.Family_Afi
	if !s.cfg.IPv6Only {
		afis = append(afis, gobgpapi.Family_AFI_IP)
	}
	if s.cfg.RouterID6.IsValid() {
		// MP-BGP: both families on one session, of either family.
		afis = append(afis, gobgpapi.Family_AFI_IP6)
	}
	limit := maxPrefixes(p)
	for _, afi := range afis {
		af := &gobgpapi.AfiSafi{
			Config: &gobgpapi.AfiSafiConfig{
				Family:  &gobgpapi.Family{Afi: afi, Safi: gobgpapi.Family_SAFI_UNICAST},
				Enabled: true,
			},
			MpGracefulRestart: &gobgpapi.MpGracefulRestart{
				Config: &gobgpapi.MpGracefulRestartConfig{Enabled: s.cfg.GracefulRestart},
			},
		}
		if limit > 0 {
			// GoBGP counts per family: the limit holds for each.
			af.PrefixLimits = &gobgpapi.PrefixLimit{Family: af.Config.Family, MaxPrefixes: limit}
		}
		ap.AfiSafis = append(ap.AfiSafis, af)
	}
	if p.LocalAddress.IsValid() {
		ap.Transport.LocalAddress = p.LocalAddress.String()
	}
	if b := bfdTimers(p); b != (BFD{}) {
		us := uint32(min(b.Interval/time.Microsecond, 1<<32-1))
		ap.Bfd = &gobgpapi.BfdPeerConfig{Enabled: true, DesiredMinimumTxInterval: us, RequiredMinimumReceive: us, DetectionMultiplier: uint32(b.Multiplier)}
	}
	if s.cfg.GracefulRestart {
		ap.GracefulRestart = &gobgpapi.GracefulRestart{
			Enabled:         true,
			RestartTime:     uint32(min(seconds(restart), 4095)),
			DeferralTime:    uint32(seconds(DeferralTime)),
			LocalRestarting: localRestarting,
		}
	}
	if p.RRClient {
		clusterID := s.cfg.ClusterID
		if clusterID == "" {
			clusterID = s.cfg.RouterID.String()
		}
		ap.RouteReflector = &gobgpapi.RouteReflector{RouteReflectorClient: true, RouteReflectorClusterId: clusterID}
	}
	return ap
}

// SetPeers implements Speaker. It diffs against the peers GoBGP actually
// has, adds before it deletes, keeps going after a failure and returns
// every error.
func (s *speaker) SetPeers(ctx context.Context, peers []Peer) error {
	desired := map[netip.Addr]Peer{}
	var errs []error
	cfg := s.config()
	for _, p := range peers {
		switch {
		case !p.Address.IsValid() || p.Address.Is4In6() || p.Address.Zone() != "":
			errs = append(errs, fmt.Errorf("peer %v: not a plain IPv4 or IPv6 address", p.Address))
		case !p.Address.Is4() && !cfg.RouterID6.IsValid():
			errs = append(errs, fmt.Errorf("peer %v: an IPv6 peer needs the node's IPv6 address (spec.bgp.ipv6Address)", p.Address))
		case p.Address.Is4() && cfg.IPv6Only:
			errs = append(errs, fmt.Errorf("peer %v: an IPv4 peer needs the node's IPv4 address (spec.bgp.ipv4Address)", p.Address))
		case p.ASN == 0:
			errs = append(errs, fmt.Errorf("peer %v: ASN must not be 0", p.Address))
		case p.Address == cfg.RouterID || p.Address == cfg.RouterID6:
			errs = append(errs, fmt.Errorf("peer %v: that is our own address", p.Address))
		default:
			desired[p.Address] = p
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil || s.stopped {
		return errors.New("speaker not running")
	}
	actual := map[netip.Addr]bool{}
	err := s.srv.ListPeer(ctx, &gobgpapi.ListPeerRequest{}, func(p *gobgpapi.Peer) {
		if p.Conf == nil {
			return
		}
		if a, err := netip.ParseAddr(p.Conf.NeighborAddress); err == nil {
			actual[a] = true
		}
	})
	if err != nil {
		return fmt.Errorf("listing BGP peers: %w", err)
	}
	// The policy names the desired peers before any of them is added, so
	// a new session never sees a policy that does not know it.
	if err := s.applyPolicy(ctx, sortedPeers(desired)); err != nil {
		errs = append(errs, err)
	}
	// Peers added in the first DeferralTime after a restart announce it.
	restarting := s.cfg.LocalRestarting && time.Since(s.startedAt) < DeferralTime

	addrs := make([]netip.Addr, 0, len(desired))
	for a := range desired {
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range addrs {
		p := desired[a]
		old, known := s.peers[a]
		switch {
		case !actual[a]:
			if err := s.srv.AddPeer(ctx, &gobgpapi.AddPeerRequest{Peer: s.toAPIPeer(p, restarting)}); err != nil {
				errs = append(errs, fmt.Errorf("adding peer %v: %w", a, err))
				s.dropPeer(a)
				continue
			}
			s.sessions.created(a, time.Now())
		case !known || s.keyOf(old) != s.keyOf(p):
			if err := s.recreatePeer(ctx, p); err != nil {
				errs = append(errs, err)
				continue
			}
		case old.Hold != p.Hold || old.Keepalive != p.Keepalive:
			// Takes effect with the next session (hold time is negotiated).
			if _, err := s.srv.UpdatePeer(ctx, &gobgpapi.UpdatePeerRequest{Peer: s.toAPIPeer(p, false)}); err != nil {
				errs = append(errs, fmt.Errorf("updating peer %v: %w", a, err))
				continue
			}
		}
		s.putPeer(p)
	}
	for a := range actual {
		if _, ok := desired[a]; ok {
			continue
		}
		if err := s.srv.DeletePeer(ctx, &gobgpapi.DeletePeerRequest{Address: a.String()}); err != nil {
			errs = append(errs, fmt.Errorf("deleting peer %v: %w", a, err))
			continue
		}
		s.dropPeer(a)
		s.sessions.forget(a)
	}
	s.peersSet = true
	s.setBFDPeers(s.peers)
	s.markDirty()
	return errors.Join(errs...)
}

// putPeer records p as configured. A new address clears the cached order
// of the peers (sortedPeerAddrs); s.peers changes only here and in dropPeer.
// Called with s.mu held.
func (s *speaker) putPeer(p Peer) {
	if _, known := s.peers[p.Address]; !known {
		s.sessions.order = nil
	}
	s.peers[p.Address] = p
}

// dropPeer forgets a's configuration and clears the cached order of the
// peers. Called with s.mu held.
func (s *speaker) dropPeer(a netip.Addr) {
	if _, known := s.peers[a]; known {
		delete(s.peers, a)
		s.sessions.order = nil
	}
}

// recreatePeer deletes and re-adds p's session. Called with s.mu held.
func (s *speaker) recreatePeer(ctx context.Context, p Peer) error {
	if err := s.srv.DeletePeer(ctx, &gobgpapi.DeletePeerRequest{Address: p.Address.String()}); err != nil {
		return fmt.Errorf("re-creating peer %v: deleting: %w", p.Address, err)
	}
	if err := s.srv.AddPeer(ctx, &gobgpapi.AddPeerRequest{Peer: s.toAPIPeer(p, false)}); err != nil {
		s.dropPeer(p.Address)
		return fmt.Errorf("re-creating peer %v: adding: %w", p.Address, err)
	}
	s.sessions.created(p.Address, time.Now())
	return nil
}

// resetStuckPeers re-creates sessions that have sat in OpenSent or
// OpenConfirm for longer than stuckTimeout. A healthy session passes these
// states in milliseconds; GoBGP (v4.8.0 and v4.9.0) can get stuck in OpenConfirm after a
// connection collision (it arms no hold timer there on a first session).
func (s *speaker) resetStuckPeers(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil || s.stopped {
		return
	}
	// The session states come from GoBGP's peer events (onPeerEvent): an
	// idle speaker asks GoBGP nothing here.
	for _, a := range s.sessions.stuck(time.Now(), stuckTimeout) {
		p, ok := s.peers[a]
		if !ok {
			continue
		}
		s.log.Info("re-creating BGP session stuck while opening", "peer", a)
		if err := s.recreatePeer(ctx, p); err != nil {
			s.log.Warn("re-creating stuck BGP session", "peer", a, "err", err)
		}
	}
}

// Peers implements Speaker.
func (s *speaker) Peers(ctx context.Context) ([]PeerStatus, error) {
	s.mu.Lock()
	srv := s.srv
	stopped := s.stopped
	s.mu.Unlock()
	if srv == nil || stopped {
		return nil, errors.New("speaker not running")
	}
	var out []PeerStatus
	err := srv.ListPeer(ctx, &gobgpapi.ListPeerRequest{}, func(p *gobgpapi.Peer) {
		if p.Conf == nil {
			return
		}
		a, err := netip.ParseAddr(p.Conf.NeighborAddress)
		if err != nil {
			return
		}
		st := PeerStatus{Address: a, State: session.Idle}
		if p.State != nil {
			st.State = apiState(p.State.SessionState)
			st.PrefixLimitExceeded = p.State.AdminState == gobgpapi.PeerState_ADMIN_STATE_PFX_CT
			if p.GetBfd().GetEnabled() {
				st.BFD = bfdStateName(p.State.GetBfdState().GetSessionState())
			}
			if st.State == session.Established {
				st.Families = negotiatedFamilies(p.State)
			}
		}
		for _, af := range p.AfiSafis {
			if af.State != nil {
				st.Received += uint32(min(af.State.Received, 1<<32-1))
			}
		}
		if p.Timers != nil && p.Timers.State != nil {
			if st.State == session.Established && p.Timers.State.Uptime != nil {
				st.Since = p.Timers.State.Uptime.AsTime()
			} else if p.Timers.State.Downtime != nil {
				st.Since = p.Timers.State.Downtime.AsTime()
			}
		}
		out = append(out, st)
	})
	if err != nil {
		return nil, fmt.Errorf("listing BGP peers: %w", err)
	}
	s.mu.Lock()
	s.annotate(out)
	s.mu.Unlock()
	// A peer the BFD watch found silent is Down (its routes are gone)
	// even while GoBGP, still resetting the session, says Up.
	s.bfdMu.Lock()
	for i := range out {
		if s.bfdDown[out[i].Address] && out[i].BFD == "Up" {
			out[i].BFD = "Down"
		}
	}
	s.bfdMu.Unlock()
	slices.SortFunc(out, func(a, b PeerStatus) int { return a.Address.Compare(b.Address) })
	return out, nil
}

// negotiatedFamilies lists the unicast families both sides of a session
// announced in their OPEN (multiprotocol capabilities).
func negotiatedFamilies(st *gobgpapi.PeerState) []string {
	announced := func(caps []*gobgpapi.Capability) map[string]bool {
		m := map[string]bool{}
		for _, c := range caps {
			f := c.GetMultiProtocol().GetFamily()
			switch {
			case f == nil || f.Safi != gobgpapi.Family_SAFI_UNICAST:
			case f.Afi == gobgpapi.Family_AFI_IP:
				m["ipv4"] = true
			case f.Afi == gobgpapi.Family_AFI_IP6:
				m["ipv6"] = true
			}
		}
		return m
	}
	return bothFamilies(announced(st.LocalCap), announced(st.RemoteCap))
}

// bothFamilies lists, in the order ipv4, ipv6, the families both sides
// announced.
func bothFamilies(local, remote map[string]bool) []string {
	var out []string
	for _, f := range []string{"ipv4", "ipv6"} {
		if local[f] && remote[f] {
			out = append(out, f)
		}
	}
	return out
}

func bfdStateName(st gobgpapi.BfdSessionState) string {
	switch st {
	case gobgpapi.BfdSessionState_BFD_SESSION_STATE_UP:
		return "Up"
	case gobgpapi.BfdSessionState_BFD_SESSION_STATE_INIT:
		return "Init"
	case gobgpapi.BfdSessionState_BFD_SESSION_STATE_ADMIN_DOWN:
		return "AdminDown"
	default:
		return "Down"
	}
}

// disconnectInfo renders a peer event's disconnect reason for PeerStatus.Info.
func disconnectInfo(ev *apiutil.WatchEventMessage_PeerEvent) string {
	r := ev.Peer.State.DisconnectReason
	if r == gobgpapi.PeerState_DISCONNECT_REASON_UNSPECIFIED {
		return ""
	}
	s := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(r.String(), "DISCONNECT_REASON_"), "_", " "))
	if m := ev.Peer.State.DisconnectMessage; m != "" {
		s += ": " + m
	}
	return s
}
