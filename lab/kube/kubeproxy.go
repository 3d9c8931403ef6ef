package kube

import (
	"context"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tabbynet/tabby/kube/kubebins"
	"github.com/tabbynet/tabby/lab"
)

// Each lab node runs kube-proxy as a process of its own in the node's
// network namespace, beside its kubelet, not as a DaemonSet: the lab's
// images are single layers of static binaries (internal/image), and
// kube-proxy needs a distribution's userland (nftables mode runs the nft
// command, iptables mode iptables-restore and friends), which the host
// has. That is how a cluster without kubeadm runs it ("the hard way", a
// systemd unit per node): a process of the node, its rules in the node's
// namespace, its credentials a client certificate of the cluster's CA for
// system:kube-proxy, whom Kubernetes' bootstrap policy binds to
// system:node-proxier. See docs/kubernetes-lab.md.

// ProxyMode is how kube-proxy programs Services on a lab node.
type ProxyMode string

const (
	// ProxyNFTables is kube-proxy's nftables mode, the lab's default.
	ProxyNFTables ProxyMode = "nftables"
	// ProxyIPTables is kube-proxy's iptables mode (on this host's
	// iptables, whichever backend it has).
	ProxyIPTables ProxyMode = "iptables"
	// ProxyNone runs no kube-proxy: no ClusterIP leads anywhere.
	ProxyNone ProxyMode = "none"
)

// ParseProxyMode parses a mode name; "" is ProxyNFTables.
func ParseProxyMode(s string) (ProxyMode, error) {
	switch m := ProxyMode(s); m {
	case "":
		return ProxyNFTables, nil
	case ProxyNFTables, ProxyIPTables, ProxyNone:
		return m, nil
	}
	return "", fmt.Errorf("kube-proxy mode %q: want nftables, iptables or none", s)
}

// kubeProxyHealthz and kubeProxyMetrics are where a node's kube-proxy
// serves /healthz and /metrics, inside the node's namespace.
const (
	kubeProxyHealthz = "127.0.0.1:10256"
	kubeProxyMetrics = "127.0.0.1:10249"
)

// KubeProxyDir holds the node's kube-proxy configuration, credentials and
// log.
func (l *Cluster) KubeProxyDir(node string) string {
	return filepath.Join(l.NodeDir(node), "kube-proxy")
}

// kubeProxyConfig is the node's KubeProxyConfiguration. Traffic from the
// pod pool is the cluster's own (detectLocalMode ClusterCIDR): kube-proxy
// masquerades only what comes from elsewhere. The conntrack settings are
// left as the kernel has them: the table's size is the whole host's, not
// the node's, and the timeouts need not change for the lab.
func kubeProxyConfig(mode ProxyMode, kubeconfig, node, clusterCIDR string) string {
	return `# Written by the Tabby lab: the kube-proxy of one lab node.
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ` + string(mode) + `
clientConnection:
  kubeconfig: ` + kubeconfig + `
hostnameOverride: ` + node + `
clusterCIDR: ` + clusterCIDR + `
detectLocalMode: ClusterCIDR
healthzBindAddress: ` + kubeProxyHealthz + `
metricsBindAddress: ` + kubeProxyMetrics + `
# Lowering its OOM score needs CAP_SYS_RESOURCE, which a lab host may lack.
oomScoreAdj: 0
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
`
}

// kubeProxySynced reports whether kube-proxy's metrics say it programmed
// its rules at least once: a sync_proxy_rules_last_timestamp_seconds
// sample for an IP family appears with the family's first successful sync
// and none is zero. (Its /healthz cannot tell: it answers 200 while
// kube-proxy starts, and marks each family updated as its sync loop
// begins, before any rule is written.)
func kubeProxySynced(metrics []byte) bool {
	n := 0
	for _, line := range strings.Split(string(metrics), "\n") {
		name, rest, ok := strings.Cut(line, "{")
		if !ok || name != "kubeproxy_sync_proxy_rules_last_timestamp_seconds" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 2 {
			return false
		}
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil || v <= 0 {
			return false
		}
		n++
	}
	return n > 0
}

// StartKubeProxy starts kube-proxy in mode on the node (its kubelet
// registered first: kube-proxy reads the node's addresses from its Node)
// and waits until it has programmed the Services once (kubeProxySynced).
// Teardown stops it; its rules go with the node's namespace.
func (l *Cluster) StartKubeProxy(ctx context.Context, node string, mode ProxyMode) error {
	if mode == ProxyNone {
		return nil
	}
	bins, err := kubebins.Find("kube-proxy")
	if err != nil {
		return err
	}
	st := l.State()
	n, err := st.NodeToStart(node, "kube-proxy", func(n *lab.NodeState) *lab.Proc { return n.KubeProxy })
	if err != nil {
		return err
	}
	dir := l.KubeProxyDir(node)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := loadCA(l.kubeDir())
	if err != nil {
		return fmt.Errorf("no control plane for the kube-proxy of %s: %w", node, err)
	}
	cert, key, err := ca.issue(pkix.Name{CommonName: "system:kube-proxy"}, nil, nil)
	if err != nil {
		return err
	}
	kc := filepath.Join(dir, "kubeconfig")
	if err := writeFiles(dir, map[string][]byte{
		"kubeconfig":  []byte(certKubeconfig(APIServerURL(), ca.certPEM, cert, key)),
		"config.yaml": []byte(kubeProxyConfig(mode, kc, node, lab.PodPool)),
	}); err != nil {
		return fmt.Errorf("writing the kube-proxy files of %s: %w", node, err)
	}
	argv := []string{bins["kube-proxy"], "--config=" + filepath.Join(dir, "config.yaml"), "--v=1"}
	l.Progress("starting kube-proxy (%s mode) on %s", mode, node)
	p, done, err := l.StartDetached("kube-proxy "+node, n.NetNS, argv, filepath.Join(dir, "kube-proxy.log"), lab.PIDFile(dir, "kube-proxy"))
	if err != nil {
		return err
	}
	if err := l.Update(func(s *lab.State) error {
		if n := s.Node(node); n != nil {
			n.KubeProxy = p
			return nil
		}
		return fmt.Errorf("node %q vanished while starting its kube-proxy", node)
	}); err != nil {
		return errors.Join(err, p.Stop(ctx, syscall.SIGKILL, time.Second, done))
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return lab.DialIn(ctx, n.NetNS, network, addr)
		},
	}}
	defer hc.CloseIdleConnections()
	err = lab.Poll(wctx, 200*time.Millisecond, func() (bool, error) {
		if !p.Alive() {
			return false, fmt.Errorf("kube-proxy on %s exited:\n%s", node, logTail(p.Log))
		}
		resp, err := hc.Get("http://" + kubeProxyMetrics + "/metrics")
		if err != nil {
			return false, nil
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return err == nil && resp.StatusCode == http.StatusOK && kubeProxySynced(body), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-proxy on %s: %w\n%s", node, err, logTail(p.Log))
	}
	return nil
}
