// Command tabby-kube-controllers keeps Tabby's etcd in step with a
// Kubernetes cluster (run as a Deployment of 1–2 replicas; one leads
// through a coordination.k8s.io Lease). See package kube.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/tabbynet/tabby/internal/cmdutil"
	"github.com/tabbynet/tabby/internal/version"
	"github.com/tabbynet/tabby/kube"
)

func main() {
	cfg := kube.Default()
	fs := pflag.NewFlagSet("tabby-kube-controllers", pflag.ExitOnError)
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", `kubeconfig file ("" = in-cluster; env KUBECONFIG)`)
	fs.TextVar((*cmdutil.List)(&cfg.Etcd.Endpoints), "etcd-endpoints", cmdutil.List(cfg.Etcd.Endpoints), "etcd endpoints, comma separated (env TABBY_ETCD_ENDPOINTS)")
	fs.StringVar(&cfg.Etcd.CAFile, "etcd-ca-file", "", "etcd CA (env TABBY_ETCD_CA_FILE)")
	fs.StringVar(&cfg.Etcd.CertFile, "etcd-cert-file", "", "etcd client certificate (env TABBY_ETCD_CERT_FILE)")
	fs.StringVar(&cfg.Etcd.KeyFile, "etcd-key-file", "", "etcd client key (env TABBY_ETCD_KEY_FILE)")
	fs.StringVar(&cfg.LeaseNamespace, "lease-namespace", cfg.LeaseNamespace, "namespace of the leader Lease (env POD_NAMESPACE)")
	fs.StringVar(&cfg.LeaseName, "lease-name", cfg.LeaseName, "name of the leader Lease")
	fs.StringVar(&cfg.Identity, "identity", cfg.Identity, "this replica's identity in the Lease (env POD_NAME)")
	fs.DurationVar(&cfg.GCGrace, "gc-grace", cfg.GCGrace, "how long an address stays orphaned before it is released (at most 60s)")
	fs.DurationVar(&cfg.GCInterval, "gc-interval", cfg.GCInterval, "how often address GC looks for orphaned addresses")
	fs.Float32Var(&cfg.KubeAPIQPS, "kube-api-qps", cfg.KubeAPIQPS, "requests per second to the API server, sustained")
	fs.IntVar(&cfg.KubeAPIBurst, "kube-api-burst", cfg.KubeAPIBurst, "requests to the API server in a burst")
	logLevel := cmdutil.LogLevel(fs, "debug|info|warn|error (env TABBY_LOG_LEVEL)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	var env cmdutil.Env
	env.Apply(fs, map[string]string{
		"kubeconfig":      "KUBECONFIG",
		"etcd-endpoints":  "TABBY_ETCD_ENDPOINTS",
		"etcd-ca-file":    "TABBY_ETCD_CA_FILE",
		"etcd-cert-file":  "TABBY_ETCD_CERT_FILE",
		"etcd-key-file":   "TABBY_ETCD_KEY_FILE",
		"lease-namespace": "POD_NAMESPACE",
		"identity":        "POD_NAME",
		"log-level":       "TABBY_LOG_LEVEL",
	})
	_ = fs.Parse(os.Args[1:])
	if *showVersion {
		fmt.Println(version.String())
		return
	}
	cmdutil.Main("tabby-kube-controllers", func(ctx context.Context) error {
		if err := env.Err(fs); err != nil {
			return err
		}
		return kube.Run(ctx, cfg, cmdutil.NewLogger(os.Stderr, *logLevel))
	})
}
