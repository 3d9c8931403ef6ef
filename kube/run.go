package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/tabbynet/tabby/datastore"
)

// Config is tabby-kube-controllers' configuration.
type Config struct {
	// Kubeconfig is a kubeconfig file; "" uses the in-cluster config.
	Kubeconfig string
	Etcd       datastore.Config

	// LeaseNamespace/LeaseName name the coordination.k8s.io Lease of the
	// leader election; Identity is this replica's (default: hostname).
	LeaseNamespace, LeaseName, Identity       string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	Workers int
	// Resync queues every object again, catching anything missed.
	Resync time.Duration
	// GCInterval is how often address GC runs; GCGrace how long an
	// address must stay orphaned first (at most 60 s); one pass releases
	// at most max(GCMinBatch, GCMaxShare × allocations).
	GCInterval, GCGrace time.Duration
	GCMaxShare          float64
	GCMinBatch          int
	// KubeAPIQPS and KubeAPIBurst bound the requests to the API server
	// (client-go's token bucket). client-go's own default, 5 and 10,
	// throttled LoadBalancer assignment to a status update and an event
	// per Service at 5 a second (BENCHMARKS.md, Service → ToR).
	KubeAPIQPS   float32
	KubeAPIBurst int
}

// Default returns the defaults.
func Default() Config {
	host, _ := os.Hostname()
	return Config{
		Etcd:           datastore.Config{Endpoints: []string{"http://127.0.0.1:2379"}},
		LeaseNamespace: "tabby-system", LeaseName: "tabby-kube-controllers", Identity: host,
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		Workers: 4, Resync: 5 * time.Minute,
		GCInterval: 10 * time.Second, GCGrace: 30 * time.Second, GCMaxShare: 0.1, GCMinBatch: 5,
		KubeAPIQPS: 50, KubeAPIBurst: 100,
	}
}

// Validate reports every problem of c.
func (c Config) Validate() error {
	var errs []error
	if len(c.Etcd.Endpoints) == 0 {
		errs = append(errs, errors.New("no etcd endpoints"))
	}
	if c.LeaseNamespace == "" || c.LeaseName == "" || c.Identity == "" {
		errs = append(errs, errors.New("lease namespace, lease name and identity are required"))
	}
	if c.RenewDeadline >= c.LeaseDuration || c.RetryPeriod >= c.RenewDeadline || c.RetryPeriod <= 0 {
		errs = append(errs, fmt.Errorf("want 0 < retry period (%s) < renew deadline (%s) < lease duration (%s)", c.RetryPeriod, c.RenewDeadline, c.LeaseDuration))
	}
	if c.Workers < 1 {
		errs = append(errs, fmt.Errorf("workers %d: want at least 1", c.Workers))
	}
	if c.Resync <= 0 || c.GCInterval <= 0 {
		errs = append(errs, errors.New("resync and GC interval must be positive"))
	}
	if c.GCGrace < 0 || c.GCGrace > 60*time.Second {
		errs = append(errs, fmt.Errorf("GC grace %s: want 0 to 60s", c.GCGrace))
	}
	if c.GCMaxShare <= 0 || c.GCMaxShare > 1 || c.GCMinBatch < 1 {
		errs = append(errs, fmt.Errorf("GC max share %g (want (0,1]) and min batch %d (want ≥ 1)", c.GCMaxShare, c.GCMinBatch))
	}
	if c.KubeAPIQPS <= 0 || c.KubeAPIBurst < 1 {
		errs = append(errs, fmt.Errorf("API server rate %g/s, burst %d: want both positive", c.KubeAPIQPS, c.KubeAPIBurst))
	}
	return errors.Join(errs...)
}

// RestConfig loads the Kubernetes client configuration of c, with c's
// request rate.
func (c Config) RestConfig() (rc *rest.Config, err error) {
	if c.Kubeconfig == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	}
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = c.KubeAPIQPS, c.KubeAPIBurst
	return rc, nil
}

// Run connects to Kubernetes and etcd and syncs while this replica holds
// the leader Lease. It returns when ctx ends (nil) or when leadership is
// lost or syncing fails (an error: the process should exit and restart,
// so that nothing runs on state from a term it no longer holds).
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	rc, err := cfg.RestConfig()
	if err != nil {
		return fmt.Errorf("kubernetes client configuration: %w", err)
	}
	rc.UserAgent = "tabby-kube-controllers"
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	npa, err := npaclient.NewForConfig(rc)
	if err != nil {
		return err
	}
	store, err := datastore.New(ctx, cfg.Etcd)
	if err != nil {
		return err
	}
	defer store.Close()
	return RunWith(ctx, cfg, kc, store, log, WithClusterNetworkPolicies(npa))
}

// RunWith is Run with clients made by the caller (tests).
func RunWith(parent context.Context, cfg Config, kc kubernetes.Interface, store *datastore.Store, log *slog.Logger, opt ...Option) error {
	var opts options
	for _, o := range opt {
		o(&opts)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, cfg.LeaseNamespace, cfg.LeaseName,
		kc.CoreV1(), kc.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: cfg.Identity})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	// The elector only signals; the controller runs on this goroutine, so
	// that RunWith returns only once it has stopped writing.
	leading := make(chan context.Context, 1)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
		ReleaseOnCancel: true, Name: cfg.LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) { leading <- lctx },
			OnStoppedLeading: func() { log.Info("stopped leading", "identity", cfg.Identity) },
		},
	})
	if err != nil {
		return err
	}
	elected := make(chan struct{})
	go func() {
		defer close(elected)
		le.Run(ctx)
	}()
	var runErr error
	select {
	case <-elected:
	case lctx := <-leading:
		log.Info("leading", "identity", cfg.Identity)
		runErr = newController(cfg, kc, store, log, opts).run(lctx)
		if lctx.Err() != nil {
			runErr = nil // the term ended: not the controller's failure
		}
		cancel()
		<-elected
	}
	switch {
	case runErr != nil:
		return runErr
	case parent.Err() != nil:
		return nil
	}
	return errors.New("lost the leader lease")
}
