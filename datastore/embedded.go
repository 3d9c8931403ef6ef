package datastore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// EmbeddedConfig configures an in-process single-member etcd.
type EmbeddedConfig struct {
	// Dir holds etcd's data. "" = a new temporary directory, removed by Stop.
	Dir string
	// ClientURL is the URL clients connect to, for example
	// "http://198.18.0.1:2379". "" = http://127.0.0.1 on a free port. The
	// peer URL uses the same host on a free port.
	ClientURL string
	// Logger receives etcd's warnings and errors; nil = silent.
	Logger *slog.Logger
	// CertFile and KeyFile make etcd serve clients over TLS (ClientURL
	// "https://…"; the default URL then uses https). ClientCAFile
	// additionally requires client certificates signed by that CA (mutual
	// TLS). Peers always use plain http on the same host.
	CertFile, KeyFile, ClientCAFile string
	// UnsafeNoFsync skips fsync: much faster, loses data on a crash. For
	// tests only.
	UnsafeNoFsync bool
}

// Embedded is a running (or stopped) embedded etcd. Its methods are safe for
// concurrent use.
type Embedded struct {
	mu        sync.Mutex
	cfg       EmbeddedConfig
	dir       string
	ownDir    bool
	clientURL url.URL
	peerURL   url.URL
	etcd      *embed.Etcd
}

// embeddedStartTimeout bounds how long StartEmbedded and Restart wait for
// etcd to become ready when ctx has no deadline.
const embeddedStartTimeout = 30 * time.Second

// StartEmbedded starts a single-member etcd and waits until it serves
// clients. Stop it with Stop.
func StartEmbedded(ctx context.Context, cfg EmbeddedConfig) (*Embedded, error) {
	e := &Embedded{cfg: cfg, dir: cfg.Dir}
	if e.dir == "" {
		d, err := os.MkdirTemp("", "tabby-etcd-")
		if err != nil {
			return nil, fmt.Errorf("creating etcd data directory: %w", err)
		}
		e.dir, e.ownDir = d, true
	}
	scheme := "http"
	if cfg.CertFile != "" || cfg.KeyFile != "" {
		scheme = "https"
		if cfg.CertFile == "" || cfg.KeyFile == "" {
			e.removeDir()
			return nil, errors.New("embedded etcd: CertFile and KeyFile must be given together")
		}
	} else if cfg.ClientCAFile != "" {
		e.removeDir()
		return nil, errors.New("embedded etcd: ClientCAFile needs CertFile and KeyFile")
	}
	host := "127.0.0.1"
	if cfg.ClientURL == "" {
		port, err := freePort(host)
		if err != nil {
			e.removeDir()
			return nil, err
		}
		e.clientURL = url.URL{Scheme: scheme, Host: net.JoinHostPort(host, port)}
	} else {
		u, err := url.Parse(cfg.ClientURL)
		if err != nil || u.Host == "" || u.Port() == "" || u.Scheme != scheme {
			e.removeDir()
			return nil, fmt.Errorf("invalid etcd client URL %q: want %s://host:port", cfg.ClientURL, scheme)
		}
		e.clientURL = url.URL{Scheme: u.Scheme, Host: u.Host}
		host = u.Hostname()
	}
	port, err := freePort(host)
	if err != nil {
		e.removeDir()
		return nil, err
	}
	e.peerURL = url.URL{Scheme: "http", Host: net.JoinHostPort(host, port)}

	if err := e.start(ctx); err != nil {
		e.removeDir()
		return nil, err
	}
	return e, nil
}

// freePort returns a TCP port on host that was free a moment ago.
func freePort(host string) (string, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("finding a free port on %s: %w", host, err)
	}
	_, port, err := net.SplitHostPort(l.Addr().String())
	if cerr := l.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("finding a free port on %s: %w", host, err)
	}
	return port, nil
}

func (e *Embedded) start(ctx context.Context) error {
	c := embed.NewConfig()
	c.Name = "tabby"
	c.Dir = e.dir
	c.ListenClientUrls = []url.URL{e.clientURL}
	c.AdvertiseClientUrls = []url.URL{e.clientURL}
	c.ListenPeerUrls = []url.URL{e.peerURL}
	c.AdvertisePeerUrls = []url.URL{e.peerURL}
	c.InitialCluster = c.Name + "=" + e.peerURL.String()
	c.InitialClusterToken = "tabby"
	c.UnsafeNoFsync = e.cfg.UnsafeNoFsync
	c.ClientTLSInfo = transport.TLSInfo{
		CertFile:       e.cfg.CertFile,
		KeyFile:        e.cfg.KeyFile,
		TrustedCAFile:  e.cfg.ClientCAFile,
		ClientCertAuth: e.cfg.ClientCAFile != "",
	}
	c.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zapLogger(e.cfg.Logger))
	// A single member elects itself at once; short ticks make it quick.
	c.TickMs = 10
	c.ElectionMs = 100

	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, embeddedStartTimeout)
		defer cancel()
	}
	etcd, err := embed.StartEtcd(c)
	if err != nil {
		return fmt.Errorf("starting embedded etcd at %s: %w", e.clientURL.String(), err)
	}
	select {
	case <-etcd.Server.ReadyNotify():
	case err := <-etcd.Err():
		etcd.Close()
		return fmt.Errorf("starting embedded etcd at %s: %w", e.clientURL.String(), err)
	case <-ctx.Done():
		etcd.Close()
		return fmt.Errorf("waiting for embedded etcd at %s: %w", e.clientURL.String(), ctx.Err())
	}
	e.etcd = etcd
	return nil
}

// Endpoints returns the client URLs, for Config.Endpoints.
func (e *Embedded) Endpoints() []string {
	return []string{e.clientURL.String()}
}

// Dir returns the data directory.
func (e *Embedded) Dir() string { return e.dir }

// Stop shuts etcd down. If StartEmbedded created the data directory (Dir
// was ""), Stop removes it and Restart is no longer possible; a given Dir is
// kept, so Restart can bring the same data back. Stop is idempotent.
func (e *Embedded) Stop() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopLocked()
	return e.removeDir()
}

func (e *Embedded) stopLocked() {
	if e.etcd != nil {
		// With clients still watching, Close waits about 5s (etcd's
		// request timeout) before it cuts their streams.
		e.etcd.Close()
		e.etcd = nil
	}
}

// Restart starts a stopped etcd again on the same data directory and ports.
// Restarting a running etcd is an error.
func (e *Embedded) Restart(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.etcd != nil {
		return errors.New("restarting embedded etcd: still running")
	}
	if _, err := os.Stat(e.dir); err != nil {
		return fmt.Errorf("restarting embedded etcd: %w", err)
	}
	return e.start(ctx)
}

func (e *Embedded) removeDir() error {
	if !e.ownDir || e.dir == "" {
		return nil
	}
	if err := os.RemoveAll(e.dir); err != nil {
		return fmt.Errorf("removing etcd data directory: %w", err)
	}
	e.ownDir = false
	return nil
}
