package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/lab"
)

// TestDualStack: a dual-stack lab of three nodes, each with an IPv6 fabric
// address; BGP carries IPv6 over the IPv4 sessions (MP-BGP). Every session
// carries both families, every node routes every other node's IPv6 blocks
// via that node's IPv6 address (upLab's WaitRoutes), every pod pings every
// other pod over IPv6 and over IPv4, and TCP works both ways over IPv6
// between pods on different nodes, each side seeing the other's own
// address. IPv6-only pods added beside them reach them and each other.
func TestDualStack(t *testing.T) {
	l := upLab(t, lab.Options{Name: "g17ds", Nodes: 3, PodsPerNode: 2, DualStack: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range l.State().Nodes {
		st, err := l.NodeStatus(ctx, n.Name)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range st.Peers {
			if strings.Join(p.Families, ",") != "ipv4,ipv6" {
				t.Errorf("%s: session to %s carries %v, want ipv4 and ipv6", n.Name, p.Address, p.Families)
			}
		}
		if len(st.Peers) != 2 {
			t.Errorf("%s has %d sessions, want 2", n.Name, len(st.Peers))
		}
	}

	type pod struct {
		name, node string
		v4, v6     netip.Addr
	}
	var pods []pod
	for _, p := range l.State().Pods {
		q := pod{name: p.Name, node: p.Node}
		for _, ip := range p.IPs {
			if ip.Addr().Is4() {
				q.v4 = ip.Addr()
			} else {
				q.v6 = ip.Addr()
			}
		}
		if !q.v4.IsValid() || !q.v6.IsValid() {
			t.Fatalf("pod %s has addresses %v, want one of each family", p.Name, p.IPs)
		}
		pods = append(pods, q)
	}
	if len(pods) != 6 {
		t.Fatalf("%d pods, want 6", len(pods))
	}

	pctx, pcancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer pcancel()
	var failed []string
	for _, from := range pods {
		for _, to := range pods {
			if from.name == to.name {
				continue
			}
			for _, ip := range []netip.Addr{to.v6, to.v4} {
				// One retry: a first packet may wait for neighbour
				// discovery.
				if err := l.Ping(pctx, from.name, ip); err != nil {
					if err := l.Ping(pctx, from.name, ip); err != nil {
						failed = append(failed, fmt.Sprintf("%s(%s) -> %s(%s)", from.name, from.node, to.name, ip))
					}
				}
			}
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d pings failed:\n%s", len(failed), 2*len(pods)*(len(pods)-1), strings.Join(failed, "\n"))
	}

	// TCP both ways over IPv6 between pods on different nodes.
	var a, b pod
	for _, p := range pods {
		if p.node != pods[0].node {
			a, b = pods[0], p
			break
		}
	}
	for _, pair := range [][2]pod{{a, b}, {b, a}} {
		server, client := pair[0], pair[1]
		got := tcp6Exchange(t, l, server.name, client.name, netip.AddrPortFrom(server.v6, 8086))
		if want := client.v6.String(); got != want {
			t.Errorf("TCP over IPv6 %s -> %s: the server saw %q, want %q", client.name, server.name, got, want)
		}
	}

	// IPv6-only pods (tabby-lab up --ipv6 makes every pod one) beside the
	// dual-stack ones: an IPv6 address and no IPv4 one; they reach each
	// other across nodes and the dual-stack pods over IPv6.
	var six []pod
	for i, n := range l.State().Nodes {
		name := fmt.Sprintf("v6only%d", i+1)
		p, err := l.AddPod(pctx, n.Name, name, lab.PodOptions{IPv6Only: true})
		if err != nil {
			t.Fatalf("adding IPv6-only pod %s: %v", name, err)
		}
		if len(p.IPs) != 1 || !p.IPs[0].Addr().Is6() || p.IPs[0].Bits() != 128 {
			t.Fatalf("IPv6-only pod %s has addresses %v, want one IPv6 /128", name, p.IPs)
		}
		six = append(six, pod{name: name, node: n.Name, v6: p.IPs[0].Addr()})
	}
	failed = nil
	for i, from := range six {
		for _, to := range append([]pod{six[(i+1)%len(six)]}, pods...) {
			if err := l.Ping(pctx, from.name, to.v6); err != nil {
				if err := l.Ping(pctx, from.name, to.v6); err != nil {
					failed = append(failed, fmt.Sprintf("%s(%s) -> %s(%s)", from.name, from.node, to.name, to.v6))
				}
			}
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d pings from IPv6-only pods failed:\n%s", len(failed), strings.Join(failed, "\n"))
	}
	got := tcp6Exchange(t, l, six[0].name, six[1].name, netip.AddrPortFrom(six[0].v6, 8087))
	if want := six[1].v6.String(); got != want {
		t.Errorf("TCP over IPv6 between IPv6-only pods: the server saw %q, want %q", got, want)
	}
}

const dualStackHelperEnv = "TABBY_E2E_DUALSTACK_HELPER"

// TestDualStackHelperProcess is not a test: inside a pod's namespace it
// runs "serve6 PORT" (accept one IPv6 TCP connection, answer the peer's
// address; "ready" on stdout once listening) or "dial6 ADDR:PORT" (print
// the answer).
func TestDualStackHelperProcess(t *testing.T) {
	if os.Getenv(dualStackHelperEnv) != "1" {
		t.Skip("helper process for TestDualStack, not a test")
	}
	args := flagArgs()
	err := fmt.Errorf("bad arguments %q", args)
	if len(args) == 2 {
		switch args[0] {
		case "serve6":
			err = serve6(args[1])
		case "dial6":
			err = dial6(args[1])
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dual-stack helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serve6(port string) error {
	ln, err := net.Listen("tcp6", "[::]:"+port)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Println("ready")
	if tl, ok := ln.(*net.TCPListener); ok {
		_ = tl.SetDeadline(time.Now().Add(30 * time.Second))
	}
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = fmt.Fprintln(c, c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap())
	return err
}

func dial6(addr string) error {
	c, err := net.DialTimeout("tcp6", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	fmt.Print(line)
	return nil
}

// tcp6Exchange serves one connection in pod server on addr, connects from
// pod client and returns the peer address the server saw.
func tcp6Exchange(t *testing.T, l *lab.Lab, server, client string, addr netip.AddrPort) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	helper := func(target string, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + netnsPath(t, l, target), "--", os.Args[0], "-test.run=^TestDualStackHelperProcess$", "--"}, args...)...)
		cmd.Env = append(os.Environ(), dualStackHelperEnv+"=1")
		return cmd
	}
	srv := helper(server, "serve6", fmt.Sprint(addr.Port()))
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	srv.Stderr = &stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	}()
	r := bufio.NewReader(out)
	if line, err := r.ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("IPv6 server in %s did not start: %q %v %s", server, line, err, stderr.String())
	}
	answer, err := helper(client, "dial6", addr.String()).CombinedOutput()
	if err != nil {
		t.Fatalf("TCP over IPv6 %s -> %s (%s): %v: %s", client, server, addr, err, answer)
	}
	return strings.TrimSpace(string(answer))
}
