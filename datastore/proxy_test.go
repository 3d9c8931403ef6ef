package datastore_test

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// cutProxy forwards TCP connections from a loopback port to target, and can
// cut every connection and refuse new ones until it is restored, so that a
// test can take one client off etcd while others go on writing.
type cutProxy struct {
	t      *testing.T
	target string
	addr   string

	mu    sync.Mutex
	l     net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	p := &cutProxy{t: t, target: target, conns: map[net.Conn]struct{}{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = l.Addr().String()
	p.serve(l)
	t.Cleanup(func() { p.cut(); p.wg.Wait() })
	return p
}

func (p *cutProxy) serve(l net.Listener) {
	p.mu.Lock()
	p.l = l
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[u] = struct{}{}, struct{}{}
			p.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				dst.Close()
				src.Close()
			}
			p.wg.Go(func() { pipe(u, c) })
			p.wg.Go(func() { pipe(c, u) })
		}
	})
}

// cut closes the listener and every connection.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.l != nil {
		p.l.Close()
		p.l = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// restore listens again on the same port.
func (p *cutProxy) restore() {
	l, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("re-listening on %s: %v", p.addr, err)
	}
	p.serve(l)
}

// TestWatchResyncsAfterDisconnectAndCompaction takes a watching client off
// etcd, changes and compacts the data meanwhile, and brings it back: the
// watch cannot resume at its revision, so it must resync, and its view must
// end up equal to the store.
func TestWatchResyncsAfterDisconnectAndCompaction(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := storetest.Etcd(t)
	writer := storetest.Connect(t, e)
	proxy := newCutProxy(t, e.Endpoints()[0][len("http://"):])
	watcher := storetest.Connect(t, e, func(c *datastore.Config) {
		c.Endpoints = []string{"http://" + proxy.addr}
	})

	for _, k := range []string{"d/a", "d/b", "d/c"} {
		if _, err := writer.PutKV(ctx, k, []byte("1"), 0); err != nil {
			t.Fatal(err)
		}
	}
	ch := watcher.Watch(ctx, "d/", 0)
	m := mirror{}
	waitMirror(t, writer, ch, m, "d/")

	proxy.cut()
	// The watcher's own calls fail now.
	shortCtx, shortCancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := watcher.GetKV(shortCtx, "d/a")
	shortCancel()
	if err == nil {
		t.Fatal("GetKV through a cut proxy succeeded")
	}
	if err := writer.DeleteKV(ctx, "d/a", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.PutKV(ctx, "d/b", []byte("2"), 0); err != nil {
		t.Fatal(err)
	}
	rev, err := writer.PutKV(ctx, "d/new", []byte("3"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Client().Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	proxy.restore()

	seen := waitMirror(t, writer, ch, m, "d/")
	resynced := false
	for _, e := range seen {
		if e.Type == datastore.EventResync {
			resynced = true
		}
	}
	if !resynced {
		t.Errorf("events after reconnect = %+v, want a resync", seen)
	}
	// And it goes on watching.
	if _, err := writer.PutKV(ctx, "d/after", []byte("4"), 0); err != nil {
		t.Fatal(err)
	}
	waitMirror(t, writer, ch, m, "d/")
	if _, err := watcher.GetKV(ctx, "d/after"); err != nil {
		t.Errorf("watcher's calls after reconnect: %v", err)
	}
}
