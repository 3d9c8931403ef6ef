package kube

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/template"
	"time"

	"github.com/tabbynet/tabby/internal/image"
)

// The cluster's DNS is CoreDNS (our build, scripts/coredns-build, imported
// as internal/image.CoreDNSName) deployed as kubeadm deploys it: a
// Deployment of two replicas in kube-system behind the kube-dns Service at
// DNSServiceIP, which every kubelet hands its pods (clusterDNS). It reads
// Services and EndpointSlices from the API server at the kubernetes
// Service's ClusterIP, through the node's kube-proxy, so it needs Tabby (its
// pods' network) and kube-proxy first.

const (
	// DNSServiceIP is the kube-dns Service's ClusterIP: a fixed address of
	// ServiceCIDR (kubeadm's choice, the range's tenth).
	DNSServiceIP = "10.96.0.10"
	// ClusterDomain is the cluster's DNS domain.
	ClusterDomain = "cluster.local"
	// DNSReplicas is how many CoreDNS pods the Deployment runs.
	DNSReplicas = 2
)

// corefile answers the cluster domain and reverse lookups of the cluster's
// addresses from the API server. Nothing is forwarded: the lab reaches no
// resolver outside it, and a name outside the cluster gets SERVFAIL at once
// instead of a timeout. Without forward there is no loop to detect: the
// loop plugin (built in) would only log that it has no next plugin.
const corefile = `.:53 {
    errors
    health {
        lameduck 2s
    }
    ready
    kubernetes ` + ClusterDomain + ` in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    cache 30
    loadbalance
}
`

// indent prefixes every line of s with n spaces.
func indent(s string, n int) string {
	pad := strings.Repeat(" ", n)
	return pad + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+pad) + "\n"
}

// DNSManifest is what DeployDNS applies: CoreDNS's service account and
// the read-only rights its kubernetes plugin needs, the Corefile, the
// Deployment (spread over the nodes, ready when its ready plugin says so)
// and the kube-dns Service.
func DNSManifest() string {
	var b strings.Builder
	err := dnsTemplate.Execute(&b, struct {
		Corefile, Image, ServiceIP string
		Replicas                   int
	}{corefile, image.CoreDNSName, DNSServiceIP, DNSReplicas})
	if err != nil {
		panic(err) // the template and its fields are fixed at build time
	}
	return b.String()
}

//go:embed dns.yaml
var dnsYAML string

var dnsTemplate = template.Must(template.New("dns.yaml").Funcs(template.FuncMap{"indent": indent}).Parse(dnsYAML))

// DeployDNS applies DNSManifest with kubectl and waits until the CoreDNS
// Deployment is available. The nodes need the CoreDNS image
// (KubeOptions.Images), Tabby (DeployTabby) and kube-proxy.
func (l *Cluster) DeployDNS(ctx context.Context, timeout time.Duration) error {
	if timeout == 0 {
		timeout = 3 * time.Minute
	}
	path := filepath.Join(l.kubeDir(), "coredns.yaml")
	if err := os.WriteFile(path, []byte(DNSManifest()), 0o644); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := l.Kubectl(wctx, "apply", "-f", path); err != nil {
		return fmt.Errorf("deploying CoreDNS: %w", err)
	}
	if _, err := l.Kubectl(wctx, "-n", "kube-system", "rollout", "status", "deployment/coredns", fmt.Sprintf("--timeout=%ds", int(timeout.Seconds()))); err != nil {
		return fmt.Errorf("waiting for CoreDNS: %w", err)
	}
	l.Progress("CoreDNS is available: kube-dns at %s answers %s", DNSServiceIP, ClusterDomain)
	return nil
}
