package datastore_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/embedded"
	"github.com/tabbynet/tabby/datastore/storetest"
)

func startEtcd(t *testing.T, cfg embedded.Config) *embedded.Etcd {
	t.Helper()
	cfg.Dir = t.TempDir()
	cfg.UnsafeNoFsync = true
	e, err := embedded.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("StartEmbedded: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Error(err)
		}
	})
	return e
}

// connect tries New with a short dial timeout (for the cases that must fail
// fast: wrong CA, refused) and, on success, a round trip.
func connect(t *testing.T, cfg datastore.Config) error {
	t.Helper()
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 2 * time.Second
	}
	s, err := datastore.New(context.Background(), cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	_, err = s.PutKV(context.Background(), "tls/check", []byte("ok"), 0)
	return err
}

func TestTLS(t *testing.T) {
	p := storetest.NewPKI(t)
	e := startEtcd(t, embedded.Config{CertFile: p.ServerCert, KeyFile: p.ServerKey})
	ep := e.Endpoints()
	if !strings.HasPrefix(ep[0], "https://127.0.0.1:") {
		t.Fatalf("endpoint %s, want https on 127.0.0.1", ep[0])
	}
	if err := connect(t, datastore.Config{Endpoints: ep, CAFile: p.CA}); err != nil {
		t.Errorf("TLS with the right CA: %v", err)
	}
	err := connect(t, datastore.Config{Endpoints: ep, CAFile: p.OtherCA})
	t.Logf("wrong CA: %v", err)
	if err == nil || !strings.Contains(err.Error(), ep[0]) || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("TLS with the wrong CA: %v, want an error naming %s and the unknown authority", err, ep[0])
	}
	if err := connect(t, datastore.Config{Endpoints: ep, CAFile: filepath.Join(t.TempDir(), "missing.pem")}); err == nil {
		t.Error("TLS with a missing CA file succeeded")
	}
}

func TestMutualTLS(t *testing.T) {
	p := storetest.NewPKI(t)
	e := startEtcd(t, embedded.Config{CertFile: p.ServerCert, KeyFile: p.ServerKey, ClientCAFile: p.CA})
	ep := e.Endpoints()
	if err := connect(t, datastore.Config{Endpoints: ep, CAFile: p.CA, CertFile: p.ClientCert, KeyFile: p.ClientKey}); err != nil {
		t.Errorf("mTLS with a client certificate: %v", err)
	}
	if err := connect(t, datastore.Config{Endpoints: ep, CAFile: p.CA}); err == nil {
		t.Error("mTLS without a client certificate succeeded")
	} else {
		t.Logf("no client cert: %v", err)
	}
	if err := connect(t, datastore.Config{Endpoints: ep, CAFile: p.CA, CertFile: p.ClientCert}); err == nil ||
		!strings.Contains(err.Error(), "keyFile") {
		t.Errorf("client certificate without key: %v, want a config error", err)
	}
}

// authTimeout bounds connecting with a password. etcd's client spends its
// DialTimeout on the dial and then on the authentication, a bcrypt
// comparison on the server: with etcd's default cost that is about a
// second under -race on a loaded 2-core machine, which the 2 s of connect
// did not always cover. The test etcd hashes at bcrypt's minimum cost, and
// a loaded machine gets this long.
const authTimeout = 30 * time.Second

func TestUsernamePassword(t *testing.T) {
	e := startEtcd(t, embedded.Config{BcryptCost: 4}) // bcrypt.MinCost
	ctx := context.Background()
	admin, err := datastore.New(ctx, datastore.Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	auth := admin.Client().Auth
	steps := []func() error{
		func() error { _, err := auth.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := auth.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := auth.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("auth setup step %d: %v", i, err)
		}
	}
	if err := admin.Close(); err != nil {
		t.Fatal(err)
	}
	if err := connect(t, datastore.Config{Endpoints: e.Endpoints(), Username: "root", Password: "rootpw", DialTimeout: authTimeout}); err != nil {
		t.Errorf("right password: %v", err)
	}
	err = connect(t, datastore.Config{Endpoints: e.Endpoints(), Username: "root", Password: "wrong", DialTimeout: authTimeout})
	if err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Errorf("wrong password: %v, want authentication failed", err)
	}
	if err := connect(t, datastore.Config{Endpoints: e.Endpoints(), DialTimeout: authTimeout}); err == nil {
		t.Error("no credentials with auth enabled succeeded")
	}
}

