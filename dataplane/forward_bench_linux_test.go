package dataplane_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/policy"
)

// BenchmarkPrivilegedForward measures what a node's firewall costs traffic
// between two pods of the node as the number of local endpoints grows: TCP
// through the node namespace (veth pairs made by Setup) from a client pod
// to a server pod that policies select, with the ruleset compiled for the
// two pods alone and for the two among 500 local endpoints (scaleInput's
// 100 NetworkPolicies and global policy, plus one admitting the client to
// the server), applied by each backend in turn. Per backend the two sizes
// alternate (2, 500, 500, 2, …), five rounds, each test measuring for a
// second; after each apply a SYN to a port the policy does not admit must
// be dropped. The tests:
//
//	stream  bulk throughput (64 KiB writes), MB/s
//	rr      1-byte request and response on one connection, round trips/s
//	crr     a new connection per 1-byte request (policy evaluated per SYN), connections/s
//
// and reports the medians and the ratios 500 / 2 (1.0: no growth).
func BenchmarkPrivilegedForward(b *testing.B) {
	testkit.RequirePrivileged(b, "ip")
	ctx := context.Background()
	node, _, client, server, cspec, sspec := twoPods(b, "w16f")
	srv := startForwardServer(b, server)

	inputs := map[int]policy.Input{2: forwardInput(cspec, sspec, 0), 500: forwardInput(cspec, sspec, 498)}
	for _, size := range []int{2, 500} {
		rs := policy.Compile(inputs[size])
		b.Logf("%d local endpoints: %d chains, %d rules, %d sets", size, len(rs.Chains), totalRules(rs), len(rs.Sets))
	}
	for _, backend := range []string{"nftables", "iptables-" + dataplane.BackendNFT, "iptables-" + dataplane.BackendLegacy} {
		b.Run(backend, func(b *testing.B) {
			var f dataplane.Firewall
			var err error
			if mode, ok := strings.CutPrefix(backend, "iptables-"); ok {
				f, err = dataplane.NewIPTablesFirewall(dataplane.FirewallConfig{NetNS: node.Path, Backend: mode})
			} else {
				f, err = dataplane.NewNFTFirewall(dataplane.NFTConfig{NetNS: node.Path})
			}
			if err != nil {
				b.Skip(err)
			}
			defer func() {
				if err := f.Remove(ctx); err != nil {
					b.Error(err)
				}
			}()
			type key struct {
				size int
				test string
			}
			got := map[key][]float64{}
			for b.Loop() {
				for r := range forwardRounds {
					sizes := []int{2, 500}
					if r%2 == 1 {
						sizes = []int{500, 2} // against drift in the machine's load
					}
					for _, size := range sizes {
						if _, err := f.Apply(ctx, *policy.Compile(inputs[size])); err != nil {
							b.Fatal(err)
						}
						if err := deniedPort(client, srv); err != nil {
							b.Fatalf("%d endpoints: %v", size, err)
						}
						for _, m := range forwardTests {
							v, err := m.run(client, srv, time.Second)
							if err != nil {
								b.Fatalf("%s with %d endpoints: %v", m.name, size, err)
							}
							got[key{size, m.name}] = append(got[key{size, m.name}], v)
						}
					}
				}
			}
			for _, m := range forwardTests {
				small, large := median(got[key{2, m.name}]), median(got[key{500, m.name}])
				b.ReportMetric(small, m.name+"-2-"+m.unit)
				b.ReportMetric(large, m.name+"-500-"+m.unit)
				b.ReportMetric(large/small, m.name+"-500/2")
			}
		})
	}
}

// forwardInput is the node's policy input: the client and the server,
// plus others endpoints of scaleInput (with its policies), and a policy
// admitting the client to the server's ports.
func forwardInput(cspec, sspec dataplane.WorkloadSpec, others int) policy.Input {
	in := scaleInput(others)
	in.Endpoints = slices.Clone(in.Endpoints)
	ep := func(name, app string, s dataplane.WorkloadSpec) *api.WorkloadEndpoint {
		return &api.WorkloadEndpoint{
			Metadata: api.ObjectMeta{Name: name, Namespace: "ns0", Labels: map[string]string{"app": app}},
			Spec:     api.WorkloadEndpointSpec{Node: "n1", InterfaceName: s.HostIfName, IPNetworks: []string{s.Addrs[0].String()}},
		}
	}
	in.Endpoints = append(in.Endpoints, ep("client", "client", cspec), ep("server", "server", sspec))
	lo, hi := api.FromInt(forwardPort), int32(forwardPort+2)
	p := &api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: "ns0", Name: "server-ingress"}, Spec: api.NetworkPolicySpec{
		PodSelector: api.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
		Ingress: []api.NetworkPolicyIngressRule{{
			From:  []api.NetworkPolicyPeer{{PodSelector: &api.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
			Ports: []api.NetworkPolicyPort{{Port: &lo, EndPort: &hi}},
		}},
	}}
	p.SetDefaults()
	in.NetworkPolicies = append(slices.Clone(in.NetworkPolicies), p)
	return in
}

