// Package kubetest runs a real kube-apiserver for tests, on an etcd of the
// test's own, on 127.0.0.1 ports of its own. The binary is built once by
// `make kube-bins` (scripts/kube-bins.sh) into a cache outside the tree;
// without it the tests skip with a message saying so.
package kubetest

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/kube/kubebins"
)

// Version is the Kubernetes release the tests run (kubebins.Version).
const Version = kubebins.Version

// Binaries are the Kubernetes commands `make kube-bins` builds.
var Binaries = kubebins.Names

// Binary returns the kube-apiserver to run: $TABBY_KUBE_APISERVER, else
// the cache that `make kube-bins` fills.
func Binary() string { return kubebins.Path("kube-apiserver") }

// BinaryPath is where `make kube-bins` puts the named command (see
// kubebins.Path).
func BinaryPath(name string) string { return kubebins.Path(name) }

// Require returns the paths of the named commands, by name, or skips the
// test (and returns nil) with a message naming each one that is not built
// and how to build it.
func Require(t testing.TB, names ...string) map[string]string {
	t.Helper()
	paths, err := kubebins.Find(names...)
	if err != nil {
		t.Skipf("%s", err)
		return nil
	}
	return paths
}

// APIServer is a running kube-apiserver.
type APIServer struct {
	// Config authenticates as a cluster admin (group system:masters).
	Config *rest.Config
	// Tokens holds the static tokens: "admin", "controllers" for the
	// user "tabby-kube-controllers" (no group: RBAC decides), and
	// "node:<name>" for each of Options.Nodes.
	Tokens map[string]string
	Client kubernetes.Interface
	URL    string
}

// As returns a client authenticated with the named token.
func (s *APIServer) As(t testing.TB, token string) kubernetes.Interface {
	t.Helper()
	c := rest.CopyConfig(s.Config)
	c.BearerToken = s.Tokens[token]
	kc, err := kubernetes.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Options configure StartWith.
type Options struct {
	// Nodes get a token each, "node:<name>", for the user
	// system:node:<name> in the group system:nodes, which the Node
	// authorizer serves: what a kubelet registering <name> needs.
	Nodes []string
	// ServiceCIDRs is --service-cluster-ip-range; "" is 10.96.0.0/16.
	// Two CIDRs, comma-separated, one per family, make the cluster
	// dual-stack for Services.
	ServiceCIDRs string
}

// Start runs kube-apiserver until the test ends, or skips the test (with
// the reason printed) when the binary is not built.
func Start(t testing.TB) *APIServer {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with options.
func StartWith(t testing.TB, o Options) *APIServer {
	t.Helper()
	bin := Binary()
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("kube-apiserver %s not built (%v): run `make kube-bins` (about 8 minutes, once) or set TABBY_KUBE_APISERVER", Version, err)
	}
	etcd := storetest.Etcd(t)
	dir := t.TempDir()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	saKey := filepath.Join(dir, "sa.key")
	if err := os.WriteFile(saKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{"admin": rand.Text(), "controllers": rand.Text()}
	tokenFile := filepath.Join(dir, "tokens.csv")
	csv := fmt.Sprintf("%s,admin,admin-uid,\"system:masters\"\n%s,tabby-kube-controllers,tkc-uid\n", tokens["admin"], tokens["controllers"])
	for _, n := range o.Nodes {
		tok := rand.Text()
		tokens["node:"+n] = tok
		csv += fmt.Sprintf("%s,system:node:%s,node-%s-uid,\"system:nodes\"\n", tok, n, n)
	}
	if err := os.WriteFile(tokenFile, []byte(csv), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	logPath := filepath.Join(dir, "kube-apiserver.log")
	cmd := exec.Command(bin,
		"--etcd-servers="+strings.Join(etcd.Endpoints(), ","),
		"--etcd-prefix=/registry",
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port),
		"--cert-dir="+filepath.Join(dir, "certs"),
		"--token-auth-file="+tokenFile,
		// Node: kubelets (system:nodes) get what their node needs.
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+saKey,
		"--service-account-signing-key-file="+saKey,
		"--service-cluster-ip-range="+cmp.Or(o.ServiceCIDRs, "10.96.0.0/16"),
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false",
		"--allow-privileged=true",
		"--endpoint-reconciler-type=none",
		"--v=1",
	)
	start := time.Now()
	exited := StartDaemon(t, "kube-apiserver", cmd, logPath, nil)
	url := "https://127.0.0.1:" + strconv.Itoa(port)
	rc := &rest.Config{Host: url, BearerToken: tokens["admin"], TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS: 500, Burst: 1000}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		body, err := kc.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil && bytes.Equal(bytes.TrimSpace(body), []byte("ok")) {
			break
		}
		select {
		case werr := <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("kube-apiserver exited: %v\n%s", werr, b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver not ready after 90 s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("kube-apiserver %s ready at %s in %s", Version, url, time.Since(start).Round(time.Millisecond))
	return &APIServer{Config: rc, Tokens: tokens, Client: kc, URL: url}
}

// StartDaemon starts cmd with its output in a new file at logPath, killed
// with the test process (Pdeathsig), and stops it when the test ends:
// SIGTERM, then SIGKILL after 10 s. onStop, when set, gets what Wait
// returned and whether SIGTERM sufficed; when the test failed, the log's
// tail is logged. The channel receives Wait's result once the process
// exits.
func StartDaemon(tb testing.TB, name string, cmd *exec.Cmd, logPath string, onStop func(err error, termed bool)) <-chan error {
	tb.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		tb.Fatalf("starting %s: %v", name, err)
	}
	exited := make(chan error, 1)
	waited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		waited <- err
		exited <- err
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		var err error
		termed := true
		select {
		case err = <-waited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			err, termed = <-waited, false
		}
		_ = logf.Close()
		if onStop != nil {
			onStop(err, termed)
		}
		if tb.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			tb.Logf("%s log (tail):\n%s", name, b)
		}
	})
	return exited
}
