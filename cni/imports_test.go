package cni

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// forbidden are modules the plugin binary must never link: it is exec'd for
// every pod and must stay small and quick to start.
var forbidden = []string{
	"go.etcd.io",
	"github.com/osrg/gobgp",
	"github.com/vishvananda",
	"k8s.io/client-go",
	"github.com/coreos/go-iptables",
	"google.golang.org/grpc",
}

// allowedVia lists the exceptions: a dependency that may appear only when
// imported by exactly these packages. The CNI library's skel checks the
// netns of ADD and DEL through vishvananda/netns (not netlink).
var allowedVia = map[string][]string{
	"github.com/vishvananda/netns": {"github.com/containernetworking/cni/pkg/ns"},
}

// allowedNonStd are every non-standard package the plugin may depend on: a
// name ending in "/" admits the packages below it.
var allowedNonStd = []string{
	"github.com/tabbynet/tabby/cni",
	"github.com/tabbynet/tabby/cmd/tabby",
	"github.com/tabbynet/tabby/internal/version",
	"github.com/containernetworking/cni/",
	"golang.org/x/sys/", // of vishvananda/netns
}

func allowed(path string) bool {
	return slices.ContainsFunc(allowedNonStd, func(a string) bool {
		if strings.HasSuffix(a, "/") {
			return strings.HasPrefix(path, a)
		}
		return path == a
	})
}

var pluginPkg = "github.com/tabbynet/tabby/cmd/tabby"

func TestPluginImportsOnlyCNILibrary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-json=ImportPath,Standard,Imports", pluginPkg).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	type pkg struct {
		ImportPath string
		Standard   bool
		Imports    []string
	}
	importers := map[string][]string{}
	var deps []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		deps = append(deps, p)
		for _, imp := range p.Imports {
			importers[imp] = append(importers[imp], p.ImportPath)
		}
	}
	if len(deps) < 10 || !slices.ContainsFunc(deps, func(p pkg) bool { return p.ImportPath == "github.com/containernetworking/cni/pkg/skel" }) {
		t.Fatalf("go list found %d packages and no skel: the check is not looking at the plugin", len(deps))
	}
	for _, p := range deps {
		if p.Standard {
			continue
		}
		if via, ok := allowedVia[p.ImportPath]; ok {
			slices.Sort(importers[p.ImportPath])
			if !slices.Equal(importers[p.ImportPath], via) {
				t.Errorf("%s is imported by %v; it is allowed only via %v", p.ImportPath, importers[p.ImportPath], via)
			}
			continue
		}
		for _, f := range forbidden {
			if strings.HasPrefix(p.ImportPath, f) {
				t.Errorf("%s depends on %s (imported by %v)", pluginPkg, p.ImportPath, importers[p.ImportPath])
			}
		}
		if !allowed(p.ImportPath) {
			t.Errorf("%s depends on %s (imported by %v), which is neither the CNI library nor the standard library", pluginPkg,
				p.ImportPath, importers[p.ImportPath])
		}
	}
}
