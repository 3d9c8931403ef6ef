package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sync"

	"github.com/tabbynet/tabby/datastore/embedded"
)

// EtcdOptions configure RunEtcd, the body of `tabby-lab etcd`.
type EtcdOptions struct {
	Dir        string // data directory, kept across restarts
	ClientURL  string // http://198.18.0.2:2379
	UnixSocket string // also serve clients on this unix socket ("" = no)
	// Name, PeerURL and InitialCluster make the process one member of a
	// cluster (see embedded.Config); empty = a single-member etcd.
	Name, PeerURL, InitialCluster string
	Logger                        *slog.Logger
}

// RunEtcd runs an embedded etcd (member) until ctx is done. It is meant to
// run in the lab's control-plane namespace. The unix socket is made once the
// member serves (a member of a cluster: once it has joined one with a
// quorum), so a socket that accepts means a ready member. The unix socket forwards each connection to
// the client URL: a socket file is reachable from any network namespace, so
// the lab process (in the root namespace, which has no route to the fabric)
// can talk to etcd through it.
func RunEtcd(ctx context.Context, o EtcdOptions) error {
	u, err := url.Parse(o.ClientURL)
	if err != nil || u.Host == "" {
		return fmt.Errorf("invalid client URL %q", o.ClientURL)
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return fmt.Errorf("creating etcd directory: %w", err)
	}
	e, err := embedded.Start(ctx, embedded.Config{Dir: o.Dir, ClientURL: o.ClientURL, Name: o.Name, PeerURL: o.PeerURL,
		InitialCluster: o.InitialCluster, Logger: o.Logger})
	if err != nil {
		return err
	}
	var proxyErr error
	var wg sync.WaitGroup
	if o.UnixSocket != "" {
		if err := os.Remove(o.UnixSocket); err != nil && !errors.Is(err, os.ErrNotExist) {
			return errors.Join(fmt.Errorf("removing stale socket: %w", err), e.Stop())
		}
		l, err := net.Listen("unix", o.UnixSocket)
		if err != nil {
			return errors.Join(fmt.Errorf("listening on %s: %w", o.UnixSocket, err), e.Stop())
		}
		wg.Go(func() { proxyErr = serveProxy(l, u.Host) })
		context.AfterFunc(ctx, func() { l.Close() })
	}
	<-ctx.Done()
	// Stopping etcd ends the forwarded connections, so the proxy can finish.
	stopErr := e.Stop()
	wg.Wait()
	if errors.Is(proxyErr, net.ErrClosed) {
		proxyErr = nil
	}
	return errors.Join(proxyErr, stopErr)
}

// serveProxy forwards every connection accepted on l to the TCP address
// target until l is closed.
func serveProxy(l net.Listener, target string) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		wg.Go(func() { forward(c, target) })
	}
}

func forward(c net.Conn, target string) {
	defer c.Close()
	t, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer t.Close()
	// gRPC needs no half-close: when either side ends, end both.
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(t, c)
	go pipe(c, t)
	<-done
	c.Close()
	t.Close()
	<-done
}
