package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/bgp/session"
)

// refSpeakers is the reference of the propagation benchmark: the same BGP
// topology as the lab (full mesh, or every node a client of rr reflectors)
// made of bare speakers in this process on loopback addresses, without
// agents, etcd or kernels. What the lab adds on top of it is the agents'
// cost.
type refSpeakers struct {
	sps    []bgp.Speaker
	addrs  []netip.Addr
	mu     sync.Mutex
	latest []map[netip.Prefix]bool
	change chan struct{} // closed and replaced on every delivery
	adv    []netip.Prefix
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func freeLoopbackPort(b *testing.B) int32 {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return int32(l.Addr().(*net.TCPAddr).Port)
}

// startRefSpeakers starts n speakers on 127.77.<n>.x, meshed when rr is 0,
// else the first rr reflect to the others, and waits for every session.
func startRefSpeakers(b *testing.B, n, rr int) *refSpeakers {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &refSpeakers{cancel: cancel, change: make(chan struct{})}
	port := freeLoopbackPort(b)
	for i := range n {
		r.addrs = append(r.addrs, netip.AddrFrom4([4]byte{127, 77, byte(n), byte(i + 1)}))
	}
	pools := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for i, a := range r.addrs {
		cfg := bgp.Config{RouterID: a, ASN: api.DefaultASNumber, ListenAddr: a, ListenPort: port, GracefulRestart: true}
		if i < rr {
			cfg.ClusterID = "244.0.0.1"
		}
		sp := bgp.NewSpeaker(nil)
		if err := sp.Start(ctx, cfg); err != nil {
			r.stop()
			b.Fatalf("starting reference speaker %d: %v", i, err)
		}
		r.sps = append(r.sps, sp)
		r.latest = append(r.latest, map[netip.Prefix]bool{})
		if err := sp.SetPolicy(ctx, bgp.Policy{Pools: pools}); err != nil {
			r.stop()
			b.Fatal(err)
		}
		r.wg.Add(1)
		go r.watch(i, sp)
	}
	for i, a := range r.addrs {
		var peers []bgp.Peer
		for j, o := range r.addrs {
			if i == j {
				continue
			}
			p := bgp.Peer{Address: o, ASN: api.DefaultASNumber, Type: bgp.PeerMesh, ClusterNode: true, Port: uint16(port), LocalAddress: a}
			switch {
			case rr == 0:
			case i < rr && j < rr:
				p.Type = bgp.PeerRR
			case i < rr:
				p.Type, p.RRClient = bgp.PeerRRClient, true
			case j < rr:
				p.Type = bgp.PeerRR
			default:
				continue // clients talk to reflectors only
			}
			peers = append(peers, p)
		}
		if err := r.sps[i].SetPeers(ctx, peers); err != nil {
			r.stop()
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for i, sp := range r.sps {
		for {
			st, err := sp.Peers(ctx)
			if err == nil && len(st) > 0 && !slices.ContainsFunc(st, func(p bgp.PeerStatus) bool { return p.State != session.Established }) {
				break
			}
			if time.Now().After(deadline) {
				r.stop()
				b.Fatalf("reference speaker %d: sessions not established: %+v %v", i, st, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return r
}

func (r *refSpeakers) watch(i int, sp bgp.Speaker) {
	defer r.wg.Done()
	for rs := range sp.Routes() {
		m := map[netip.Prefix]bool{}
		for _, l := range rs {
			m[l.Prefix] = true
		}
		r.mu.Lock()
		r.latest[i] = m
		close(r.change)
		r.change = make(chan struct{})
		r.mu.Unlock()
	}
}

// propagate advertises p from the first speaker and returns how long until
// every other speaker has it.
func (r *refSpeakers) propagate(p netip.Prefix) (time.Duration, error) {
	r.adv = append(r.adv, p)
	start := time.Now()
	if err := r.sps[0].SetAdvertisements(context.Background(), bgp.AdvertisementsOf(r.adv)); err != nil {
		return 0, err
	}
	deadline := time.After(30 * time.Second)
	for {
		r.mu.Lock()
		missing := 0
		for i := 1; i < len(r.sps); i++ {
			if !r.latest[i][p] {
				missing++
			}
		}
		ch := r.change
		r.mu.Unlock()
		if missing == 0 {
			return time.Since(start), nil
		}
		select {
		case <-ch:
		case <-deadline:
			return 0, fmt.Errorf("%s reached only %d of %d speakers in 30 s", p, len(r.sps)-1-missing, len(r.sps)-1)
		}
	}
}

func (r *refSpeakers) stop() {
	for _, sp := range r.sps {
		_ = sp.Stop(false)
	}
	r.cancel()
	r.wg.Wait()
}

// referencePropagation measures iterations propagations of fresh /26s
// through bare speakers of the lab's topology.
func referencePropagation(b *testing.B, n, rr, iterations int) []time.Duration {
	b.Helper()
	r := startRefSpeakers(b, n, rr)
	defer r.stop()
	var out []time.Duration
	for k := range iterations {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 250, byte(k / 4), byte(k%4) * 64}), 26)
		d, err := r.propagate(p)
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}
