package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

const w19Listener = `
import socket, sys, threading
def serve(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], port))
    s.listen(16)
    while True:
        c, _ = s.accept()
        c.close()
for p in sys.argv[2:]:
    threading.Thread(target=serve, args=(int(p),), daemon=True).start()
threading.Event().wait()
`

const w19Connect = `
import socket, sys
socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()
`

// TestPodToHost: a pod's connections to its own node meet the
// endpoint-to-host action (Drop by default, on nftables; Accept, on
// iptables), the BGP port (the node guard) and the GoBGP API port are
// unreachable from the pod whatever the action, and the node's own connections to the pod (as kubelet probes)
// get their replies.
func TestPodToHost(t *testing.T) {
	for i, c := range []struct {
		backend, action string
		open            bool // the node's other services reachable from the pod
	}{
		{"nftables", "", false},
		{"iptables", "Accept", true},
	} {
		t.Run(c.backend+"-"+c.action, func(t *testing.T) {
			args := []string{"--firewall-backend", c.backend, "--gobgp-api", "127.0.0.1:50051"}
			if c.action != "" {
				args = append(args, "--endpoint-to-host-action", c.action)
			}
			l := upLab(t, lab.Options{Name: fmt.Sprintf("e2eh%d", i+1), Nodes: 1, AgentArgs: args})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			node := l.State().Nodes[0]
			nodeIP := node.IP.Addr().String()
			// Services on the node's address: 8080 (anything) and 50051 (the
			// GoBGP API's port; the API itself listens on loopback).
			srv := exec.Command("nsenter", "--net="+netnsPath(t, l, node.Name), "--", "python3", "-c", w19Listener, nodeIP, "8080", "50051")
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
			connect := func(target, port string) error {
				_, err := l.Exec(ctx, target, "python3", "-c", w19Connect, nodeIP, port)
				return err
			}
			testkit.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "the test listener to answer on the node itself", func() error {
				return connect(node.Name, "8080")
			})
			p, err := l.AddPod(ctx, node.Name, "w19-pod", lab.PodOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := connect(p.Name, "8080"); (err == nil) != c.open {
				t.Errorf("pod → node:8080: connected %v, want %v (%v)", err == nil, c.open, err)
			}
			// BGP (the node guard) and the GoBGP API's port stay closed
			// whatever the action.
			for _, port := range []string{"179", "50051"} {
				if err := connect(p.Name, port); err == nil {
					t.Errorf("pod → node:%s connected", port)
				}
			}
			// The node's own connection to the pod: its replies pass.
			if _, err := l.Exec(ctx, node.Name, "ping", "-c1", "-W1", "-n", p.IPs[0].Addr().String()); err != nil {
				t.Errorf("node → pod ping: %v", err)
			}
			t.Logf("%s, action %q: pod → node 8080 open=%v, 179 and 50051 closed, node → pod ok", c.backend, c.action, c.open)
		})
	}
}
