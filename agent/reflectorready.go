package agent

import (
	"context"
	"net/netip"
	"time"

	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/bgp/session"
)

// reflectorReadiness is how an elected reflector tells the reflectors of
// its zone elected before it that it has every session of its role (make
// before break, docs/bgp.md "Promotion"): until then they keep sending it
// every route, as to the client it was. The owner's mu guards it.
type reflectorReadiness struct {
	// readyFor is the reflectors' reports (bgp.PeerInput.Ready), isLive
	// whether a node's liveness record is there; both from the elector.
	readyFor func() map[string]time.Time
	isLive   func(node string) bool
	// publish re-publishes the liveness record, which carries
	// readyAt (readyReported).
	publish func(context.Context) error

	// peersElected is this node's election (Reflector.Since) in the
	// choice the last peers pass planned with, zero when it was not
	// elected; plannedPeers the peers it planned, peersSpeaker the
	// speaker it gave them, statusSpeaker the one the last session read
	// came from.
	peersElected  time.Time
	plannedPeers  []bgp.Peer
	peersSpeaker  bgp.Speaker
	statusSpeaker bgp.Speaker
	// readyAt is the election reported ready (in the liveness record),
	// published whether that report reached etcd.
	readyAt   time.Time
	published bool
}

// readyReported is the election this node reports its reflector sessions
// ready for (liveness.ReflectorReady), zero for none. Nil-safe: the
// liveness record is first published before the BGP owner exists.
func (b *bgpOwner) readyReported() time.Time {
	if b == nil {
		return time.Time{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.readyAt
}

// notePeersPlanned records, after a peers pass, this node's election in
// the choice it planned with and the speaker that got the peers.
func (b *bgpOwner) notePeersPlanned(c *bgp.ReflectorChoice, desired []bgp.Peer, sp bgp.Speaker) {
	var at time.Time
	if r, ok := c.Find(b.node); ok {
		at = r.Since
	}
	b.mu.Lock()
	b.peersElected, b.plannedPeers, b.peersSpeaker = at, desired, sp
	b.mu.Unlock()
}

// checkReflectorReady reports this node's reflector sessions ready, once
// per election, when the last peers pass planned them for its current
// election on the running speaker and every one of them is ready
// (reflectorReady). A report that did not reach etcd is tried again on
// the next call.
func (b *bgpOwner) checkReflectorReady(ctx context.Context) {
	b.mu.Lock()
	at := b.peersElected
	due := !at.IsZero() && b.publish != nil && b.peersSpeaker != nil && b.peersSpeaker == b.statusSpeaker &&
		!(b.published && b.readyAt.Equal(at))
	desired, status, isLive := b.plannedPeers, b.peerStatus, b.isLive
	b.mu.Unlock()
	if !due || !reflectorReady(desired, status, isLive) {
		return
	}
	b.mu.Lock()
	b.readyAt, b.published = at, false
	b.mu.Unlock()
	if err := b.publish(ctx); err != nil {
		b.log.Warn("reporting the reflector's sessions ready", "err", err)
		return
	}
	b.mu.Lock()
	b.published = b.readyAt.Equal(at)
	b.mu.Unlock()
	b.log.Info("reflector sessions ready, reported: a reflector of this zone elected before this one sends it its own routes only from now", "elected", at)
}

// reflectorReady reports whether every session to a cluster node in
// desired whose liveness record is there (isLive; nil: every node) is
// Established in status, and those to other reflectors (type rr: the
// other zones' and the earlier of its own, Tabby agents that send
// End-of-RIB) past their End-of-RIB: a reflector that has them holds
// every route its role gives it, and every peer holds its own. A client
// only has to be up: its routes are its own few, and a simulated node
// sends no End-of-RIB. A node without liveness (its agent dead or gone)
// cannot hold a reflector back.
func reflectorReady(desired []bgp.Peer, status []bgp.PeerStatus, isLive func(string) bool) bool {
	type state struct{ up, synced bool }
	got := make(map[netip.Addr]state, len(status))
	for _, st := range status {
		up := st.State == session.Established
		got[st.Address] = state{up, up && !st.Syncing}
	}
	for _, p := range desired {
		if !p.ClusterNode || (isLive != nil && !isLive(p.Name)) {
			continue
		}
		if st := got[p.Address]; !st.up || (p.Type == bgp.PeerRR && !st.synced) {
			return false
		}
	}
	return true
}
