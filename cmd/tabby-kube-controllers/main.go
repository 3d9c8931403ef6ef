// Command tabby-kube-controllers keeps Tabby's etcd in step with a
// Kubernetes cluster (run as a Deployment of 1–2 replicas; one leads
// through a coordination.k8s.io Lease). See package kube.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/tabbynet/tabby/internal/version"
	"github.com/tabbynet/tabby/kube"
)

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func main() {
	cfg := kube.Default()
	fs := pflag.NewFlagSet("tabby-kube-controllers", pflag.ExitOnError)
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", env("KUBECONFIG", ""), `kubeconfig file ("" = in-cluster)`)
	endpoints := fs.String("etcd-endpoints", env("TABBY_ETCD_ENDPOINTS", strings.Join(cfg.Etcd.Endpoints, ",")), "etcd endpoints, comma separated")
	fs.StringVar(&cfg.Etcd.CAFile, "etcd-ca-file", env("TABBY_ETCD_CA_FILE", ""), "etcd CA")
	fs.StringVar(&cfg.Etcd.CertFile, "etcd-cert-file", env("TABBY_ETCD_CERT_FILE", ""), "etcd client certificate")
	fs.StringVar(&cfg.Etcd.KeyFile, "etcd-key-file", env("TABBY_ETCD_KEY_FILE", ""), "etcd client key")
	fs.StringVar(&cfg.LeaseNamespace, "lease-namespace", env("POD_NAMESPACE", cfg.LeaseNamespace), "namespace of the leader Lease")
	fs.StringVar(&cfg.LeaseName, "lease-name", cfg.LeaseName, "name of the leader Lease")
	fs.StringVar(&cfg.Identity, "identity", env("POD_NAME", cfg.Identity), "this replica's identity in the Lease")
	fs.DurationVar(&cfg.GCGrace, "gc-grace", cfg.GCGrace, "how long an address stays orphaned before it is released (at most 60s)")
	fs.DurationVar(&cfg.GCInterval, "gc-interval", cfg.GCInterval, "how often address GC looks for orphaned addresses")
	logLevel := fs.String("log-level", env("TABBY_LOG_LEVEL", "info"), "debug|info|warn|error")
	showVersion := fs.Bool("version", false, "print the version and exit")
	_ = fs.Parse(os.Args[1:])
	if *showVersion {
		fmt.Println(version.String())
		return
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintln(os.Stderr, "tabby-kube-controllers: --log-level:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	cfg.Etcd.Endpoints = strings.Split(*endpoints, ",")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := kube.Run(ctx, cfg, log); err != nil {
		fmt.Fprintln(os.Stderr, "tabby-kube-controllers:", err)
		os.Exit(1)
	}
}
