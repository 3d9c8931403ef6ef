package datastore_test

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"

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
