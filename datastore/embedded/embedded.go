// Package embedded runs an in-process etcd member for tests and the lab: a
// single-member cluster by default, or one member of a cluster whose other
// members run elsewhere (Config.InitialCluster). It is the only Tabby
// package that links the etcd server; tabby-agent and tabbyctl never import
// it.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/tabbynet/tabby/internal/zapslog"
)

// Config configures an in-process etcd member.
type Config struct {
	// Dir holds etcd's data. "" = a new temporary directory, removed by Stop.
	Dir string
	// ClientURL is the URL clients connect to, for example
	// "http://198.18.0.1:2379". "" = http://127.0.0.1 on a free port.
	ClientURL string
	// Name is the member's name; "" = "tabby".
	Name string
	// PeerURL is where the member talks to its peers, for example
	// "http://198.18.0.3:2380"; "" = the client URL's host on a free port.
	PeerURL string
	// InitialCluster lists the members of a new cluster as
	// "name=peerURL,name=peerURL,…"; "" = this member alone. Every member
	// of the cluster must be given the same list. It is read only when the
	// data directory is empty: a member restarted on its data rejoins the
	// cluster it belongs to.
	InitialCluster string
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
	// BcryptCost is the bcrypt cost of the users' password hashes; 0 =
	// etcd's default (10). Each authentication costs 2^cost rounds, about
	// a second under -race on a loaded machine at the default: tests that
	// enable auth pass 4 (bcrypt's minimum).
	BcryptCost uint
}

// Etcd is a running (or stopped) embedded etcd. Its methods are safe for
// concurrent use.
type Etcd struct {
	mu        sync.Mutex
	cfg       Config
	dir       string
	ownDir    bool
	clientURL url.URL
	peerURL   url.URL
	etcd      *embed.Etcd
}

// startTimeout bounds how long Start and Restart wait for
// etcd to become ready when ctx has no deadline.
const startTimeout = 30 * time.Second

// Start starts a single-member etcd and waits until it serves
// clients. Stop it with Stop.
func Start(ctx context.Context, cfg Config) (*Etcd, error) {
	e := &Etcd{cfg: cfg, dir: cfg.Dir}
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
	if cfg.PeerURL == "" {
		port, err := freePort(host)
		if err != nil {
			e.removeDir()
			return nil, err
		}
		e.peerURL = url.URL{Scheme: "http", Host: net.JoinHostPort(host, port)}
	} else {
		u, err := url.Parse(cfg.PeerURL)
		if err != nil || u.Host == "" || u.Port() == "" || u.Scheme != "http" {
			e.removeDir()
			return nil, fmt.Errorf("invalid etcd peer URL %q: want http://host:port", cfg.PeerURL)
		}
		e.peerURL = url.URL{Scheme: u.Scheme, Host: u.Host}
	}

	// A port freePort found can be taken by another process before etcd
	// binds it (tests start many etcds at once): pick again and retry.
	for attempt := 1; ; attempt++ {
		err := e.start(ctx)
		if err == nil {
			return e, nil
		}
		if attempt == 5 || !addrInUse(err) || (cfg.ClientURL != "" && cfg.PeerURL != "") {
			e.removeDir()
			return nil, err
		}
		if err := e.repick(cfg, host); err != nil {
			e.removeDir()
			return nil, err
		}
	}
}

// addrInUse reports whether err is a bind to a port already in use.
func addrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

// repick gives the URLs Start chose itself (not the configured ones) new
// free ports.
func (e *Etcd) repick(cfg Config, host string) error {
	if cfg.ClientURL == "" {
		port, err := freePort(host)
		if err != nil {
			return err
		}
		e.clientURL.Host = net.JoinHostPort(host, port)
	}
	if cfg.PeerURL == "" {
		port, err := freePort(host)
		if err != nil {
			return err
		}
		e.peerURL.Host = net.JoinHostPort(host, port)
	}
	return nil
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

func (e *Etcd) start(ctx context.Context) error {
	c := embed.NewConfig()
	c.Name = e.cfg.Name
	if c.Name == "" {
		c.Name = "tabby"
	}
	c.Dir = e.dir
	c.ListenClientUrls = []url.URL{e.clientURL}
	c.AdvertiseClientUrls = []url.URL{e.clientURL}
	c.ListenPeerUrls = []url.URL{e.peerURL}
	c.AdvertisePeerUrls = []url.URL{e.peerURL}
	c.InitialCluster = c.Name + "=" + e.peerURL.String()
	if e.cfg.InitialCluster != "" {
		c.InitialCluster = e.cfg.InitialCluster
	}
	c.InitialClusterToken = "tabby"
	c.UnsafeNoFsync = e.cfg.UnsafeNoFsync
	if e.cfg.BcryptCost != 0 {
		c.BcryptCost = e.cfg.BcryptCost
	}
	c.ClientTLSInfo = transport.TLSInfo{
		CertFile:       e.cfg.CertFile,
		KeyFile:        e.cfg.KeyFile,
		TrustedCAFile:  e.cfg.ClientCAFile,
		ClientCertAuth: e.cfg.ClientCAFile != "",
	}
	c.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zapslog.New(e.cfg.Logger))
	// A single member elects itself at once; short ticks make it quick.
	// Members of a real cluster keep etcd's defaults (100 ms heartbeat,
	// 1 s election timeout), as users run it: shorter ones make a loaded
	// machine's members depose each other's leaders.
	if !strings.Contains(c.InitialCluster, ",") {
		c.TickMs = 10
		c.ElectionMs = 100
	}

	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
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
func (e *Etcd) Endpoints() []string {
	return []string{e.clientURL.String()}
}

// Dir returns the data directory.
func (e *Etcd) Dir() string { return e.dir }

// Stop shuts etcd down. If Start created the data directory (Dir
// was ""), Stop removes it and Restart is no longer possible; a given Dir is
// kept, so Restart can bring the same data back. Stop is idempotent.
func (e *Etcd) Stop() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopLocked()
	return e.removeDir()
}

func (e *Etcd) stopLocked() {
	if e.etcd != nil {
		// With clients still watching, Close waits about 5s (etcd's
		// request timeout) before it cuts their streams.
		e.etcd.Close()
		e.etcd = nil
	}
}

// Restart starts a stopped etcd again on the same data directory and ports.
// Restarting a running etcd is an error.
func (e *Etcd) Restart(ctx context.Context) error {
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

func (e *Etcd) removeDir() error {
	if !e.ownDir || e.dir == "" {
		return nil
	}
	if err := os.RemoveAll(e.dir); err != nil {
		return fmt.Errorf("removing etcd data directory: %w", err)
	}
	e.ownDir = false
	return nil
}
