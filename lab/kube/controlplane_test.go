package kube

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestLabCA: the API server's certificate verifies against the lab's CA
// for the address kubelets and pods use; a kubelet's client certificate
// names the identity the Node authorizer serves and verifies as a client;
// the CA survives a write and a read (kubelets started later use it).
func TestLabCA(t *testing.T) {
	ca, keyPEM, err := createCA("t")
	if err != nil {
		t.Fatal(err)
	}
	serving, _, err := ca.issue(pkix.Name{CommonName: "kube-apiserver"}, []net.IP{apiServerAddr.AsSlice()}, []string{"kubernetes.default.svc"})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	for _, name := range []string{apiServerAddr.String(), "kubernetes.default.svc"} {
		if _, err := parsePEM(t, serving).Verify(x509.VerifyOptions{Roots: roots, DNSName: name}); err != nil {
			t.Errorf("serving certificate for %s: %v", name, err)
		}
	}
	dir := t.TempDir()
	if err := writeFiles(dir, map[string][]byte{"ca.crt": ca.certPEM, "ca.key": keyPEM}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "ca.key")); err != nil {
		t.Error(err)
	} else if fi.Mode().Perm() != 0o600 {
		t.Errorf("ca.key mode %v, want 0600", fi.Mode().Perm())
	}
	loaded, err := loadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	client, _, err := loaded.issue(pkix.Name{CommonName: "system:node:node1", Organization: []string{"system:nodes"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := parsePEM(t, client)
	if c.Subject.CommonName != "system:node:node1" || len(c.Subject.Organization) != 1 || c.Subject.Organization[0] != "system:nodes" {
		t.Errorf("kubelet certificate subject %v", c.Subject)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("kubelet client certificate: %v", err)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: roots}); err == nil {
		t.Error("a client certificate verifies as a server's")
	}
}

func parsePEM(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("no PEM block")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestKubeconfigs: both kubeconfigs the lab writes decode, with the
// server, the TLS check and the credentials where kubectl and the kubelet
// look for them.
func TestKubeconfigs(t *testing.T) {
	type cfg struct {
		Clusters []struct {
			Cluster map[string]any `json:"cluster"`
		} `json:"clusters"`
		Users []struct {
			User map[string]any `json:"user"`
		} `json:"users"`
		CurrentContext string `json:"current-context"`
	}
	decode := func(s string) cfg {
		var c cfg
		if err := yaml.Unmarshal([]byte(s), &c); err != nil {
			t.Fatalf("%v:\n%s", err, s)
		}
		if len(c.Clusters) != 1 || len(c.Users) != 1 || c.CurrentContext != "lab" {
			t.Fatalf("kubeconfig:\n%s", s)
		}
		return c
	}
	tok := decode(kubeconfig("https://127.0.0.1:6443", "secret"))
	if tok.Clusters[0].Cluster["insecure-skip-tls-verify"] != true || tok.Users[0].User["token"] != "secret" ||
		tok.Clusters[0].Cluster["server"] != "https://127.0.0.1:6443" {
		t.Errorf("token kubeconfig: %+v", tok)
	}
	b64 := base64.StdEncoding.EncodeToString
	crt := decode(certKubeconfig(APIServerURL(), []byte("CA"), []byte("CERT"), []byte("KEY")))
	if crt.Clusters[0].Cluster["certificate-authority-data"] != b64([]byte("CA")) ||
		crt.Users[0].User["client-certificate-data"] != b64([]byte("CERT")) || crt.Users[0].User["client-key-data"] != b64([]byte("KEY")) ||
		!strings.HasPrefix(crt.Clusters[0].Cluster["server"].(string), "https://198.18.0.2:") {
		t.Errorf("certificate kubeconfig: %+v", crt)
	}
}
