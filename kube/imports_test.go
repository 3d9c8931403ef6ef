package kube_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Agents hold no Kubernetes API rights, and only tabby-kube-controllers
// talks to the API server: no binary but it links the Kubernetes client
// libraries, and no package of the module but this one (with its test
// helper kubetest) imports client-go.
func TestOnlyKubeImportsClientGo(t *testing.T) {
	const mod = "github.com/tabbynet/tabby/"
	const controllers = mod + "cmd/tabby-kube-controllers"
	kubeClient := []string{"k8s.io/client-go", "k8s.io/api/", "k8s.io/apimachinery"}
	isKubeClient := func(p string) bool {
		return slices.ContainsFunc(kubeClient, func(f string) bool { return strings.HasPrefix(p, f) })
	}

	bins := goList(t, "-f", `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`, mod+"cmd/...")
	if !slices.Contains(bins, controllers) || !slices.Contains(bins, mod+"cmd/tabby-agent") || !slices.Contains(bins, mod+"cmd/tabby") ||
		!slices.Contains(bins, mod+"cmd/tabbyctl") {
		t.Fatalf("binaries found: %v; the check is not looking at them", bins)
	}
	for _, bin := range bins {
		deps := goList(t, "-deps", bin)
		n := 0
		for _, d := range deps {
			if isKubeClient(d) {
				n++
				if bin != controllers {
					t.Errorf("%s links %s", bin, d)
				}
			}
		}
		if bin == controllers && n == 0 {
			t.Errorf("%s links no Kubernetes client package: the check does not see them", bin)
		}
	}

	// Direct imports of every package of the module, tests excluded.
	sawKube := false
	for _, line := range goList(t, "-f", `{{.ImportPath}} {{join .Imports " "}}`, mod+"...") {
		fields := strings.Fields(line)
		pkg, imports := fields[0], fields[1:]
		if pkg == mod+"kube" || strings.HasPrefix(pkg, mod+"kube/") {
			sawKube = sawKube || slices.ContainsFunc(imports, func(i string) bool { return strings.HasPrefix(i, "k8s.io/client-go") })
			continue
		}
		for _, imp := range imports {
			if strings.HasPrefix(imp, "k8s.io/client-go") {
				t.Errorf("%s imports %s; only package kube may", pkg, imp)
			}
		}
	}
	if !sawKube {
		t.Error("package kube imports no client-go package: the check does not see imports")
	}
}

func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list %v: %v\n%s", args, err, stderr)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}
