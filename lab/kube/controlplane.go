package kube

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tabbynet/tabby/kube/kubebins"
	"github.com/tabbynet/tabby/lab"
)

// The lab's Kubernetes control plane lives in the control-plane namespace
// (<lab>-etcd) next to etcd: kube-apiserver serves on the first etcd
// member's address (198.18.0.2:6443), so the kubelets and the pods of every
// node reach it across the fabric, and keeps its objects in the lab's etcd
// under /registry (Tabby's keys are under /tabby: the two share one etcd,
// as a Tabby on a kubeadm control plane's etcd would).
// kube-controller-manager and kube-scheduler run beside it. The lab is the
// cluster's certificate authority: it issues the API server's serving
// certificate and a client certificate for every user (admin, each kubelet),
// all under <lab dir>/kube.

const (
	// apiServerPort is kube-apiserver's port on apiServerAddr.
	apiServerPort = 6443
	// ServiceCIDR is the cluster's Service range. No route leads there:
	// each node's kube-proxy (StartKubeProxy) translates a ClusterIP to a
	// backend's address before the node routes the packet. Tabby's own
	// controllers still reach the API server by its address (the
	// kubernetes-services-endpoint ConfigMap), as manifests/README.md
	// tells an operator whose pods cannot reach Services before Tabby
	// runs.
	ServiceCIDR = "10.96.0.0/16"
	// KubernetesServiceIP is the kubernetes Service's ClusterIP, the
	// range's first address (in the API server's certificate).
	KubernetesServiceIP = "10.96.0.1"
	// kubeDirName holds the control plane's files inside the lab directory.
	kubeDirName = "kube"
)

// apiServerAddr is where kube-apiserver listens: the control-plane
// namespace's first address.
var apiServerAddr = lab.ControlPlaneAddr()

// APIServerURL is the lab API server's URL on the fabric.
func APIServerURL() string {
	return "https://" + netip.AddrPortFrom(apiServerAddr, apiServerPort).String()
}

// KubeControllers are the kube-controller-manager controllers the lab
// runs: what Deployments, DaemonSets, node lifecycle (the not-ready taint,
// evictions), pod garbage collection and service account tokens need, and
// the EndpointSlices of Services (kube-proxy and CoreDNS read them;
// mirroring gives selectorless Services' Endpoints slices too), and
// StatefulSets (the network-policy-api conformance suite's pods).
var KubeControllers = []string{
	"daemonset-controller", "deployment-controller", "replicaset-controller", "statefulset-controller", "garbage-collector-controller",
	"namespace-controller", "node-lifecycle-controller", "taint-eviction-controller", "pod-garbage-collector-controller",
	"serviceaccount-controller", "root-ca-certificate-publisher-controller", "disruption-controller",
	"endpointslice-controller", "endpointslice-mirroring-controller",
}

func (l *Cluster) kubeDir() string { return filepath.Join(l.Dir(), kubeDirName) }

// AdminKubeconfig is the path of a kubeconfig for the cluster's admin
// (group system:masters), valid inside the control-plane namespace and
// any node's (see Kubectl).
func (l *Cluster) AdminKubeconfig() string { return filepath.Join(l.kubeDir(), "admin.kubeconfig") }

// labCA is the lab cluster's certificate authority.
type labCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

func newKey() (*ecdsa.PrivateKey, []byte, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, nil, err
	}
	return k, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// newCert makes a key and a certificate for it from tmpl (serial and
// validity filled in), signed by parent's key, or self-signed when parent
// is nil.
func newCert(tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (der []byte, key *ecdsa.PrivateKey, keyPEM []byte, err error) {
	if key, keyPEM, err = newKey(); err != nil {
		return nil, nil, nil, err
	}
	if tmpl.SerialNumber, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120)); err != nil {
		return nil, nil, nil, err
	}
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().AddDate(1, 0, 0)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err = x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	return der, key, keyPEM, err
}

// createCA makes a self-signed CA for the lab.
func createCA(name string) (*labCA, []byte, error) {
	der, key, keyPEM, err := newCert(&x509.Certificate{
		Subject: pkix.Name{CommonName: "tabby-lab " + name + " CA"},
		IsCA:    true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil, nil)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return &labCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, keyPEM, nil
}

// loadCA reads the CA that StartControlPlane wrote.
func loadCA(dir string) (*labCA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("%s: no PEM in ca.crt or ca.key", dir)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, err
	}
	return &labCA{cert: cert, key: key, certPEM: certPEM}, nil
}

