package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/embedded"
)

// certs writes a CA, a server certificate for 127.0.0.1 and a client
// certificate it signed: ca, cert, key, clientCert, clientKey.
func certs(t *testing.T) (ca, cert, key, cliCert, cliKey string) {
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
	keyPEM := func(name string, k *ecdsa.PrivateKey) string {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return write(name, "PRIVATE KEY", der)
	}
	caKey := newKey()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, usage x509.ExtKeyUsage, ips []net.IP) ([]byte, *ecdsa.PrivateKey) {
		k := newKey()
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "leaf"},
			IPAddresses: ips, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	srvDER, srvKey := leaf(2, x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)})
	cliDER, cliK := leaf(3, x509.ExtKeyUsageClientAuth, nil)
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), keyPEM("server-key.pem", srvKey),
		write("client.pem", "CERTIFICATE", cliDER), keyPEM("client-key.pem", cliK)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// The relay as its command runs it, TLS both ways: an agent's store with
// the etcd TLS files watches through it (a watch with WatchSpec.Skip gets
// its events), and a client without a certificate is refused.
func TestRelayServesWithTLS(t *testing.T) {
	ca, cert, key, cliCert, cliKey := certs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := embedded.Start(ctx, embedded.Config{Dir: t.TempDir(), CertFile: cert, KeyFile: key, ClientCAFile: ca, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	tlsFiles := datastore.Config{Endpoints: e.Endpoints(), CAFile: ca, CertFile: cliCert, KeyFile: cliKey}
	addr := freeAddr(t)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(rctx, config{etcd: tlsFiles, listen: addr, certFile: cert, keyFile: key, clientCAFile: ca, window: 100 * time.Millisecond}, slog.LevelWarn)
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()

	agentCfg := tlsFiles
	agentCfg.WatchEndpoints = []string{"https://" + addr}
	s, err := datastore.New(ctx, agentCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ch := s.WatchKeys(ctx, datastore.WatchSpec{Skip: []datastore.KeyRange{{From: "b/", To: "c/"}}}, 0)
	if ev := <-ch; ev.Type != datastore.EventResync {
		t.Fatalf("first event %+v, want a resync", ev)
	}
	rev, err := s.PutKV(ctx, "a/1", []byte("x"), 0)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(30 * time.Second)
	for got := false; !got; {
		select {
		case ev := <-ch:
			got = ev.Type == datastore.EventPut && ev.KV.Key == "a/1"
		case <-deadline:
			t.Fatalf("a/1 (revision %d) never came through the relay", rev)
		}
	}
	// No client certificate: the handshake fails.
	pool := x509.NewCertPool()
	b, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(b)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	st, err := pb.NewWatchClient(conn).Watch(wctx)
	if err == nil {
		err = st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("/tabby/"), RangeEnd: []byte("/tabby0")}}})
		if err == nil {
			_, err = st.Recv()
		}
	}
	if err == nil {
		t.Error("a client without a certificate was served")
	}
}

// Flags that cannot work are refused before anything starts.
func TestRunRefusesBadFlags(t *testing.T) {
	for _, c := range []struct {
		cfg  config
		want string
	}{
		{config{window: 0}, "batch-window"},
		{config{window: time.Minute}, "batch-window"},
		{config{window: time.Second, certFile: "c"}, "together"},
		{config{window: time.Second, clientCAFile: "ca"}, "client-ca-file"},
	} {
		if err := run(context.Background(), c.cfg, slog.LevelError); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error about %s", c.cfg, err, c.want)
		}
	}
}
