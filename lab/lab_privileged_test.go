package lab

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/testkit"
)

// uniqueName is a lab name no other test uses at the same time.
func uniqueName(t *testing.T) string {
	t.Helper()
	return testkit.UniqueName(t, "tl")
}

var (
	buildOnce sync.Once
	builtDir  string
	buildErr  error
)

// labBinary is a tabby-lab built once per test run ($TABBY_BIN/tabby-lab
// when set).
func labBinary(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("TABBY_BIN"); d != "" {
		return filepath.Join(d, BinLab)
	}
	buildOnce.Do(func() {
		builtDir, buildErr = os.MkdirTemp("", "tabby-lab-test-bin-")
		if buildErr == nil {
			buildErr = BuildCommands(context.Background(), builtDir, []string{BinLab}, nil)
		}
	})
	if buildErr != nil {
		t.Fatalf("building tabby-lab: %v", buildErr)
	}
	return filepath.Join(builtDir, BinLab)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builtDir != "" {
		os.RemoveAll(builtDir)
	}
	os.Exit(code)
}

// labNamespaces lists the namespaces in /run/netns that start with name-.
func labNamespaces(t *testing.T, name string) []string {
	t.Helper()
	entries, err := os.ReadDir(NetNSDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), name+"-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// assertGone checks that nothing of the lab is left: namespaces, processes,
// directory.
func assertGone(t *testing.T, name, dir string, procs []*Proc) {
	t.Helper()
	if ns := labNamespaces(t, name); len(ns) > 0 {
		t.Errorf("namespaces left after down: %v", ns)
	}
	for _, p := range procs {
		if p.Alive() {
			t.Errorf("%s (pid %d) still running after down", p.Role, p.PID)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lab directory %s left after down (stat: %v)", dir, err)
	}
}

// upNoAgents brings up a lab without agents and removes it at the end of
// the test unless the test did.
func upNoAgents(t *testing.T, nodes int) (*Lab, string, string) {
	t.Helper()
	name, runDir := uniqueName(t), t.TempDir()
	var log bytes.Buffer
	bin := labBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	l, err := Up(ctx, Options{Name: name, Nodes: nodes, RunDir: runDir, NoAgents: true, LabBinary: bin, Log: &log})
	if err != nil {
		t.Fatalf("Up: %v\n%s", err, log.String())
	}
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(runDir, name, stateFile)); err == nil {
			if err := l.Down(); err != nil {
				t.Errorf("cleanup Down: %v", err)
			}
		}
	})
	return l, name, runDir
}

func TestPrivilegedFabric(t *testing.T) {
	testkit.RequirePrivileged(t)
	l, name, runDir := upNoAgents(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("underlay", func(t *testing.T) {
		for _, dst := range []string{"198.18.0.12", "198.18.0.1"} {
			if out, err := l.Exec(ctx, "node1", "ping", "-c1", "-W2", "-n", dst); err != nil {
				t.Errorf("node1 → %s: %v\n%s", dst, err, out)
			}
		}
		out, err := l.Exec(ctx, "node2", "ip", "-4", "route", "show", "default")
		if err != nil || !strings.Contains(string(out), "via 198.18.0.1 dev eth0") {
			t.Errorf("node2 default route = %q (%v), want via 198.18.0.1 dev eth0", out, err)
		}
		for _, target := range []string{"node1", "node2", "tor"} {
			out, err := l.Exec(ctx, target, "cat", "/proc/sys/net/ipv4/ip_forward")
			if err != nil || strings.TrimSpace(string(out)) != "1" {
				t.Errorf("%s ip_forward = %q (%v), want 1", target, out, err)
			}
		}
	})

	t.Run("tor is a dead end", func(t *testing.T) {
		out, err := l.Exec(ctx, "tor", "ip", "-4", "route", "show", "default")
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("ToR default route = %q (%v), want none", out, err)
		}
		// route get asks the kernel without sending anything.
		out, err = l.Exec(ctx, "tor", "ip", "-4", "route", "get", "10.244.1.1")
		if err == nil || !strings.Contains(string(out), "unreachable") {
			t.Errorf("ToR route get 10.244.1.1 = %q (%v), want unreachable", out, err)
		}
	})

	t.Run("nothing in the root namespace", func(t *testing.T) {
		links, err := run(ctx, "ip", "-o", "link", "show")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(links), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			ifname, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			if strings.HasPrefix(ifname, "v-") || ifname == "br0" {
				t.Errorf("root namespace has a lab link: %s", line)
			}
		}
		routes, err := run(ctx, "ip", "-4", "route", "show")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(routes), "198.18.0.") {
			t.Errorf("root namespace has a lab route:\n%s", routes)
		}
	})

	t.Run("etcd over the unix socket", func(t *testing.T) {
		s := l.Store()
		if s == nil {
			t.Fatal("no datastore connection after Up")
		}
		if _, err := s.PutKV(ctx, "lab-test/k", []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
		kv, err := s.GetKV(ctx, "lab-test/k")
		if err != nil || string(kv.Value) != "v" {
			t.Fatalf("GetKV = %q, %v; want v", kv.Value, err)
		}
	})

	t.Run("name taken", func(t *testing.T) {
		_, err := Up(ctx, Options{Name: name, Nodes: 1, RunDir: runDir, NoAgents: true, LabBinary: labBinary(t)})
		if !errors.Is(err, ErrNameTaken) {
			t.Errorf("second Up with name %s: %v, want ErrNameTaken", name, err)
		}
	})

	st := l.State()
	if err := l.Down(); err != nil {
		t.Fatalf("Down: %v", err)
	}
	assertGone(t, name, filepath.Join(runDir, name), st.etcdProcs())
}

