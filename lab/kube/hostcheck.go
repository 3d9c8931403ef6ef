package kube

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/tabbynet/tabby/lab"
)

// HostCheck says whether this host can run lab kubelets and their pods
// (root aside): binDir holding the named image archives (in images/, from
// `make images`), containerd and the commands the lab runs it with plus
// extra ones, Debian's loopback plugin (containerd's CRI runs it for every
// pod) plus the named plugins, and cgroups. It returns the archives' paths,
// or why not, saying what to install or build; tests skip with it.
func HostCheck(binDir string, archives, commands, plugins []string) (paths []string, err error) {
	if binDir == "" {
		return nil, fmt.Errorf("TABBY_BIN is not set: run `make build images` and set TABBY_BIN=$PWD/bin")
	}
	for _, a := range archives {
		p := filepath.Join(binDir, "images", a)
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("image archive missing (%v): run `make kube-bins images`", err)
		}
		paths = append(paths, p)
	}
	for _, c := range append([]string{"containerd", "ctr", "unshare", "findmnt"}, commands...) {
		if _, err := exec.LookPath(c); err != nil {
			return nil, fmt.Errorf("%s not installed (apt-get install containerd util-linux iputils-ping nftables): %v", c, err)
		}
	}
	for _, p := range append([]string{"loopback"}, plugins...) {
		if _, err := os.Stat(filepath.Join(cniPluginDir, p)); err != nil {
			return nil, fmt.Errorf("Debian's %s CNI plugin is needed (apt-get install containernetworking-plugins): %v", p, err)
		}
	}
	if _, err := lab.CgroupHierarchies(); err != nil {
		return nil, fmt.Errorf("cgroups: %v", err)
	}
	return paths, nil
}
