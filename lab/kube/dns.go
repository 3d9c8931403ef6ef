package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	return `apiVersion: v1
kind: ServiceAccount
metadata:
  name: coredns
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
- kind: ServiceAccount
  name: coredns
  namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: kube-system
data:
  Corefile: |
` + indent(corefile, 4) + `---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
spec:
  replicas: ` + fmt.Sprint(DNSReplicas) + `
  selector:
    matchLabels:
      k8s-app: kube-dns
  template:
    metadata:
      labels:
        k8s-app: kube-dns
    spec:
      serviceAccountName: coredns
      # Its own resolver is the node's (empty in the lab), never itself.
      dnsPolicy: Default
      terminationGracePeriodSeconds: 5
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: ScheduleAnyway
        labelSelector:
          matchLabels:
            k8s-app: kube-dns
      containers:
      - name: coredns
        image: ` + image.CoreDNSName + `
        imagePullPolicy: Never
        args: ["-conf", "/etc/coredns/Corefile"]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
          periodSeconds: 2
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          initialDelaySeconds: 30
          periodSeconds: 10
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
      volumes:
      - name: config
        configMap:
          name: coredns
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
spec:
  clusterIP: ` + DNSServiceIP + `
  selector:
    k8s-app: kube-dns
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
`
}

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
