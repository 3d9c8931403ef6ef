// Package datastore owns Tabby's etcd-backed store: the key layout, a raw
// key/value layer with compare-and-swap on etcd revisions, leases, a watch
// that survives reconnects and compaction by re-listing, typed access to the
// api resources, TLS and authentication towards etcd, and an embedded etcd
// for tests and the lab.
//
// Every key is relative to Config.Prefix ("/tabby" by default); see
// docs/datastore.md for the layout. A Store is safe for concurrent use.
package datastore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"

	"github.com/tabbynet/tabby/internal/zapslog"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrNotFound: the key or resource does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: a create found the key or resource already there.
	ErrExists = errors.New("already exists")
	// ErrConflict: a compare-and-swap found a different revision.
	ErrConflict = errors.New("conflict: modified concurrently")
	// ErrLeaseLost: KeepAlive found its lease expired or revoked.
	ErrLeaseLost = errors.New("lease lost")
)

// Defaults of Config.
const (
	DefaultDialTimeout    = 5 * time.Second
	DefaultRequestTimeout = 5 * time.Second
	DefaultPrefix         = "/tabby"
	// MaxTimeout bounds DialTimeout and RequestTimeout: a longer one is a
	// mistake (a value in the wrong unit) that would hang every caller.
	MaxTimeout = 10 * time.Minute
)

// Config says how to reach etcd.
type Config struct {
	// Endpoints: "http://127.0.0.1:2379", "https://…", "unix:///path".
	Endpoints []string
	// WatchEndpoints, when set, are a watch relay's (cmd/tabby-relay,
	// datastore/relay): the watch with WatchSpec.Skip (an agent's view)
	// runs there, in batches; everything else stays on Endpoints. The
	// relay is reached with the same TLS files, without Username and
	// Password (it watches etcd with credentials of its own).
	WatchEndpoints []string
	// CAFile verifies the server (https); CertFile and KeyFile are the
	// client certificate for mutual TLS. Any of them turns TLS on.
	CAFile, CertFile, KeyFile string
	// Username and Password authenticate with etcd's auth.
	Username, Password string
	// DialTimeout bounds connecting, including New's connectivity check.
	DialTimeout time.Duration
	// RequestTimeout applies to each call whose ctx has no deadline.
	RequestTimeout time.Duration
	// Prefix is prepended (with "/") to every key.
	Prefix string
	// Logger receives the watch's reconnect and resync notices and etcd
	// client warnings; nil = silent.
	Logger *slog.Logger
	// Dialer, when set, opens the connections to the endpoints (addr is
	// host:port); the scale harness dials from inside a lab namespace.
	Dialer func(ctx context.Context, addr string) (net.Conn, error)
}

// Default fills unset fields with their defaults.
func (c *Config) Default() {
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
}

// Validate reports every problem of the config.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Endpoints) == 0 {
		errs = append(errs, errors.New("endpoints: at least one is required"))
	}
	tls := c.CAFile != "" || c.CertFile != "" || c.KeyFile != ""
	for _, ep := range slices.Concat(c.Endpoints, c.WatchEndpoints) {
		scheme, _, ok := strings.Cut(ep, "://")
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("endpoints: %q needs a scheme (http://, https://, unix://)", ep))
		case scheme != "http" && scheme != "https" && scheme != "unix" && scheme != "unixs":
			errs = append(errs, fmt.Errorf("endpoints: %q: unknown scheme %q (http://, https://, unix://, unixs://)", ep, scheme))
		case tls && (scheme == "http" || scheme == "unix"):
			// The etcd client would silently talk plain text: the operator
			// asked for TLS and would not get it.
			errs = append(errs, fmt.Errorf("endpoints: %q is plain text but TLS files are given (caFile, certFile, keyFile): use %ss://", ep, scheme))
		}
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, errors.New("certFile and keyFile must be given together"))
	}
	if c.Password != "" && c.Username == "" {
		errs = append(errs, errors.New("password given without username"))
	}
	if c.DialTimeout < 0 || c.DialTimeout > MaxTimeout {
		errs = append(errs, fmt.Errorf("dialTimeout %s must be between 0 and %s", c.DialTimeout, MaxTimeout))
	}
	if c.RequestTimeout < 0 || c.RequestTimeout > MaxTimeout {
		errs = append(errs, fmt.Errorf("requestTimeout %s must be between 0 and %s", c.RequestTimeout, MaxTimeout))
	}
	if c.Prefix != "" && !strings.HasPrefix(c.Prefix, "/") {
		errs = append(errs, fmt.Errorf("prefix %q must start with /", c.Prefix))
	}
	return errors.Join(errs...)
}

