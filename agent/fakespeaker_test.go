package agent

import (
	"context"
	"net/netip"
	"slices"
	"sync"

	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/bgp/session"
)

// fakeSpeaker records what the agent asks of BGP.
type fakeSpeaker struct {
	mu         sync.Mutex
	cfg        bgp.Config
	peers      []bgp.Peer
	advertised []netip.Prefix
	ads        []bgp.Advertisement
	routes     chan []bgp.LearnedRoute
	stopped    bool
	graceful   bool
	// received is what Peers counts for every peer; lists counts its calls.
	received uint32
	lists    int
}

func newFakeSpeaker() *fakeSpeaker {
	return &fakeSpeaker{routes: make(chan []bgp.LearnedRoute, 1)}
}

func (f *fakeSpeaker) Start(ctx context.Context, cfg bgp.Config) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cfg = cfg
	return nil
}

func (f *fakeSpeaker) SetPeers(ctx context.Context, peers []bgp.Peer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.peers = slices.Clone(peers)
	return nil
}

func (f *fakeSpeaker) SetAdvertisements(ctx context.Context, ads []bgp.Advertisement) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.advertised = bgp.Prefixes(ads)
	f.ads = slices.Clone(ads)
	return nil
}

func (f *fakeSpeaker) SetPolicy(ctx context.Context, pol bgp.Policy) error { return nil }

func (f *fakeSpeaker) Routes() <-chan []bgp.LearnedRoute { return f.routes }

// learn replaces the learned set, dropping an unread older one.
func (f *fakeSpeaker) learn(rs []bgp.LearnedRoute) {
	select {
	case <-f.routes:
	default:
	}
	f.routes <- rs
}

func (f *fakeSpeaker) Peers(ctx context.Context) ([]bgp.PeerStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	return f.sessions(f.received), nil
}

func (f *fakeSpeaker) Sessions() []bgp.PeerStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sessions(0)
}

// sessions is every peer Established. Called with f.mu held.
func (f *fakeSpeaker) sessions(received uint32) []bgp.PeerStatus {
	var out []bgp.PeerStatus
	for _, p := range f.peers {
		out = append(out, bgp.PeerStatus{Address: p.Address, Type: p.Type, State: session.Established, Received: received})
	}
	return out
}

func (f *fakeSpeaker) SessionsChanged() <-chan struct{} { return nil }

func (f *fakeSpeaker) Stop(graceful bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped, f.graceful = true, graceful
	return nil
}

func (f *fakeSpeaker) snapshot() ([]bgp.Peer, []netip.Prefix) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.peers), slices.Clone(f.advertised)
}
