package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tabbynet/tabby/kube/kubebins"
	"github.com/tabbynet/tabby/lab"
)

// KubeOptions configure StartKubernetes.
type KubeOptions struct {
	// Images are OCI archives imported into every node's containerd (the
	// pause image and Tabby's, from `make images`; CoreDNS's for DeployDNS).
	Images []string
	// KubeProxy is the mode of the kube-proxy StartKubernetes runs on every
	// node: "" is ProxyNFTables; ProxyNone runs none.
	KubeProxy ProxyMode
}

// StartKubernetes makes the lab a Kubernetes cluster: the control plane
// (StartControlPlane), then on every node containerd, the images and a
// kubelet registering the node with a certificate of the lab's CA, and
// once every node is registered, kube-proxy on each (StartKubeProxy, in
// o.KubeProxy's mode). In a lab without agents the nodes have no CNI
// configuration, as an operator's nodes before a network plugin is
// deployed (DeployTabby).
func (l *Cluster) StartKubernetes(ctx context.Context, o KubeOptions) error {
	mode, err := ParseProxyMode(string(o.KubeProxy))
	if err != nil {
		return err
	}
	names := []string{"kubelet"}
	if mode != ProxyNone {
		names = append(names, "kube-proxy")
	}
	bins, err := kubebins.Find(names...)
	if err != nil {
		return err
	}
	if err := l.StartControlPlane(ctx); err != nil {
		return err
	}
	st := l.State()
	for _, n := range st.Nodes {
		if st.NoAgents {
			if err := os.Remove(l.ConflistPath(n.Name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		if err := l.StartContainerd(ctx, n.Name); err != nil {
			return fmt.Errorf("containerd on %s: %w", n.Name, err)
		}
		if err := l.ImportImages(ctx, n.Name, o.Images...); err != nil {
			return fmt.Errorf("images on %s: %w", n.Name, err)
		}
		if err := l.StartKubelet(ctx, n.Name, bins["kubelet"], KubeletOptions{}); err != nil {
			return fmt.Errorf("kubelet on %s: %w", n.Name, err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err = lab.Poll(wctx, 250*time.Millisecond, func() (bool, error) {
		if err := l.ControlPlaneRunning(); err != nil {
			return false, err
		}
		out, err := l.Kubectl(wctx, "get", "nodes", "-o", "name")
		return err == nil && strings.Count(string(out), "node/") == len(st.Nodes), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %d nodes to register: %w", len(st.Nodes), err)
	}
	for _, n := range st.Nodes {
		if err := l.StartKubeProxy(ctx, n.Name, mode); err != nil {
			return fmt.Errorf("kube-proxy on %s: %w", n.Name, err)
		}
	}
	l.Progress("Kubernetes is up: %d nodes registered with %s", len(st.Nodes), APIServerURL())
	return nil
}

// UpOptions configure Up.
type UpOptions struct {
	Kube   KubeOptions
	Deploy DeployOptions
	// NoDNS deploys no CoreDNS (then the images need not hold it).
	NoDNS bool
}

// Up is what `tabby-lab up --kubernetes` makes of a lab without agents:
// Kubernetes with kube-proxy on every node (StartKubernetes), Tabby from
// the manifests (DeployTabby), and the cluster's DNS (DeployDNS). The demo
// and the end-to-end tests use it, so that they run the lab as shipped.
func (l *Cluster) Up(ctx context.Context, o UpOptions) error {
	if err := l.StartKubernetes(ctx, o.Kube); err != nil {
		return fmt.Errorf("Kubernetes: %w", err)
	}
	if err := l.DeployTabby(ctx, o.Deploy); err != nil {
		return fmt.Errorf("Tabby: %w", err)
	}
	if o.NoDNS {
		return nil
	}
	if err := l.DeployDNS(ctx, o.Deploy.Timeout); err != nil {
		return fmt.Errorf("DNS: %w", err)
	}
	return nil
}

// DeployOptions configure DeployTabby.
type DeployOptions struct {
	// ManifestDir holds tabby-etcd.yaml and tabby-kube-controllers.yaml.
	ManifestDir string
	// NodeGCGrace replaces the ConfigMap's node_gc_grace ("" keeps it).
	NodeGCGrace string
	// Timeout bounds the wait for Tabby to be ready (default 4 minutes).
	Timeout time.Duration
}

// DeployTabby deploys Tabby from the manifests as manifests/README.md tells
// an operator, with its plain-HTTP variant (the lab's etcd has no TLS):
// the namespace and an empty Secret tabby-etcd-secrets, tabby-etcd.yaml
// with the lab's etcd endpoints, the ConfigMap kubernetes-services-endpoint
// naming the API server's address (as the README tells operators: the
// controllers need the API server before pods reach Services), and
// tabby-kube-controllers.yaml, in the README's order: the controllers once
// the DaemonSet is ready and every node Ready. It returns once the
// controllers are available.
func (l *Cluster) DeployTabby(ctx context.Context, o DeployOptions) error {
	if o.Timeout == 0 {
		o.Timeout = 4 * time.Minute
	}
	dir := l.kubeDir()
	agentManifest, err := os.ReadFile(filepath.Join(o.ManifestDir, "tabby-etcd.yaml"))
	if err != nil {
		return err
	}
	agentManifest, err = PlainHTTPManifest(agentManifest, strings.Join(l.State().EtcdEndpoints(), ","))
	if err != nil {
		return err
	}
	if o.NodeGCGrace != "" {
		if agentManifest, err = setConfigMapValue(agentManifest, "node_gc_grace", o.NodeGCGrace); err != nil {
			return err
		}
	}
	applied := filepath.Join(dir, "tabby-etcd.yaml")
	if err := os.WriteFile(applied, agentManifest, 0o644); err != nil {
		return err
	}
	servicesEndpoint := filepath.Join(dir, "kubernetes-services-endpoint.yaml")
	if err := os.WriteFile(servicesEndpoint, []byte(servicesEndpointConfigMap()), 0o644); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	timeout := fmt.Sprintf("--timeout=%ds", int(o.Timeout.Seconds()))
	// The README's order: the agents, ready on every node (the nodes
	// Ready, so that the controllers' replicas can spread), then the
	// controllers.
	for _, args := range [][]string{
		{"create", "namespace", "tabby-system"},
		{"-n", "tabby-system", "create", "secret", "generic", "tabby-etcd-secrets"},
		{"apply", "-f", applied},
		{"-n", "tabby-system", "rollout", "status", "daemonset/tabby-node", timeout},
		{"wait", "--for=condition=Ready", "node", "--all", timeout},
		{"apply", "-f", servicesEndpoint},
		// The network-policy-api CRDs the controllers translate (the
		// README: before the controllers, so that they watch them at once).
		{"apply", "--server-side", "-f", filepath.Join(o.ManifestDir, "network-policy-api")},
		{"apply", "-f", filepath.Join(o.ManifestDir, "tabby-kube-controllers.yaml")},
		{"-n", "tabby-system", "rollout", "status", "deployment/tabby-kube-controllers", timeout},
	} {
		out, err := l.Kubectl(wctx, args...)
		if err != nil {
			return fmt.Errorf("deploying Tabby: %w", err)
		}
		l.Progress("kubectl %s: %s", strings.Join(args, " "), bytes.TrimSpace(out))
	}
	l.Progress("Tabby is deployed: DaemonSet ready, controllers available, every node Ready")
	return nil
}

// servicesEndpointConfigMap points tabby-kube-controllers at the lab's API
// server (see manifests/tabby-kube-controllers.yaml).
func servicesEndpointConfigMap() string {
	return `apiVersion: v1
kind: ConfigMap
metadata:
  name: kubernetes-services-endpoint
  namespace: tabby-system
data:
  KUBERNETES_SERVICE_HOST: "` + apiServerAddr.String() + `"
  KUBERNETES_SERVICE_PORT: "` + fmt.Sprint(apiServerPort) + `"
`
}

// etcdPlaceholder is the endpoint manifests/tabby-etcd.yaml leaves for the
// operator (README: sed it).
const etcdPlaceholder = "https://<ETCD_IP>:<ETCD_PORT>"

// PlainHTTPManifest is manifests/tabby-etcd.yaml as the README's plain
// HTTP variant makes it: the endpoint placeholder replaced (the README's
// sed), the TLS file keys of the ConfigMap set to "".
func PlainHTTPManifest(manifest []byte, endpoints string) ([]byte, error) {
	if !bytes.Contains(manifest, []byte(etcdPlaceholder)) {
		return nil, fmt.Errorf("manifests/tabby-etcd.yaml has no %s for the README's sed", etcdPlaceholder)
	}
	out := bytes.ReplaceAll(manifest, []byte(etcdPlaceholder), []byte(endpoints))
	for _, k := range []string{"etcd_ca", "etcd_cert", "etcd_key"} {
		var n int
		lines := strings.Split(string(out), "\n")
		for i, line := range lines {
			if strings.HasPrefix(strings.TrimSpace(line), k+": ") && strings.Contains(line, "/tabby-secrets/") {
				lines[i] = line[:strings.Index(line, k+": ")] + k + `: ""`
				n++
			}
		}
		if n != 1 {
			return nil, fmt.Errorf("manifests/tabby-etcd.yaml: %d ConfigMap lines %s with a /tabby-secrets path, want 1", n, k)
		}
		out = []byte(strings.Join(lines, "\n"))
	}
	return out, nil
}

// setConfigMapValue sets the one top-level data key `key: "…"` of the
// manifest's ConfigMap.
func setConfigMapValue(manifest []byte, key, value string) ([]byte, error) {
	lines := strings.Split(string(manifest), "\n")
	n := 0
	for i, line := range lines {
		if strings.HasPrefix(line, "  "+key+": ") {
			lines[i] = "  " + key + `: "` + value + `"`
			n++
		}
	}
	if n != 1 {
		return nil, fmt.Errorf("manifest: %d ConfigMap lines for %s, want 1", n, key)
	}
	return []byte(strings.Join(lines, "\n")), nil
}
