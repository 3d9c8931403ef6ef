package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Sockets inside the lab's namespaces, for a process outside them (a test's
// API server offered to a node, the lab's kubectl reaching the control plane).

// ListenIn opens a TCP listener on addr inside the lab namespace ns: the
// socket belongs to that namespace while this process accepts on it, so a
// process of the lab process's own namespace (a test's API server on
// 127.0.0.1) can be offered to a node through Proxy.
func ListenIn(ns, addr string) (net.Listener, error) {
	var l net.Listener
	err := inNetNS(ns, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		if l != nil {
			l.Close()
		}
		return nil, fmt.Errorf("listening on %s in %s: %w", addr, ns, err)
	}
	return l, nil
}

// DialIn connects to addr from inside the lab namespace ns; the
// connection is this process's, so its clients need no route into the lab.
func DialIn(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNetNS(ns, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	if err != nil {
		if c != nil {
			c.Close()
		}
		return nil, fmt.Errorf("dialing %s in %s: %w", addr, ns, err)
	}
	return c, nil
}

// inNetNS runs fn on a locked thread inside the lab namespace ns
// (pkg/ns): sockets fn makes stay in ns.
func inNetNS(name string, fn func() error) error {
	return ns.WithNetNSPath(NetNSPath(name), func(ns.NetNS) error { return fn() })
}

// Proxy forwards every connection accepted on l to the TCP address target
// of this process's namespace until l is closed; then it closes the
// connections it forwards and returns once they are done.
func Proxy(l net.Listener, target string) error {
	var (
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
		wg    sync.WaitGroup
	)
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			mu.Lock()
			for c := range conns {
				c.Close()
			}
			mu.Unlock()
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		mu.Lock()
		conns[c] = true
		mu.Unlock()
		wg.Go(func() {
			forward(c, target)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
		})
	}
}