func TestPrivilegedEtcdRestart(t *testing.T) {
	testkit.RequirePrivileged(t)
	l, _, _ := upNoAgents(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := l.Store().PutKV(ctx, "lab-test/persist", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	old := l.State().Etcd[0].Proc
	if err := l.StopEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	if old.Alive() {
		t.Fatalf("etcd pid %d alive after StopEtcd", old.PID)
	}
	if err := l.StartEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	kv, err := l.Store().GetKV(ctx, "lab-test/persist")
	if err != nil || string(kv.Value) != "1" {
		t.Fatalf("after restart GetKV = %q, %v; want 1", kv.Value, err)
	}
}

// TestPrivilegedTeardownAfterCrash kills `tabby-lab up` half way and checks
// that `tabby-lab down` removes what it had made from the state alone.
func TestPrivilegedTeardownAfterCrash(t *testing.T) {
	testkit.RequirePrivileged(t)
	bin := labBinary(t)
	name, runDir := uniqueName(t), t.TempDir()
	dir := filepath.Join(runDir, name)
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(dir, stateFile)); err == nil {
			_ = Teardown(context.Background(), runDir, name, nil)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	up := exec.Command(bin, "up", "--no-agents", "--nodes", "3", "--name", name, "--run-dir", runDir)
	var out bytes.Buffer
	up.Stdout, up.Stderr = &out, &out
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	// Crash once etcd runs and the first node namespace is being made.
	var st *State
	err := Poll(ctx, 5*time.Millisecond, func() (bool, error) {
		s, err := loadState(dir)
		if err != nil {
			return false, nil
		}
		st = s
		return len(s.etcdProcs()) > 0 && len(s.Nodes) > 0, nil
	})
	if err != nil {
		_ = up.Process.Kill()
		t.Fatalf("waiting for up to get going: %v\n%s", err, out.String())
	}
	if err := up.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = up.Wait()
	if etcd := st.etcdProcs()[0]; !etcd.Alive() {
		t.Fatalf("etcd (pid %d) not running after up crashed: nothing to clean up\n%s", etcd.PID, out.String())
	}
	if len(labNamespaces(t, name)) == 0 {
		t.Fatalf("no namespaces after up crashed\n%s", out.String())
	}
	down := exec.CommandContext(ctx, bin, "down", "--name", name, "--run-dir", runDir)
	if b, err := down.CombinedOutput(); err != nil {
		t.Fatalf("tabby-lab down: %v\n%s", err, b)
	}
	assertGone(t, name, dir, st.etcdProcs())
}

// TestPrivilegedTeardownWithoutDown drops a Lab without calling Down and
// removes it from its state directory, as `tabby-lab down` does.
func TestPrivilegedTeardownWithoutDown(t *testing.T) {
	testkit.RequirePrivileged(t)
	l, name, runDir := upNoAgents(t, 2)
	st := l.State()
	// The process that made the lab is gone as far as Teardown knows: it
	// has only the state directory.
	if err := Teardown(context.Background(), runDir, name, nil); err != nil {
		t.Fatalf("Teardown: %v", err)
	}
	assertGone(t, name, filepath.Join(runDir, name), st.etcdProcs())
	if err := l.Store().Close(); err != nil {
		t.Logf("closing the orphaned store: %v", err)
	}
}

// TestPrivilegedForeignNamespace: a namespace the lab would make but that
// exists already makes Up fail, and the clean-up after the failure leaves
// that namespace alone.
func TestPrivilegedForeignNamespace(t *testing.T) {
	testkit.RequirePrivileged(t)
	bin := labBinary(t)
	name, runDir := uniqueName(t), t.TempDir()
	foreign := name + "-node1"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := ip(ctx, "netns", "add", foreign); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ip(context.Background(), "netns", "delete", foreign); err != nil {
			t.Errorf("removing the test's namespace: %v", err)
		}
	})
	_, err := Up(ctx, Options{Name: name, Nodes: 1, RunDir: runDir, NoAgents: true, LabBinary: bin})
	if err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Fatalf("Up = %v, want an error about %s existing", err, foreign)
	}
	if !netnsExists(foreign) {
		t.Fatalf("the failed Up deleted %s, which it did not make", foreign)
	}
	if left := labNamespaces(t, name); len(left) != 1 {
		t.Errorf("namespaces after the failed Up: %v, want only %s", left, foreign)
	}
}
