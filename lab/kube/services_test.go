package kube

import (
	"net/netip"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/tabbynet/tabby/internal/image"
)

func TestParseProxyMode(t *testing.T) {
	for in, want := range map[string]ProxyMode{"": ProxyNFTables, "nftables": ProxyNFTables, "iptables": ProxyIPTables, "none": ProxyNone} {
		if got, err := ParseProxyMode(in); err != nil || got != want {
			t.Errorf("ParseProxyMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseProxyMode("ipvs"); err == nil {
		t.Error("ParseProxyMode(ipvs): no error")
	}
}

// TestKubeProxyConfig: the mode asked for, the node's name, the pod pool
// as the cluster's own traffic, and no conntrack setting of the host's.
func TestKubeProxyConfig(t *testing.T) {
	cfg := kubeProxyConfig(ProxyIPTables, "/d/kubeconfig", "node2", "10.244.0.0/16")
	for _, want := range []string{
		"kind: KubeProxyConfiguration\n", "mode: iptables\n", "  kubeconfig: /d/kubeconfig\n", "hostnameOverride: node2\n",
		"clusterCIDR: 10.244.0.0/16\n", "detectLocalMode: ClusterCIDR\n", "healthzBindAddress: 127.0.0.1:10256\n",
		"  maxPerCore: 0\n", "  min: 0\n", "  tcpEstablishedTimeout: 0s\n",
	} {
		if !strings.Contains(cfg, want) {
			t.Errorf("kube-proxy config lacks %q:\n%s", want, cfg)
		}
	}
}

// TestDNSManifest: the objects DeployDNS applies decode, the kube-dns
// Service sits at the kubelets' clusterDNS inside the Service range, and
// the Deployment runs the lab's CoreDNS image on its Corefile, which
// serves the cluster domain.
func TestDNSManifest(t *testing.T) {
	docs := strings.Split(DNSManifest(), "\n---\n")
	var kinds []string
	var svc corev1.Service
	var dep appsv1.Deployment
	var cm corev1.ConfigMap
	for _, d := range docs {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(d), &meta); err != nil {
			t.Fatalf("%v in:\n%s", err, d)
		}
		kinds = append(kinds, meta.Kind)
		var err error
		switch meta.Kind {
		case "Service":
			err = yaml.UnmarshalStrict([]byte(d), &svc)
		case "Deployment":
			err = yaml.UnmarshalStrict([]byte(d), &dep)
		case "ConfigMap":
			err = yaml.UnmarshalStrict([]byte(d), &cm)
		}
		if err != nil {
			t.Fatalf("%s: %v", meta.Kind, err)
		}
	}
	if got := strings.Join(kinds, ","); got != "ServiceAccount,ClusterRole,ClusterRoleBinding,ConfigMap,Deployment,Service" {
		t.Errorf("kinds %s", got)
	}
	ip := netip.MustParseAddr(svc.Spec.ClusterIP)
	if svc.Name != "kube-dns" || ip.String() != DNSServiceIP || !netip.MustParsePrefix(ServiceCIDR).Contains(ip) {
		t.Errorf("Service %s at %s, want kube-dns at %s in %s", svc.Name, svc.Spec.ClusterIP, DNSServiceIP, ServiceCIDR)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if c.Image != image.CoreDNSName || strings.Join(c.Args, " ") != "-conf /etc/coredns/Corefile" {
		t.Errorf("container %s %v", c.Image, c.Args)
	}
	if dep.Spec.Template.Labels["k8s-app"] != svc.Spec.Selector["k8s-app"] {
		t.Errorf("Service selects %v, pods labelled %v", svc.Spec.Selector, dep.Spec.Template.Labels)
	}
	if !strings.Contains(cm.Data["Corefile"], "kubernetes "+ClusterDomain+" ") {
		t.Errorf("Corefile does not serve %s:\n%s", ClusterDomain, cm.Data["Corefile"])
	}
}

// TestKubeProxySynced: synced once every IP family's last-sync sample is
// there and not zero; the help text alone, or a family at zero, is not.
func TestKubeProxySynced(t *testing.T) {
	const help = "# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds [ALPHA] The last time proxy rules were successfully synced\n" +
		"# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\n"
	for metrics, want := range map[string]bool{
		"":   false,
		help: false,
		help + `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7963e+09` + "\n":                                                                                  true,
		help + `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7963e+09` + "\n" + `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 0` + "\n": false,
		`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 1.7963e+09` + "\n":                                                                                  false,
	} {
		if got := kubeProxySynced([]byte(metrics)); got != want {
			t.Errorf("kubeProxySynced(%q) = %v, want %v", metrics, got, want)
		}
	}
}
