package kube

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

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
		return filepath.Join(d, lab.BinLab)
	}
	buildOnce.Do(func() {
		builtDir, buildErr = os.MkdirTemp("", "tabby-lab-test-bin-")
		if buildErr == nil {
			buildErr = lab.BuildCommands(context.Background(), builtDir, []string{lab.BinLab}, nil)
		}
	})
	if buildErr != nil {
		t.Fatalf("building tabby-lab: %v", buildErr)
	}
	return filepath.Join(builtDir, lab.BinLab)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builtDir != "" {
		os.RemoveAll(builtDir)
	}
	os.Exit(code)
}

// assertGone checks that nothing of the lab is left: namespaces, processes,
// directory.
func assertGone(t *testing.T, name, dir string, procs []*lab.Proc) {
	t.Helper()
	entries, err := os.ReadDir(lab.NetNSDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), name+"-") {
			t.Errorf("namespace %s left after down", e.Name())
		}
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

// requireKubeletHost skips tb unless this host can run lab kubelets and
// their pods (root, then HostCheck). It returns TABBY_BIN and the
// archives' paths.
func requireKubeletHost(tb testing.TB, archives, commands, plugins []string) (binDir string, paths []string) {
	tb.Helper()
	testkit.RequirePrivileged(tb)
	binDir = os.Getenv("TABBY_BIN")
	paths, err := HostCheck(binDir, archives, commands, plugins)
	if err != nil {
		tb.Skip(err.Error())
	}
	return binDir, paths
}