const (
	forwardPort   = 5001 // stream, rr, crr: 5001, 5002, 5003; 5004 is not admitted
	forwardRounds = 5
)

// deniedPort checks that the server's policy is in force: a SYN to a port
// it does not admit is dropped (a timeout), where without policy the
// server's kernel would refuse it at once.
func deniedPort(client testkit.NetNS, addr string) error {
	c, err := dialIn(client, addr, forwardPort+3)
	if err == nil {
		c.Close()
		return fmt.Errorf("port %d not admitted, yet connected", forwardPort+3)
	}
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		return fmt.Errorf("port %d not admitted: %v, want a timeout (dropped)", forwardPort+3, err)
	}
	return nil
}

// startForwardServer listens in the server pod: it discards what the
// stream port receives, echoes each byte on the rr port and answers one
// byte per connection on the crr port.
func startForwardServer(b *testing.B, server testkit.NetNS) string {
	b.Helper()
	const addr = "10.244.20.2"
	var ls []net.Listener
	if err := ns.WithNetNSPath(server.Path, func(ns.NetNS) error {
		for i := range 3 {
			l, err := net.Listen("tcp4", fmt.Sprintf("%s:%d", addr, forwardPort+i))
			if err != nil {
				return err
			}
			ls = append(ls, l)
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	serve := []func(net.Conn){
		func(c net.Conn) { _, _ = io.Copy(io.Discard, c) },
		func(c net.Conn) { _, _ = io.CopyBuffer(c, c, make([]byte, 1)) },
		func(c net.Conn) { _, _ = c.Write([]byte{1}) },
	}
	for i, l := range ls {
		b.Cleanup(func() { _ = l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					serve[i](c)
				}()
			}
		}()
	}
	return addr
}

type forwardTest struct {
	name, unit string
	run        func(client testkit.NetNS, addr string, d time.Duration) (float64, error)
}

var forwardTests = []forwardTest{
	{"stream", "MB/s", func(client testkit.NetNS, addr string, d time.Duration) (float64, error) {
		c, err := dialIn(client, addr, forwardPort)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		buf := make([]byte, 64<<10)
		var n int64
		start := time.Now()
		for time.Since(start) < d {
			k, err := c.Write(buf)
			n += int64(k)
			if err != nil {
				return 0, err
			}
		}
		return float64(n) / time.Since(start).Seconds() / 1e6, nil
	}},
	{"rr", "rt/s", func(client testkit.NetNS, addr string, d time.Duration) (float64, error) {
		c, err := dialIn(client, addr, forwardPort+1)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		buf := []byte{1}
		n := 0
		start := time.Now()
		for time.Since(start) < d {
			if _, err := c.Write(buf); err != nil {
				return 0, err
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				return 0, err
			}
			n++
		}
		return float64(n) / time.Since(start).Seconds(), nil
	}},
	{"crr", "conn/s", func(client testkit.NetNS, addr string, d time.Duration) (float64, error) {
		var n atomic.Int64
		start := time.Now()
		err := ns.WithNetNSPath(client.Path, func(ns.NetNS) error {
			buf := []byte{0}
			for time.Since(start) < d {
				c, err := net.DialTimeout("tcp4", fmt.Sprintf("%s:%d", addr, forwardPort+2), time.Second)
				if err != nil {
					return err
				}
				_, err = io.ReadFull(c, buf)
				_ = c.Close()
				if err != nil {
					return err
				}
				n.Add(1)
			}
			return nil
		})
		return float64(n.Load()) / time.Since(start).Seconds(), err
	}},
}

// dialIn connects from inside the client pod; the socket stays there.
func dialIn(client testkit.NetNS, addr string, port int) (net.Conn, error) {
	var c net.Conn
	err := ns.WithNetNSPath(client.Path, func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp4", fmt.Sprintf("%s:%d", addr, port), 300*time.Millisecond)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		return err
	})
	return c, err
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