// Store is a connection to etcd.
type Store struct {
	client *clientv3.Client
	// watchClient is the relay's (Config.WatchEndpoints), or client.
	watchClient *clientv3.Client
	cfg         Config
	base        string // Prefix + "/"
	endpoints   string // for error messages: "[http://a http://b]"
	log         *slog.Logger
	count       counters
	// commitFault, when set (tests only), runs each write attempt and each
	// attempt of GetKVs.
	commitFault func(context.Context, func(context.Context) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error)
	// progress is whether etcd answers watch progress requests (see
	// watchProgressAnswered), asked once.
	progressOnce sync.Once
	progressOK   bool
	// partsStreams are the streams of the running watches with
	// WatchSpec.Skip, each of which RequestWatchProgress asks (one Store
	// may carry several views: an agent has one, a test may run two).
	partsMu      sync.Mutex
	partsStreams map[*partsStream]struct{}
	// clusterID is etcd's cluster ID as the latest list's response said it.
	clusterID atomic.Uint64
}

type counters struct{ get, list, txn, put atomic.Int64 }

// Requests counts the requests a Store sent to etcd, by kind: reads (Get of
// one key or of several in one read-only transaction, GetKVs; List of a
// prefix — one per page) and writes (transactions,
// including every compare-and-swap and delete, and plain puts). Watches and
// lease keep-alives are not counted.
type Requests struct {
	Get, List, Txn, Put int64
}

// Requests returns the counts since the Store was made; safe for
// concurrent use.
func (s *Store) Requests() Requests {
	return Requests{Get: s.count.get.Load(), List: s.count.list.Load(), Txn: s.count.txn.Load(), Put: s.count.put.Load()}
}

// Flow-control windows of the etcd connection: fixed, which turns off
// gRPC's bandwidth-delay estimation. That estimation sends a PING (and a
// WINDOW_UPDATE) on every DATA frame that arrives after a quiet spell —
// every watch response of a cluster at rest — and reads its answer: a
// round trip, two writes and two wake-ups per remote pod event for a
// window that a watch of small records never needs to grow (docs/scale.md).
// 1 MiB per stream and 4 MiB per connection keep a re-list of 30,000
// endpoints (≈ 20 MB) fast on a link of a few milliseconds.
const (
	streamWindow = 1 << 20
	connWindow   = 4 << 20
)

// dialOptions: gRPC's default reconnect backoff grows to two minutes; an
// agent should notice a restarted etcd within seconds. The windows are
// fixed (see streamWindow).
func dialOptions(cfg Config) []grpc.DialOption {
	opts := []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           grpcbackoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 3 * time.Second},
		MinConnectTimeout: cfg.DialTimeout,
	}), grpc.WithInitialWindowSize(streamWindow), grpc.WithInitialConnWindowSize(connWindow)}
	if cfg.Dialer != nil {
		opts = append(opts, grpc.WithContextDialer(cfg.Dialer))
	}
	return opts
}