func TestUnreachableEndpointIsNamed(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := "http://" + l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = datastore.New(context.Background(), datastore.Config{Endpoints: []string{ep}, DialTimeout: 300 * time.Millisecond})
	if err == nil {
		t.Fatal("New succeeded without etcd")
	}
	t.Logf("unreachable: %v", err)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("New took %v with a 300ms dial timeout", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v is not context.DeadlineExceeded", err)
	}
	want := "connecting to etcd at [" + ep + "]: "
	if !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "deadline exceeded") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("error %q, want %q followed by the deadline", err, want)
	}
}

func TestUnreachableAfterConnectIsNamed(t *testing.T) {
	e := startEtcd(t, embedded.Config{})
	s, err := datastore.New(context.Background(), datastore.Config{
		Endpoints: e.Endpoints(), RequestTimeout: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	// No deadline on ctx: RequestTimeout applies.
	_, err = s.GetKV(context.Background(), "x")
	t.Logf("etcd down: %v", err)
	if err == nil || !strings.Contains(err.Error(), e.Endpoints()[0]) {
		t.Errorf("GetKV with etcd down: %v, want an error naming %s", err, e.Endpoints()[0])
	}
}

func TestConfigValidate(t *testing.T) {
	cfg := datastore.Config{
		Endpoints: []string{"127.0.0.1:2379"}, CertFile: "c.pem", Password: "x",
		DialTimeout: -1, Prefix: "tabby",
	}
	err := cfg.Validate()
	if err == nil {
		t.Fatal("Validate accepted a bad config")
	}
	for _, want := range []string{"needs a scheme", "keyFile", "password given without username", "dialTimeout", "prefix"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error %q lacks %q", err, want)
		}
	}
	for _, tt := range []struct {
		cfg  datastore.Config
		want string // "" = valid
	}{
		{datastore.Config{Endpoints: []string{"http://127.0.0.1:2379"}, CAFile: "ca.pem"}, `"http://127.0.0.1:2379" is plain text but TLS files are given`},
		{datastore.Config{Endpoints: []string{"https://a:2379", "http://b:2379"}, CertFile: "c", KeyFile: "k"}, `"http://b:2379" is plain text`},
		{datastore.Config{Endpoints: []string{"unix:///run/etcd.sock"}, CAFile: "ca.pem"}, "use unixs://"},
		{datastore.Config{Endpoints: []string{"https://a:2379"}, CAFile: "ca.pem"}, ""},
		{datastore.Config{Endpoints: []string{"http://a:2379"}}, ""},
		{datastore.Config{Endpoints: []string{"ftp://a:2379"}}, "unknown scheme"},
		{datastore.Config{Endpoints: []string{"http://a:2379"}, RequestTimeout: 1 << 62}, "requestTimeout"},
		{datastore.Config{Endpoints: []string{"http://a:2379"}, DialTimeout: time.Hour}, "dialTimeout 1h0m0s must be between 0 and 10m0s"},
	} {
		err := tt.cfg.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("Validate(%+v) = %v, want nil", tt.cfg, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("Validate(%+v) = %v, want %q", tt.cfg, err, tt.want)
		}
	}
	var def datastore.Config
	def.Default()
	if def.DialTimeout != 5*time.Second || def.RequestTimeout != 5*time.Second || def.Prefix != "/tabby" {
		t.Errorf("defaults = %+v", def)
	}
}
