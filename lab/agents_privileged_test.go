package lab

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/internal/testkit"
)

// TestPrivilegedAgents runs the lab with real agents and pods: sessions,
// routes, pod-to-pod pings, a node joining and leaving, an agent restart.
// It needs the binaries in $TABBY_BIN (make test sets it) so that it does
// not spend the package's time budget on building them.
func TestPrivilegedAgents(t *testing.T) {
	testkit.RequirePrivileged(t)
	bin := os.Getenv("TABBY_BIN")
	if bin == "" {
		t.Skip("TABBY_BIN is not set: skipping the lab test with agents (make test sets it to bin/)")
	}
	name, runDir := uniqueName(t), t.TempDir()
	var log bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	l, err := Up(ctx, Options{Name: name, Nodes: 2, PodsPerNode: 1, RunDir: runDir, BinDir: bin, Log: &log})
	if err != nil {
		t.Fatalf("Up: %v\n%s", err, log.String())
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range []string{"node1", "node2", "node3"} {
				b, _ := os.ReadFile(filepath.Join(runDir, name, n, "agent.log"))
				t.Logf("agent log of %s:\n%s", n, b)
			}
		}
		if _, err := os.Stat(filepath.Join(runDir, name, stateFile)); err == nil {
			if err := l.Down(); err != nil {
				t.Errorf("Down: %v", err)
			}
		}
	})
	if err := l.WaitEstablished(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.WaitRoutes(ctx); err != nil {
		t.Fatal(err)
	}
	st := l.State()
	if len(st.Pods) != 2 {
		t.Fatalf("%d pods after Up, want 2", len(st.Pods))
	}
	p1, p2 := st.Pods[0], st.Pods[1]
	for _, pair := range [][2]PodState{{p1, p2}, {p2, p1}} {
		if err := l.Ping(ctx, pair[0].Name, pair[1].IPs[0].Addr()); err != nil {
			t.Errorf("ping %s → %s: %v", pair[0].Name, pair[1].Name, err)
		}
	}
	out, err := l.Exec(ctx, p1.Name, "ip", "neigh", "show", "169.254.1.1")
	if err != nil || !strings.Contains(string(out), "ee:ee:ee:ee:ee:ee") {
		t.Errorf("pod %s neighbour 169.254.1.1 = %q (%v), want ee:ee:ee:ee:ee:ee", p1.Name, out, err)
	}

	t.Run("node joins and leaves", func(t *testing.T) {
		if err := l.AddNode(ctx, "node3"); err != nil {
			t.Fatal(err)
		}
		p3, err := l.AddPod(ctx, "node3", "n3p1", PodOptions{Namespace: "shop", Labels: map[string]string{"app": "web"}})
		if err != nil {
			t.Fatal(err)
		}
		// The labels reach the agent as args.cni.labels.
		weps, _, err := l.Store().List(ctx, api.KindWorkloadEndpoint, "shop")
		if err != nil {
			t.Fatal(err)
		}
		var labels map[string]string
		for _, o := range weps {
			if w, ok := o.(*api.WorkloadEndpoint); ok && w.Spec.Pod == "n3p1" {
				labels = w.Metadata.Labels
			}
		}
		if labels["app"] != "web" {
			t.Errorf("WorkloadEndpoint of shop/n3p1 has labels %v, want app=web among them", labels)
		}
		if err := l.WaitEstablished(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.WaitRoutes(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Ping(ctx, p1.Name, p3.IPs[0].Addr()); err != nil {
			t.Errorf("ping %s → %s: %v", p1.Name, p3.Name, err)
		}
		if err := l.RemoveNode(ctx, "node3"); err != nil {
			t.Fatal(err)
		}
		if netnsExists(name+"-node3") || netnsExists(name+"-pod-n3p1") {
			t.Error("node3's namespaces survive RemoveNode")
		}
		if err := l.WaitEstablished(ctx); err != nil {
			t.Error(err)
		}
	})

	t.Run("agent restart", func(t *testing.T) {
		old := l.State().Node("node1").Agent
		if err := l.StopAgent(ctx, "node1", syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if old.Alive() {
			t.Fatal("agent still alive after StopAgent")
		}
		if err := l.StartAgent(ctx, "node1"); err != nil {
			t.Fatal(err)
		}
		if err := l.WaitEstablished(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Ping(ctx, p2.Name, p1.IPs[0].Addr()); err != nil {
			t.Errorf("ping %s → %s after the restart: %v", p2.Name, p1.Name, err)
		}
	})

	if err := l.DelPod(ctx, p2.Name); err != nil {
		t.Errorf("DelPod: %v", err)
	}
	if netnsExists(p2.NetNS) {
		t.Errorf("namespace %s survives DelPod", p2.NetNS)
	}
	procs := l.State().etcdProcs()
	for _, n := range l.State().Nodes {
		procs = append(procs, n.Agent)
	}
	if err := l.Down(); err != nil {
		t.Fatalf("Down: %v", err)
	}
	assertGone(t, name, filepath.Join(runDir, name), procs)
}
