// Package kubebins says where `make kube-bins` (scripts/kube-bins.sh) puts
// the Kubernetes commands it builds from the module proxy, for the tests
// (kube/kubetest) and the lab (tabby-lab up --kubernetes). It links no
// Kubernetes client.
package kubebins

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Version is the Kubernetes release scripts/kube-build builds (a test
// checks that the two agree).
const Version = "v1.37.2"

// Names are the Kubernetes commands `make kube-bins` builds into the cache
// (scripts/kube-bins.sh; a test checks the two agree): the control plane,
// the kubelet, the lab nodes' kube-proxy, and the kubectl the lab drives
// them with (the same release, so within the supported version skew).
var Names = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"}

// Path is where `make kube-bins` puts the named command: $KUBE_CACHE
// (default /var/cache/tabby/kube)/<Version>/<name>; kube-apiserver may be
// overridden with $TABBY_KUBE_APISERVER.
func Path(name string) string {
	if p := os.Getenv("TABBY_KUBE_APISERVER"); p != "" && name == "kube-apiserver" {
		return p
	}
	root := os.Getenv("KUBE_CACHE")
	if root == "" {
		root = "/var/cache/tabby/kube"
	}
	return filepath.Join(root, Version, name)
}

// Find returns the paths of the named commands by name, and an error
// naming every one that is not built and how to build it.
func Find(names ...string) (map[string]string, error) {
	paths := map[string]string{}
	var missing []string
	for _, n := range names {
		p := Path(n)
		if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, p)
			continue
		}
		paths[n] = p
	}
	if len(missing) > 0 {
		return paths, fmt.Errorf("Kubernetes %s not built (%s): run `make kube-bins` (once; see docs/kubernetes-lab.md for how long)", Version, strings.Join(missing, ", "))
	}
	return paths, nil
}

// CoreDNSVersion is the CoreDNS release scripts/coredns-build builds (a
// test checks that the two agree).
const CoreDNSVersion = "v1.15.0"

// CoreDNSPath is where `make kube-bins` (scripts/coredns-bins.sh) puts the
// lab's CoreDNS: $COREDNS_CACHE (default /var/cache/tabby/coredns)/
// <CoreDNSVersion>/coredns.
func CoreDNSPath() string {
	root := os.Getenv("COREDNS_CACHE")
	if root == "" {
		root = "/var/cache/tabby/coredns"
	}
	return filepath.Join(root, CoreDNSVersion, "coredns")
}
