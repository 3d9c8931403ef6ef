package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// localRouteWatch records every deletion of a Tabby local route (protocol
// 80: a pod's host route, a block's blackhole) that `ip monitor route`
// reports in one node's namespace. Pings sample a path every few
// milliseconds; the monitor sees a route deleted and re-added within a
// millisecond, which drops the packets in flight all the same.
type localRouteWatch struct {
	node string
	cmd  *exec.Cmd
	done chan struct{}

	mu      sync.Mutex
	deleted []string
	probed  bool
}

// probeRoute is what shows that the monitor listens: protocol 200 is not
// the agent's, so it leaves the route alone.
const probeRoute = "10.244.127.254"

// watchLocalRoutes starts the monitor in node's namespace and returns once
// it listens. The monitor stops when the test ends.
func watchLocalRoutes(ctx context.Context, t *testing.T, l *lab.Lab, node string) *localRouteWatch {
	t.Helper()
	w := &localRouteWatch{node: node, done: make(chan struct{})}
	w.cmd = exec.Command("ip", "-n", l.State().Node(node).NetNS, "-ts", "monitor", "route")
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatalf("starting ip monitor on %s: %v", node, err)
	}
	go w.read(bufio.NewScanner(out))
	t.Cleanup(func() { w.stop() })
	// A probe added before the monitor subscribed goes unseen: add and
	// delete it until its deletion shows.
	err = testkit.Poll(ctx, 100*time.Millisecond, func() error {
		_, _ = l.Exec(ctx, node, "ip", "route", "add", "blackhole", probeRoute, "proto", "200")
		_, _ = l.Exec(ctx, node, "ip", "route", "del", "blackhole", probeRoute, "proto", "200")
		w.mu.Lock()
		defer w.mu.Unlock()
		if !w.probed {
			return fmt.Errorf("ip monitor on %s has not reported the probe route", node)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *localRouteWatch) read(sc *bufio.Scanner) {
	defer close(w.done)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) < 2 || !strings.HasPrefix(f[0], "[") || f[1] != "Deleted" {
			continue
		}
		w.mu.Lock()
		switch {
		case strings.Contains(line, " "+probeRoute+" ") && hasPair(f, "proto", "200"):
			w.probed = true
		case hasPair(f, "proto", "80"):
			w.deleted = append(w.deleted, line)
		}
		w.mu.Unlock()
	}
}

// stop ends the monitor and returns the deletions it saw; it may be called
// more than once.
func (w *localRouteWatch) stop() []string {
	if w.cmd.ProcessState == nil {
		_ = w.cmd.Process.Kill()
		<-w.done
		_ = w.cmd.Wait()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deleted
}
