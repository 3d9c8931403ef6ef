package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/embedded"
	"github.com/tabbynet/tabby/datastore/storetest"
)

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
	p := storetest.NewPKI(t)
	ca, cert, key, cliCert, cliKey := p.CA, p.ServerCert, p.ServerKey, p.ClientCert, p.ClientKey
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := embedded.Start(ctx, embedded.Config{Dir: t.TempDir(), CertFile: cert, KeyFile: key, ClientCAFile: ca, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	tlsFiles := datastore.Config{Endpoints: e.Endpoints(), CAFile: ca, CertFile: cliCert, KeyFile: cliKey}
	addr, maddr := freeAddr(t), freeAddr(t)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(rctx, config{etcd: tlsFiles, listen: addr, certFile: cert, keyFile: key, clientCAFile: ca, window: 100 * time.Millisecond,
			metricsListen: maddr}, slog.LevelWarn)
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
	// --metrics-listen: health and the stream counted.
	for path, want := range map[string]string{"/livez": "ok", "/readyz": "ok", "/metrics": "tabby_relay_streams 1"} {
		resp, err := http.Get("http://" + maddr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d, want 200 with %q:\n%.2000s", path, resp.StatusCode, want, body)
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
