package datastore_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/embedded"
)

func TestEmbeddedGivenClientURL(t *testing.T) {
	// 127.0.0.2 is loopback on Linux without any configuration: it stands
	// in for an address like 198.18.0.1 inside a lab namespace.
	l, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("127.0.0.2 not usable here: %v", err)
	}
	url := "http://" + l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	e := startEtcd(t, embedded.Config{ClientURL: url})
	if got := e.Endpoints(); len(got) != 1 || got[0] != url {
		t.Fatalf("Endpoints() = %v, want [%s]", got, url)
	}
	if err := connect(t, datastore.Config{Endpoints: e.Endpoints()}); err != nil {
		t.Errorf("connecting to %s: %v", url, err)
	}
}

func TestEmbeddedBadConfig(t *testing.T) {
	for _, cfg := range []embedded.Config{
		{ClientURL: "127.0.0.1:2379"},
		{ClientURL: "http://127.0.0.1"},
		{ClientURL: "https://127.0.0.1:2379"}, // https without certificates
		{CertFile: "cert.pem"},
		{ClientCAFile: "ca.pem"},
		{PeerURL: "127.0.0.1:2380"},
		{PeerURL: "https://127.0.0.1:2380"},
	} {
		cfg.Dir = t.TempDir()
		e, err := embedded.Start(context.Background(), cfg)
		if err == nil {
			e.Stop()
			t.Errorf("StartEmbedded(%+v) succeeded", cfg)
		}
	}
}

func TestEmbeddedOwnDirRemovedByStop(t *testing.T) {
	e, err := embedded.Start(context.Background(), embedded.Config{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := e.Dir()
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("data dir: %v", err)
	}
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("data dir %s after Stop: %v, want it removed", dir, err)
	}
	if err := e.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := e.Restart(context.Background()); err == nil || !strings.Contains(err.Error(), "restarting") {
		t.Errorf("Restart after its directory was removed: %v, want an error", err)
	}
}

// Three members make a cluster that keeps serving with one of them stopped,
// and the stopped member rejoins on its data with what was written
// meanwhile.
func TestEmbeddedCluster(t *testing.T) {
	const n = 3
	var clientURLs, peerURLs []string
	var members []string
	for i := range n {
		urls := make([]string, 2)
		for j := range urls {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			urls[j] = "http://" + l.Addr().String()
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
		}
		clientURLs, peerURLs = append(clientURLs, urls[0]), append(peerURLs, urls[1])
		members = append(members, fmt.Sprintf("m%d=%s", i, urls[1]))
	}
	// Each member's Start returns once the cluster has a quorum, so they
	// start together.
	es := make([]*embedded.Etcd, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			es[i], errs[i] = embedded.Start(context.Background(), embedded.Config{
				Dir: t.TempDir(), Name: fmt.Sprintf("m%d", i), ClientURL: clientURLs[i], PeerURL: peerURLs[i],
				InitialCluster: strings.Join(members, ","), UnsafeNoFsync: true,
			})
		})
	}
	wg.Wait()
	for i, e := range es {
		if errs[i] != nil {
			t.Fatalf("member %d: %v", i, errs[i])
		}
		t.Cleanup(func() {
			if err := e.Stop(); err != nil {
				t.Error(err)
			}
		})
	}
	s, err := datastore.New(context.Background(), datastore.Config{Endpoints: clientURLs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.PutKV(ctx, "cluster/before", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	if err := es[0].Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutKV(ctx, "cluster/during", []byte("2"), 0); err != nil {
		t.Fatalf("write with one of three members stopped: %v", err)
	}
	if err := es[0].Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The restarted member alone serves both keys.
	one, err := datastore.New(ctx, datastore.Config{Endpoints: clientURLs[:1]})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	for _, k := range []string{"cluster/before", "cluster/during"} {
		if _, err := one.GetKV(ctx, k); err != nil {
			t.Errorf("%s from the restarted member: %v", k, err)
		}
	}
}