// issue signs a certificate for subject: a client certificate when ips and
// dns are empty, else a serving certificate for them.
func (ca *labCA) issue(subject pkix.Name, ips []net.IP, dns []string) (certPEM, keyPEM []byte, err error) {
	tmpl := &x509.Certificate{Subject: subject, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if len(ips) > 0 || len(dns) > 0 {
		tmpl.IPAddresses, tmpl.DNSNames = ips, dns
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	der, _, keyPEM, err := newCert(tmpl, ca.cert, ca.key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// certKubeconfig is a kubeconfig for server, checked against the CA,
// authenticating with a client certificate.
func certKubeconfig(server string, caPEM, certPEM, keyPEM []byte) string {
	b64 := base64.StdEncoding.EncodeToString
	return kubeconfigWith(server, "certificate-authority-data: "+b64(caPEM),
		"client-certificate-data: "+b64(certPEM)+"\n    client-key-data: "+b64(keyPEM))
}

// writeFiles writes name → content into dir, keys (*.key, *kubeconfig)
// readable by root only.
func writeFiles(dir string, files map[string][]byte) error {
	for name, content := range files {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".key") || strings.HasSuffix(name, "kubeconfig") {
			mode = 0o600
		}
		if err := os.WriteFile(filepath.Join(dir, name), content, mode); err != nil {
			return err
		}
	}
	return nil
}

// StartControlPlane starts kube-apiserver, kube-controller-manager and
// kube-scheduler in the control-plane namespace (see ControlPlane) and
// waits until the API server is ready. Teardown stops them after the
// nodes' kubelets and containers, before etcd.
func (l *Cluster) StartControlPlane(ctx context.Context) error {
	bins, err := kubebins.Find("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
	if err != nil {
		return err
	}
	st := l.State()
	if st.Kube != nil && st.Kube.APIServer.Alive() {
		return fmt.Errorf("the control plane is running (kube-apiserver pid %d)", st.Kube.APIServer.PID)
	}
	dir := l.kubeDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := writeControlPlaneCerts(dir, st.Name); err != nil {
		return err
	}
	if err := l.Update(func(s *lab.State) error {
		if s.Kube == nil {
			s.Kube = &lab.ControlPlane{}
		}
		return nil
	}); err != nil {
		return err
	}
	f := func(name string) string { return filepath.Join(dir, name) }
	if err := l.startAPIServer(ctx, bins["kube-apiserver"], st, dir); err != nil {
		return err
	}
	kcm := []string{bins["kube-controller-manager"],
		"--kubeconfig=" + l.AdminKubeconfig(),
		"--controllers=" + strings.Join(KubeControllers, ","),
		"--root-ca-file=" + f("ca.crt"),
		"--service-account-private-key-file=" + f("sa.key"),
		// Tabby's IPAM gives pods their addresses, not node CIDRs.
		"--allocate-node-cidrs=false",
		"--leader-elect=false", "--secure-port=0", "--v=1",
	}
	p, _, err := l.StartDetached("kube-controller-manager", st.EtcdNS(), kcm, f("kube-controller-manager.log"), lab.PIDFile(dir, "kube-controller-manager"))
	if err != nil {
		return err
	}
	if err := l.Update(func(s *lab.State) error { s.Kube.ControllerManager = p; return nil }); err != nil {
		return err
	}
	sched := []string{bins["kube-scheduler"], "--kubeconfig=" + l.AdminKubeconfig(), "--leader-elect=false", "--secure-port=0", "--v=1"}
	if p, _, err = l.StartDetached("kube-scheduler", st.EtcdNS(), sched, f("kube-scheduler.log"), lab.PIDFile(dir, "kube-scheduler")); err != nil {
		return err
	}
	return l.Update(func(s *lab.State) error { s.Kube.Scheduler = p; return nil })
}

// writeControlPlaneCerts creates the lab's CA and the certificates and
// keys the control plane uses, and the admin's kubeconfig, in dir.
func writeControlPlaneCerts(dir, labName string) error {
	ca, caKey, err := createCA(labName)
	if err != nil {
		return fmt.Errorf("creating the lab CA: %w", err)
	}
	serving, servingKey, err := ca.issue(pkix.Name{CommonName: "kube-apiserver"},
		[]net.IP{apiServerAddr.AsSlice(), net.ParseIP(KubernetesServiceIP), net.ParseIP("127.0.0.1")},
		[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"})
	if err != nil {
		return err
	}
	admin, adminKey, err := ca.issue(pkix.Name{CommonName: "lab-admin", Organization: []string{"system:masters"}}, nil, nil)
	if err != nil {
		return err
	}
	// What the API server presents to kubelets (logs, exec): a client of
	// the group system:masters, which the kubelets' x509 authentication
	// accepts (their authorization allows every authenticated client).
	kubeletClient, kubeletClientKey, err := ca.issue(pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}}, nil, nil)
	if err != nil {
		return err
	}
	_, saKey, err := newKey()
	if err != nil {
		return err
	}
	if err := writeFiles(dir, map[string][]byte{
		"ca.crt": ca.certPEM, "ca.key": caKey,
		"apiserver.crt": serving, "apiserver.key": servingKey,
		"apiserver-kubelet-client.crt": kubeletClient, "apiserver-kubelet-client.key": kubeletClientKey,
		"sa.key":    saKey,
		"admin.crt": admin, "admin.key": adminKey,
		"admin.kubeconfig": []byte(certKubeconfig(APIServerURL(), ca.certPEM, admin, adminKey)),
	}); err != nil {
		return fmt.Errorf("writing the control plane's files: %w", err)
	}
	return nil
}

// startAPIServer starts kube-apiserver (bin) in the control-plane
// namespace with the files in dir, records it in the lab's state and
// waits until it is ready.
func (l *Cluster) startAPIServer(ctx context.Context, bin string, st *lab.State, dir string) error {
	f := func(name string) string { return filepath.Join(dir, name) }
	apiserver := []string{bin,
		"--etcd-servers=" + strings.Join(st.EtcdEndpoints(), ","),
		"--etcd-prefix=/registry",
		"--bind-address=" + apiServerAddr.String(),
		"--advertise-address=" + apiServerAddr.String(),
		"--secure-port=" + strconv.Itoa(apiServerPort),
		"--tls-cert-file=" + f("apiserver.crt"), "--tls-private-key-file=" + f("apiserver.key"),
		"--client-ca-file=" + f("ca.crt"),
		"--kubelet-client-certificate=" + f("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + f("apiserver-kubelet-client.key"),
		// Kubelets by their fabric address: a node's name resolves
		// nowhere in the lab (and a lookup would go to the host's
		// resolver, outside it).
		"--kubelet-preferred-address-types=InternalIP",
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + f("sa.key"),
		"--service-account-signing-key-file=" + f("sa.key"),
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--allow-privileged=true",
		// The default (lease) endpoint reconciler keeps the kubernetes
		// Service's EndpointSlice at this address, so that pods reach the
		// API server at its ClusterIP through kube-proxy (CoreDNS does).
		// No priority-and-fairness bookkeeping on a 2-core machine.
		"--enable-priority-and-fairness=false",
		"--v=1",
	}
	p, _, err := l.StartDetached("kube-apiserver", st.EtcdNS(), apiserver, f("kube-apiserver.log"), lab.PIDFile(dir, "kube-apiserver"))
	if err != nil {
		return err
	}
	if err := l.Update(func(s *lab.State) error { s.Kube.APIServer = p; return nil }); err != nil {
		return err
	}
	l.Progress("starting kube-apiserver at %s", APIServerURL())
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	err = lab.Poll(wctx, 250*time.Millisecond, func() (bool, error) {
		if !p.Alive() {
			return false, fmt.Errorf("kube-apiserver exited (%s):\n%s", p.Describe(), logTail(p.Log))
		}
		out, err := l.Kubectl(wctx, "get", "--raw", "/readyz")
		return err == nil && strings.TrimSpace(string(out)) == "ok", nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-apiserver: %w", err)
	}
	return nil
}

// ControlPlaneRunning reports whether every control-plane process lives,
// naming the first that does not.
func (l *Cluster) ControlPlaneRunning() error {
	st := l.State()
	if st.Kube == nil {
		return errors.New("no control plane: start it first")
	}
	for _, p := range []*lab.Proc{st.Kube.APIServer, st.Kube.ControllerManager, st.Kube.Scheduler} {
		if p == nil {
			return errors.New("control plane not fully started")
		}
		if !p.Alive() {
			return fmt.Errorf("%s (pid %d) exited:\n%s", p.Role, p.PID, logTail(p.Log))
		}
	}
	return nil
}

// AdminCredentials are the files of the admin's client certificate and
// key and of the CA that signed the API server's certificate.
func (l *Cluster) AdminCredentials() (caFile, certFile, keyFile string) {
	d := l.kubeDir()
	return filepath.Join(d, "ca.crt"), filepath.Join(d, "admin.crt"), filepath.Join(d, "admin.key")
}

// KubeDial dials addr inside the control-plane namespace: Kubernetes
// clients of this process (which has no route to the fabric) reach the API
// server through it.
func (l *Cluster) KubeDial() func(ctx context.Context, network, addr string) (net.Conn, error) {
	ns := l.State().EtcdNS()
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return lab.DialIn(ctx, ns, network, addr)
	}
}

// kubectlPath is the kubectl of `make kube-bins` (the cluster's release),
// else the one on PATH.
func kubectlPath() string {
	if p := kubebins.Path("kubectl"); unix.Access(p, unix.X_OK) == nil {
		return p
	}
	return "kubectl"
}

// Kubectl runs kubectl (kubectlPath) as the cluster's admin, inside the
// control-plane namespace, and returns its combined output.
func (l *Cluster) Kubectl(ctx context.Context, args ...string) ([]byte, error) {
	argv := append([]string{"--net=" + lab.NetNSPath(l.State().EtcdNS()), "--", kubectlPath(), "--kubeconfig", l.AdminKubeconfig()}, args...)
	out, err := exec.CommandContext(ctx, "nsenter", argv...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// kubeletCredentials issues node's kubelet a client certificate
// (system:node:<node> in system:nodes, what the Node authorizer serves)
// and returns its kubeconfig and the CA file for its own x509
// authentication.
func (l *Cluster) kubeletCredentials(node string) (kubeconfig string, caFile string, err error) {
	ca, err := loadCA(l.kubeDir())
	if err != nil {
		return "", "", fmt.Errorf("no control plane to register %s with: %w", node, err)
	}
	cert, key, err := ca.issue(pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}, nil, nil)
	if err != nil {
		return "", "", err
	}
	return certKubeconfig(APIServerURL(), ca.certPEM, cert, key), filepath.Join(l.kubeDir(), "ca.crt"), nil
}
