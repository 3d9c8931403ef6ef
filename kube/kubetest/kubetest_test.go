package kubetest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestVersionMatchesBuildModule(t *testing.T) {
	b, err := os.ReadFile("../../scripts/kube-build/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "require k8s.io/kubernetes "+Version+"\n") {
		t.Errorf("scripts/kube-build/go.mod does not require k8s.io/kubernetes %s", Version)
	}
}

// TestBinariesMatchScript: the commands tests look for are the ones
// scripts/kube-bins.sh builds and scripts/kube-build pins.
func TestBinariesMatchScript(t *testing.T) {
	script, err := os.ReadFile("../../scripts/kube-bins.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`KUBE_BINS:-([a-z -]+)\}`).FindSubmatch(script)
	if m == nil {
		t.Fatal("scripts/kube-bins.sh has no default KUBE_BINS list")
	}
	if diff := cmp.Diff(Binaries, strings.Fields(string(m[1]))); diff != "" {
		t.Errorf("kube-bins.sh builds (-Binaries +script):\n%s", diff)
	}
	tools, err := os.ReadFile("../../scripts/kube-build/tools.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range Binaries {
		if !strings.Contains(string(tools), `"k8s.io/kubernetes/cmd/`+b+`"`) {
			t.Errorf("scripts/kube-build/tools.go does not pin k8s.io/kubernetes/cmd/%s", b)
		}
	}
}

// skipRecorder records a Skipf instead of ending the test.
type skipRecorder struct {
	testing.TB
	skipped string
}

func (r *skipRecorder) Skipf(format string, args ...any) { r.skipped = fmt.Sprintf(format, args...) }

// TestRequireSkips: a missing command skips the test naming it; a cache
// holding every one returns their paths.
func TestRequireSkips(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("KUBE_CACHE", cache)
	t.Setenv("TABBY_KUBE_APISERVER", "")
	dir := filepath.Join(cache, Version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kube-apiserver"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Not executable: as good as missing.
	if err := os.WriteFile(filepath.Join(dir, "kube-scheduler"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := &skipRecorder{TB: t}
	if got := Require(r, "kube-apiserver", "kubelet", "kube-scheduler"); got != nil {
		t.Errorf("Require returned %v with kubelet missing", got)
	}
	for _, want := range []string{filepath.Join(dir, "kubelet"), filepath.Join(dir, "kube-scheduler"), "make kube-bins"} {
		if !strings.Contains(r.skipped, want) {
			t.Errorf("skip message %q does not name %s", r.skipped, want)
		}
	}
	if strings.Contains(r.skipped, "kube-apiserver") {
		t.Errorf("skip message %q names the built kube-apiserver", r.skipped)
	}

	r = &skipRecorder{TB: t}
	got := Require(r, "kube-apiserver")
	if r.skipped != "" || got["kube-apiserver"] != filepath.Join(dir, "kube-apiserver") {
		t.Errorf("Require = %v, skipped %q", got, r.skipped)
	}
}