// New connects to etcd and checks within DialTimeout that it answers; the
// error names the endpoints.
func New(ctx context.Context, cfg Config) (*Store, error) {
	cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid datastore config: %w", err)
	}
	endpoints := fmt.Sprint(cfg.Endpoints)
	tlsCfg, err := clientTLS(cfg)
	if err != nil {
		return nil, fmt.Errorf("configuring tls for etcd at %s: %w", endpoints, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ccfg := clientConfig(cfg, cfg.Endpoints, tlsCfg)
	ccfg.DialTimeout, ccfg.Username, ccfg.Password = cfg.DialTimeout, cfg.Username, cfg.Password
	client, err := clientv3.New(ccfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd at %s: %w", endpoints, err)
	}
	watchClient := client
	if len(cfg.WatchEndpoints) > 0 {
		wtls, err := clientTLS(Config{Endpoints: cfg.WatchEndpoints, CAFile: cfg.CAFile, CertFile: cfg.CertFile, KeyFile: cfg.KeyFile})
		if err == nil {
			// No connectivity check: the watch retries until the relay
			// answers, as it does when etcd goes.
			watchClient, err = clientv3.New(clientConfig(cfg, cfg.WatchEndpoints, wtls))
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("connecting to the watch relay at %s: %w", fmt.Sprint(cfg.WatchEndpoints), err), client.Close())
		}
	}
	s := &Store{
		client:      client,
		watchClient: watchClient,
		cfg:         cfg,
		base:        strings.TrimSuffix(cfg.Prefix, "/") + "/",
		endpoints:   endpoints,
		log:         log,
	}
	cctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	// A Get under our prefix proves connectivity, TLS and, with auth, that we
	// may read our keys.
	if _, err := client.Get(cctx, s.base, clientv3.WithCountOnly()); err != nil {
		cerr := s.Close()
		// gRPC hides why it could not connect behind the deadline; a
		// direct dial of each endpoint tells the operator (refused, TLS).
		if diag := probeEndpoints(cfg.Endpoints, tlsCfg); diag != "" {
			err = fmt.Errorf("%w (%s)", err, diag)
		}
		return nil, errors.Join(fmt.Errorf("connecting to etcd at %s: %w", endpoints, err), cerr)
	}
	return s, nil
}

// clientTLS builds the client TLS config: nil for plain http unless a file
// is given.
func clientTLS(cfg Config) (*tls.Config, error) {
	secure := cfg.CAFile != "" || cfg.CertFile != ""
	for _, ep := range cfg.Endpoints {
		if strings.HasPrefix(ep, "https://") || strings.HasPrefix(ep, "unixs://") {
			secure = true
		}
	}
	if !secure {
		return nil, nil
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading ca file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca file %s holds no PEM certificate", cfg.CAFile)
		}
		t.RootCAs = pool
	}
	if cfg.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("loading client certificate: %w", err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}

// clientConfig is an etcd client's configuration for endpoints: the
// keepalives, TLS, logger and dial options every client of a Store has.
func clientConfig(cfg Config, endpoints []string, t *tls.Config) clientv3.Config {
	return clientv3.Config{
		Endpoints:            endpoints,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		TLS:                  t,
		Logger:               zapslog.New(cfg.Logger),
		DialOptions:          dialOptions(cfg),
	}
}

// Close closes the connection; watches end.
func (s *Store) Close() error {
	var errs []error
	if s.watchClient != s.client {
		if err := s.watchClient.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("closing the watch relay's client: %w", err))
		}
	}
	if err := s.client.Close(); err != nil && !errors.Is(err, context.Canceled) {
		errs = append(errs, fmt.Errorf("closing etcd client: %w", err))
	}
	return errors.Join(errs...)
}

// Endpoints returns the configured etcd endpoints.
func (s *Store) Endpoints() []string { return append([]string(nil), s.cfg.Endpoints...) }

// Prefix returns the absolute prefix with a trailing "/", under which every
// relative key lives.
func (s *Store) Prefix() string { return s.base }

// Client returns the underlying etcd client, for what this package does not
// offer (maintenance, tests forcing a compaction). Do not close it.
func (s *Store) Client() *clientv3.Client { return s.client }

// withTimeout applies RequestTimeout when ctx has no deadline.
func (s *Store) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.cfg.RequestTimeout)
}

func (s *Store) abs(key string) string { return s.base + key }

func (s *Store) rel(key []byte) string { return strings.TrimPrefix(string(key), s.base) }

// etcdErr wraps an error of the etcd client with what we did and where.
func (s *Store) etcdErr(what string, err error) error {
	return fmt.Errorf("%s: etcd at %s: %w", what, s.endpoints, err)
}
