package storetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a CA with a server certificate for 127.0.0.1 and a client
// certificate, written as PEM files into a temporary directory.
type PKI struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
	OtherCA                                          string // a CA that signed nothing of the above
}

// NewPKI writes a PKI into a temporary directory of t.
func NewPKI(t testing.TB) PKI {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	serial := int64(1)
	sign := func(tmpl, parent *x509.Certificate, pub, signer any) (*x509.Certificate, []byte) {
		serial++
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore = time.Now().Add(-time.Hour)
		tmpl.NotAfter = time.Now().Add(time.Hour)
		if parent == nil {
			parent = tmpl
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return c, der
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	caTmpl := func(cn string) *x509.Certificate {
		return &x509.Certificate{
			Subject: pkix.Name{CommonName: cn}, IsCA: true, BasicConstraintsValid: true,
			KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		}
	}
	var p PKI
	caKey := newKey()
	ca, caDER := sign(caTmpl("tabby test ca"), nil, &caKey.PublicKey, caKey)
	p.CA = write("ca.pem", "CERTIFICATE", caDER)
	otherKey := newKey()
	_, otherDER := sign(caTmpl("other ca"), nil, &otherKey.PublicKey, otherKey)
	p.OtherCA = write("other-ca.pem", "CERTIFICATE", otherDER)

	srvKey := newKey()
	_, srvDER := sign(&x509.Certificate{
		Subject: pkix.Name{CommonName: "etcd"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca, &srvKey.PublicKey, caKey)
	p.ServerCert = write("server.pem", "CERTIFICATE", srvDER)
	p.ServerKey = write("server-key.pem", "PRIVATE KEY", keyDER(srvKey))

	cliKey := newKey()
	_, cliDER := sign(&x509.Certificate{
		Subject:  pkix.Name{CommonName: "tabby-agent"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, &cliKey.PublicKey, caKey)
	p.ClientCert = write("client.pem", "CERTIFICATE", cliDER)
	p.ClientKey = write("client-key.pem", "PRIVATE KEY", keyDER(cliKey))
	return p
}
