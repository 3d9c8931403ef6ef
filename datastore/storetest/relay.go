package storetest

import (
	"bufio"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/relay"
)

// A relay is the test binary started again as a watch relay
// (datastore/relay) in front of a child etcd, in a process of its own so
// that a benchmark can take its CPU (ProcSample). TestMain calls
// ServeRelay first; the benchmark calls StartRelay.

// ServeRelay makes this process a watch relay when env is set in its
// environment ("URL WINDOW": etcd's client URL, the batching window as a
// Go duration): it serves on a local port, prints "ready URL", and exits
// at the end of its standard input. It returns (doing nothing) when env is
// not set.
func ServeRelay(env string) {
	v := os.Getenv(env)
	if v == "" {
		return
	}
	if err := serveRelay(v); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serveRelay(v string) error {
	f := strings.Fields(v)
	if len(f) != 2 {
		return fmt.Errorf("relay: %q: want \"URL WINDOW\"", v)
	}
	window, err := time.ParseDuration(f[1])
	if err != nil {
		return fmt.Errorf("relay: %q: %w", v, err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{f[0]}, DialTimeout: startTimeout})
	if err != nil {
		return err
	}
	defer c.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := grpc.NewServer(relay.ServerOptions()...)
	relay.New(c, datastore.DefaultPrefix, window, slog.New(slog.NewTextHandler(os.Stderr, nil))).BatchOnly(relay.DefaultBatched).Register(srv)
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	fmt.Printf("ready http://%s\n", l.Addr())
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
	}
	return sc.Err()
}

// Relay is a running relay process.
type Relay struct {
	PID int
	URL string // for datastore.Config.WatchEndpoints
}

// StartRelay starts the test binary as a watch relay (env set) in front of
// etcd at url, batching by window, stopped at cleanup.
func StartRelay(tb testing.TB, env, url string, window time.Duration) *Relay {
	tb.Helper()
	cmd, in, out := startSelf(tb, fmt.Sprintf("%s=%s %s", env, url, window))
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	tb.Cleanup(func() {
		in.Close()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	sc := bufio.NewScanner(out)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "ready ") {
		tb.Fatal("relay did not start")
	}
	return &Relay{PID: cmd.Process.Pid, URL: strings.TrimPrefix(sc.Text(), "ready ")}
}
