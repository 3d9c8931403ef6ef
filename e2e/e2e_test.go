// Package e2e holds Tabby's end-to-end tests: real agents, the real CNI
// plugin and etcd in a network-namespace lab (package lab). They need
// root and skip with a message otherwise.
package e2e

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

const runDir = "/run/tabby-e2e"

// upLab brings up a lab that is torn down when the test ends, also when it fails.
func upLab(t *testing.T, o lab.Options) *lab.Lab {
	t.Helper()
	testkit.RequirePrivileged(t, "ip", "nsenter", "ping")
	o.RunDir = runDir
	o.BinDir = os.Getenv("TABBY_BIN")
	o.Log = testWriter{t}
	// A lab left by an earlier crashed run of the same test goes first.
	_ = lab.Teardown(context.Background(), runDir, o.Name, io.Discard)
	// 3 minutes, and 5 s more per node beyond 10 (30-node labs under load).
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute+time.Duration(max(o.Nodes-10, 0))*5*time.Second)
	defer cancel()
	l, err := lab.Up(ctx, o)
	if err != nil {
		_ = lab.Teardown(context.Background(), runDir, o.Name, io.Discard)
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, l)
		}
		if err := l.Down(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	wctx, wcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer wcancel()
	if err := l.WaitEstablished(wctx); err != nil {
		t.Fatal(err)
	}
	if err := l.WaitRoutes(wctx); err != nil {
		t.Fatal(err)
	}
	return l
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func dumpLogs(t *testing.T, l *lab.Lab) {
	for _, n := range l.State().Nodes {
		if n.Agent == nil {
			continue
		}
		b, err := os.ReadFile(n.Agent.Log)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		t.Logf("last lines of %s's agent log:\n%s", n.Name, strings.Join(lines, "\n"))
	}
}

func podIP(t *testing.T, l *lab.Lab, name string) netip.Addr {
	t.Helper()
	for _, p := range l.State().Pods {
		if p.Name == name && len(p.IPs) > 0 {
			return p.IPs[0].Addr()
		}
	}
	t.Fatalf("pod %s has no address", name)
	return netip.Addr{}
}

// pingMatrix pings every pod from every pod and reports every failure.
func pingMatrix(t *testing.T, l *lab.Lab) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A pod whose ADD failed, and the DEL after it, has no address.
	var pods []lab.PodState
	for _, p := range l.State().Pods {
		if len(p.IPs) > 0 {
			pods = append(pods, p)
		}
	}
	var failed []string
	for _, from := range pods {
		for _, to := range pods {
			if from.Name == to.Name {
				continue
			}
			ip := to.IPs[0].Addr()
			// One retry: a first packet may wait for ARP.
			if err := l.Ping(ctx, from.Name, ip); err != nil {
				if err := l.Ping(ctx, from.Name, ip); err != nil {
					failed = append(failed, fmt.Sprintf("%s(%s) -> %s(%s)", from.Name, from.Node, to.Name, ip))
				}
			}
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d pings failed:\n%s", len(failed), len(pods)*(len(pods)-1), strings.Join(failed, "\n"))
	}
}

// netnsPath is the path of a lab pod's or node's network namespace.
func netnsPath(t testing.TB, l *lab.Lab, target string) string {
	t.Helper()
	ns, err := l.ResolveNetNS(target)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ns, "/") {
		ns = "/run/netns/" + ns
	}
	return ns
}

func flagArgs() []string {
	for i, a := range os.Args {
		if a == "--" {
			return os.Args[i+1:]
		}
	}
	return nil
}

// tcpExchange runs a server in pod `server` and connects to it from pod
// `client` (both the policy helper process) and checks the server saw the
// client's own address (no NAT inside the cluster).
func tcpExchange(t *testing.T, l *lab.Lab, server, client string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	addr := netip.AddrPortFrom(podIP(t, l, server), 8080)
	startPolicyServer(t, l, server, server, []int{int(addr.Port())}, nil)
	r := probeFrom(ctx, t, l, client, "tcp", addr)
	if r.err != nil || !r.allowed {
		t.Fatalf("TCP %s -> %s: no answer (%v)", client, server, r.err)
	}
	if want := fmt.Sprintf("%s %s", server, podIP(t, l, client)); r.answer != want {
		t.Errorf("TCP %s -> %s: got %q, want %q", client, server, r.answer, want)
	}
}
