package storetest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/procstat"
)

// A floor is the test binary started again as a bare etcd watcher
// (datastore.Store.FloorWatch): the reference a benchmark measures a
// watcher's per-event CPU against, in a process of its own so that its
// CPU is its own (ProcSample). TestMain calls ServeFloor first; the
// benchmark calls StartFloor.

// ServeFloor makes this process a floor when env is set in its
// environment ("URL REV MODE [WATCHURL [STREAMS]]": etcd's client URL, the
// first revision to watch, the datastore.FloorMode as a number, a watch
// relay's URL for datastore.Config.WatchEndpoints, how many copies of the
// watch to hold, each on its own stream in FloorStream mode; the events are
// the first's):
// it watches spec and answers "wait REV" lines on stdin, once it received
// a response at revision REV or later, with "ok EVENTS" (the events
// counted so far), until EOF, and exits. It returns (doing nothing) when
// env is not set.
func ServeFloor(env string, spec datastore.WatchSpec) {
	v := os.Getenv(env)
	if v == "" {
		return
	}
	if err := serveFloor(v, spec, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serveFloor(v string, spec datastore.WatchSpec, in io.Reader, out io.Writer) error {
	var (
		url  string
		from int64
		mode datastore.FloorMode
	)
	f := strings.Fields(v)
	if len(f) < 3 {
		return fmt.Errorf("floor: %q: want \"URL REV MODE [WATCHURL]\"", v)
	}
	if _, err := fmt.Sscan(strings.Join(f[:3], " "), &url, &from, &mode); err != nil {
		return fmt.Errorf("floor: %q: want \"URL REV MODE [WATCHURL]\": %w", v, err)
	}
	cfg := datastore.Config{Endpoints: []string{url}, WatchEndpoints: f[3:min(4, len(f))]}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store, err := datastore.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer store.Close()
	streams := 1
	if len(f) > 4 {
		if streams, err = strconv.Atoi(f[4]); err != nil || streams < 1 {
			return fmt.Errorf("floor: %q: STREAMS: want a positive number", v)
		}
	}
	var (
		mu     sync.Mutex
		cond   = sync.NewCond(&mu)
		events int                      // the first watch's
		revs   = make([]int64, streams) // each watch's
		failed error
	)
	for i := range streams {
		go func() {
			err := store.FloorWatch(ctx, spec, from, mode, func(n int, r int64) {
				mu.Lock()
				if i == 0 {
					events += n
				}
				revs[i] = max(revs[i], r)
				mu.Unlock()
				cond.Broadcast()
			})
			mu.Lock()
			failed = err
			mu.Unlock()
			cond.Broadcast()
		}()
	}
	fmt.Fprintln(out, "ready")
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 || f[0] != "wait" {
			return fmt.Errorf("floor: %q: want \"wait REV\"", sc.Text())
		}
		want, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return fmt.Errorf("floor: %q: want \"wait REV\"", sc.Text())
		}
		mu.Lock()
		for slices.Min(revs) < want && failed == nil {
			cond.Wait()
		}
		n, ferr := events, failed
		mu.Unlock()
		if ferr != nil {
			return ferr
		}
		fmt.Fprintf(out, "ok %d\n", n)
	}
	return sc.Err()
}

// Floor is a running floor process.
type Floor struct {
	PID int
	in  io.Writer
	out *bufio.Scanner
}

// StartFloor starts the test binary as a floor (env set) watching etcd at
// url from revision from on as mode says, stopped at cleanup. A watchURL
// (a watch relay's) makes a FloorStream floor watch through it, and a
// second word after it (a number) hold as many copies of the watch.
func StartFloor(tb testing.TB, env, url string, from int64, mode datastore.FloorMode, watchURL ...string) *Floor {
	tb.Helper()
	cmd, in, out := startSelf(tb, strings.TrimSpace(fmt.Sprintf("%s=%s %d %d %s", env, url, from, mode, strings.Join(watchURL, " "))))
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	tb.Cleanup(func() {
		in.Close() // the floor returns at the end of its input
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	f := &Floor{PID: cmd.Process.Pid, in: in, out: bufio.NewScanner(out)}
	if !f.out.Scan() || f.out.Text() != "ready" {
		tb.Fatal("floor did not start")
	}
	return f
}

// Wait returns once the floor received a response at revision rev or
// later, with the events it counted so far.
func (f *Floor) Wait(tb testing.TB, rev int64) int {
	tb.Helper()
	fmt.Fprintf(f.in, "wait %d\n", rev)
	if !f.out.Scan() {
		tb.Fatalf("floor: wait %d: no answer", rev)
	}
	n, err := strconv.Atoi(strings.TrimPrefix(f.out.Text(), "ok "))
	if err != nil {
		tb.Fatalf("floor: wait %d: %s", rev, f.out.Text())
	}
	return n
}

// ProcCounters are a process's CPU and context switches, summed over its
// live threads.
type ProcCounters = procstat.Counters

// ProcSample reads process pid's ProcCounters from /proc. A thread that
// exited took its counts with it: a Go process's threads rarely exit.
func ProcSample(pid int) (ProcCounters, error) {
	p, err := procstat.Read(pid)
	return p.Total(), err
}
