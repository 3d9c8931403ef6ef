package storetest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/embedded"
)

// A child etcd is the test binary itself, started again as an embedded
// etcd (no fsync) that writes on command: a benchmark of what receiving
// writes costs keeps etcd's and the writer's CPU out of its own process.
// TestMain calls ServeChild first; the benchmark calls StartChild.

// ChildHandler runs one command line of the child against its store and
// returns the revision the command's writes reached.
type ChildHandler func(ctx context.Context, store *datastore.Store, args []string) (int64, error)

// ServeChild makes this process the child when env is set in its
// environment: it serves handle's commands on stdin until EOF and exits.
// It returns (doing nothing) when env is not set.
func ServeChild(env string, handle ChildHandler) {
	if os.Getenv(env) == "" {
		return
	}
	if err := serveChild(os.Stdin, os.Stdout, handle); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serveChild(in io.Reader, out io.Writer, handle ChildHandler) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "tabby-bench-etcd-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e, err := embedded.Start(ctx, embedded.Config{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		return err
	}
	defer e.Stop()
	store, err := datastore.New(ctx, datastore.Config{Endpoints: e.Endpoints()})
	if err != nil {
		return err
	}
	defer store.Close()
	fmt.Fprintln(out, e.Endpoints()[0])
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		rev, err := handle(ctx, store, strings.Fields(sc.Text()))
		if err != nil {
			return fmt.Errorf("bench etcd: %q: %w", sc.Text(), err)
		}
		fmt.Fprintf(out, "ok %d\n", rev)
	}
	return sc.Err()
}

// Child is a running child etcd: its client URL and its command line.
type Child struct {
	URL string
	in  io.Writer
	out *bufio.Scanner
}

// StartChild starts the test binary as a child etcd (env set), stopped at
// cleanup.
func StartChild(tb testing.TB, env string) *Child {
	tb.Helper()
	cmd, in, out := startSelf(tb, env+"=1")
	tb.Cleanup(func() { in.Close(); _ = cmd.Wait() })
	c := &Child{in: in, out: bufio.NewScanner(out)}
	if !c.out.Scan() {
		tb.Fatal("bench etcd did not start")
	}
	c.URL = c.out.Text()
	return c
}

// Do sends one command and returns the revision its writes reached.
func (c *Child) Do(tb testing.TB, cmd string) int64 {
	tb.Helper()
	fmt.Fprintln(c.in, cmd)
	if !c.out.Scan() {
		tb.Fatalf("bench etcd: %s: no answer", cmd)
	}
	rev, err := strconv.ParseInt(strings.TrimPrefix(c.out.Text(), "ok "), 10, 64)
	if err != nil {
		tb.Fatalf("bench etcd: %s: %s", cmd, c.out.Text())
	}
	return rev
}

// startSelf starts the test binary again, running no test, with envVar
// (NAME=value) added to its environment and its standard input and output
// piped: the child etcd and the floor, which serve on those pipes.
func startSelf(tb testing.TB, envVar string) (*exec.Cmd, io.WriteCloser, io.Reader) {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envVar)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	return cmd, in, out
}
