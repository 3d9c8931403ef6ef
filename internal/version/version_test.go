package version

import (
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := func(rev, modified string) *debug.BuildInfo {
		bi := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}
		if rev != "" {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: "vcs.revision", Value: rev})
		}
		if modified != "" {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: "vcs.modified", Value: modified})
		}
		return bi
	}
	for _, tc := range []struct {
		name  string
		stamp string
		bi    *debug.BuildInfo
		want  string
	}{
		{"stamped wins", "v0.3.0-4-g9d2037c-dirty", vcs("9d2037c0e1a2b3c4d5e6f708192a3b4c5d6e7f80", "false"), "v0.3.0-4-g9d2037c-dirty"},
		{"revision", "", vcs("9d2037c0e1a2b3c4d5e6f708192a3b4c5d6e7f80", "false"), "9d2037c0e1a2"},
		{"dirty revision", "", vcs("9d2037c0e1a2b3c4d5e6f708192a3b4c5d6e7f80", "true"), "9d2037c0e1a2-dirty"},
		{"module version", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.4.0"}}, "v0.4.0"},
		{"nothing known", "", vcs("", ""), "devel"},
		{"no build info", "", nil, "devel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := resolve(tc.stamp, tc.bi); got != tc.want {
				t.Errorf("resolve = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestGoVersionAgrees: the README names the Go release go.mod asks for
// (the Dockerfile's builder is checked by manifests/dockerfile_test.go).
func TestGoVersionAgrees(t *testing.T) {
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)(\.\d+)?$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	minor := string(m[1])
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	want := "Go " + minor + ".x"
	if !strings.Contains(string(readme), want) {
		t.Errorf("README.md does not say %q (go.mod: go %s%s)", want, m[1], m[2])
	}
	for _, other := range regexp.MustCompile(`Go 1\.\d+(\.[0-9x]+)?\b`).FindAllString(string(readme), -1) {
		if !strings.HasPrefix(other, "Go "+minor) {
			t.Errorf("README.md names %q; go.mod asks for go %s%s", other, m[1], m[2])
		}
	}
}
