package main

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/internal/testkit"
)

const memLimitHelperEnv = "TABBY_MEMLIMIT_HELPER_CGROUP"

// TestMemLimitHelper is the helper process of
// TestPrivilegedMemoryLimitFromCgroup: it joins the cgroup named in its
// environment, then prints what setMemoryLimit set.
func TestMemLimitHelper(t *testing.T) {
	dir := os.Getenv(memLimitHelperEnv)
	if dir == "" {
		t.Skip("helper process for TestPrivilegedMemoryLimitFromCgroup, not a test")
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("limit=%d\n", setMemoryLimit(slog.New(slog.NewTextHandler(io.Discard, nil))))
}

// memoryCgroupParent is a directory where a memory cgroup can be made:
// the v1 memory hierarchy, or a cgroup v2 root that delegates memory.
func memoryCgroupParent(t *testing.T) (dir, limitFile string) {
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		return "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control"); err == nil && strings.Contains(string(b), "memory") {
		return "/sys/fs/cgroup", "memory.max"
	}
	t.Skip("no cgroup v1 memory hierarchy and no cgroup v2 root delegating memory")
	return "", ""
}

// TestPrivilegedMemoryLimitFromCgroup runs a process in a memory cgroup of
// its own with a 200 MiB limit: its soft limit is 90 % of it, and
// GOMEMLIMIT wins over the cgroup's.
func TestPrivilegedMemoryLimitFromCgroup(t *testing.T) {
	testkit.RequirePrivileged(t)
	parent, limitFile := memoryCgroupParent(t)
	dir := filepath.Join(parent, fmt.Sprintf("tabby-test-memlimit-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("removing cgroup %s: %v", dir, err)
		}
	})
	const limit = 200 << 20
	if err := os.WriteFile(filepath.Join(dir, limitFile), []byte(strconv.Itoa(limit)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, gomemlimit string
		want             int64
	}{
		{"from the cgroup", "", int64(float64(limit) * memLimitRatio)},
		{"GOMEMLIMIT wins", "64MiB", 64 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestMemLimitHelper$", "-test.count=1")
			cmd.Env = append(os.Environ(), memLimitHelperEnv+"="+dir, "GOMEMLIMIT="+c.gomemlimit)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("helper: %v\n%s", err, out.String())
			}
			if want := fmt.Sprintf("limit=%d\n", c.want); !strings.Contains(out.String(), want) {
				t.Errorf("helper printed:\n%s\nwant %q", out.String(), want)
			}
		})
	}
}
