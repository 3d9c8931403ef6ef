// Command tabby-relay serves etcd's watch service to agents and hands them
// their watch events in batches (package datastore/relay): run one or a
// few per group of nodes, point the agents' --watch-endpoints at them.
// It watches etcd with its own credentials and serves only watches under
// --prefix. See docs/scale.md, "Watch relay".
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/relay"
	"github.com/tabbynet/tabby/internal/cmdutil"
	"github.com/tabbynet/tabby/internal/version"
)

type config struct {
	etcd              datastore.Config
	listen            string
	metricsListen     string
	certFile, keyFile string
	clientCAFile      string
	window            time.Duration
	batched           []string
}

func main() {
	cfg := config{etcd: datastore.Config{Endpoints: []string{"http://127.0.0.1:2379"}}, listen: "0.0.0.0:23791", window: relay.DefaultWindow,
		batched: relay.DefaultBatched}
	fs := pflag.NewFlagSet("tabby-relay", pflag.ExitOnError)
	fs.TextVar((*cmdutil.List)(&cfg.etcd.Endpoints), "etcd-endpoints", cmdutil.List(cfg.etcd.Endpoints), "etcd endpoints, comma separated (env TABBY_ETCD_ENDPOINTS)")
	fs.StringVar(&cfg.etcd.CAFile, "etcd-ca-file", "", "etcd CA (env TABBY_ETCD_CA_FILE)")
	fs.StringVar(&cfg.etcd.CertFile, "etcd-cert-file", "", "etcd client certificate (env TABBY_ETCD_CERT_FILE)")
	fs.StringVar(&cfg.etcd.KeyFile, "etcd-key-file", "", "etcd client key (env TABBY_ETCD_KEY_FILE)")
	fs.StringVar(&cfg.etcd.Prefix, "prefix", datastore.DefaultPrefix, "serve watches of keys under this prefix only (the agents' datastore prefix)")
	fs.StringVar(&cfg.listen, "listen", cfg.listen, "address:port the agents' --watch-endpoints name (env TABBY_RELAY_LISTEN)")
	fs.StringVar(&cfg.metricsListen, "metrics-listen", "", "address:port of the HTTP server of /metrics (Prometheus), /livez and /readyz (etcd answers); empty: none (env TABBY_RELAY_METRICS_LISTEN)")
	fs.StringVar(&cfg.certFile, "cert-file", "", "serve TLS with this certificate (env TABBY_RELAY_CERT_FILE; default: plain text)")
	fs.StringVar(&cfg.keyFile, "key-file", "", "the certificate's key (env TABBY_RELAY_KEY_FILE)")
	fs.StringVar(&cfg.clientCAFile, "client-ca-file", "", "require agents' client certificates signed by this CA (env TABBY_RELAY_CLIENT_CA_FILE)")
	fs.DurationVar(&cfg.window, "batch-window", cfg.window, "hold a stream's watch events this long after a send of events, and send them together; a lone event after a quiet window goes at once (0 < window ≤ 10s; env TABBY_RELAY_BATCH_WINDOW)")
	fs.TextVar((*cmdutil.List)(&cfg.batched), "batched-keys", cmdutil.List(cfg.batched), "key prefixes (under --prefix, comma separated) whose events wait for the window; an event of any other key is sent at once with what is held; empty: every key's wait (env TABBY_RELAY_BATCHED_KEYS)")
	logLevel := cmdutil.LogLevel(fs, "debug|info|warn|error (env TABBY_LOG_LEVEL)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	var env cmdutil.Env
	env.Apply(fs, map[string]string{
		"etcd-endpoints": "TABBY_ETCD_ENDPOINTS",
		"etcd-ca-file":   "TABBY_ETCD_CA_FILE",
		"etcd-cert-file": "TABBY_ETCD_CERT_FILE",
		"etcd-key-file":  "TABBY_ETCD_KEY_FILE",
		"listen":         "TABBY_RELAY_LISTEN",
		"metrics-listen": "TABBY_RELAY_METRICS_LISTEN",
		"cert-file":      "TABBY_RELAY_CERT_FILE",
		"key-file":       "TABBY_RELAY_KEY_FILE",
		"client-ca-file": "TABBY_RELAY_CLIENT_CA_FILE",
		"batch-window":   "TABBY_RELAY_BATCH_WINDOW",
		"batched-keys":   "TABBY_RELAY_BATCHED_KEYS",
		"log-level":      "TABBY_LOG_LEVEL",
	})
	_ = fs.Parse(os.Args[1:])
	if *showVersion {
		fmt.Println(version.String())
		return
	}
	cmdutil.Main("tabby-relay", func(ctx context.Context) error {
		if err := env.Err(fs); err != nil {
			return err
		}
		return run(ctx, cfg, *logLevel)
	})
}

func run(ctx context.Context, cfg config, level slog.Level) error {
	if err := relay.CheckWindow(cfg.window); err != nil {
		return fmt.Errorf("--batch-window: %w", err)
	}
	if (cfg.certFile == "") != (cfg.keyFile == "") {
		return errors.New("--cert-file and --key-file must be given together")
	}
	if cfg.clientCAFile != "" && cfg.certFile == "" {
		return errors.New("--client-ca-file needs --cert-file and --key-file")
	}
	log := cmdutil.NewLogger(os.Stderr, level)
	cfg.etcd.Logger = log
	store, err := datastore.New(ctx, cfg.etcd)
	if err != nil {
		return err
	}
	defer store.Close()
	opts := relay.ServerOptions()
	if cfg.certFile != "" {
		t, err := serverTLS(cfg)
		if err != nil {
			return err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(t)))
	}
	l, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(opts...)
	r := relay.New(store.Client(), cfg.etcd.Prefix, cfg.window, log).BatchOnly(cfg.batched)
	r.Register(srv)
	var hsrv *http.Server
	if cfg.metricsListen != "" {
		ml, err := net.Listen("tcp", cfg.metricsListen)
		if err != nil {
			l.Close()
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		hsrv = &http.Server{Handler: r.Handler(), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = hsrv.Serve(ml) }() // ends with Close below
		log.Info("serving metrics and health", "listen", ml.Addr().String())
	}
	log.Info("relaying watches", "listen", l.Addr().String(), "etcd", cfg.etcd.Endpoints, "prefix", cfg.etcd.Prefix, "window", cfg.window, "batched", cfg.batched, "tls", cfg.certFile != "")
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	defer func() {
		if hsrv != nil {
			hsrv.Close()
		}
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		srv.Stop()
		<-done
		return nil
	}
}

func serverTLS(cfg config) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(cfg.certFile, cfg.keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading the relay's certificate: %w", err)
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if cfg.clientCAFile != "" {
		pem, err := os.ReadFile(cfg.clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("reading the client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client CA %s holds no PEM certificate", cfg.clientCAFile)
		}
		t.ClientCAs, t.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return t, nil
}
