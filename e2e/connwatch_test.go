package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tabbynet/tabby/lab"
)

// connWatch tells when a policy change takes effect on real packets: a
// helper process in the client pod opens a new TCP connection to the
// server every connWatchEvery, each on a goroutine of its own, and reports
// for every attempt its sequence number, when it started (wall clock, the
// same for every process of the machine) and whether the handshake was
// answered or its SYN dropped. A new connection meets the policy as it is
// when its SYN arrives, so the first attempt of a lasting new outcome
// dates the change to within connWatchEvery.
const (
	connWatchEvery = 5 * time.Millisecond
	// connWatchTimeout: a handshake not answered in this was dropped.
	connWatchTimeout = 500 * time.Millisecond
	// connWatchStable consecutive attempts with one outcome make it the
	// state (a transition does not flap: a policy change is one atomic
	// firewall update).
	connWatchStable = 10
)

// watchTCP is the helper side: it runs until stdin closes and prints
// "SEQ UNIXNANO ok|dropped|error [DETAIL]" per attempt.
func watchTCP(addr string, every time.Duration) (int, error) {
	var mu sync.Mutex
	w := bufio.NewWriter(os.Stdout)
	report := func(seq int, start time.Time, outcome string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, "%d %d %s\n", seq, start.UnixNano(), outcome)
		_ = w.Flush()
	}
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(done) }()
	tick := time.NewTicker(every)
	defer tick.Stop()
	var wg sync.WaitGroup
	for seq := 0; ; seq++ {
		select {
		case <-done:
			wg.Wait()
			return 0, nil
		case <-tick.C:
		}
		wg.Go(func() {
			start := time.Now()
			c, err := net.DialTimeout("tcp4", addr, connWatchTimeout)
			var ne net.Error
			switch {
			case err == nil:
				_ = c.Close()
				report(seq, start, "ok")
			case errors.As(err, &ne) && ne.Timeout():
				report(seq, start, "dropped")
			default:
				report(seq, start, "error "+strings.ReplaceAll(err.Error(), "\n", " "))
			}
		})
	}
}

type attempt struct {
	start   time.Time
	outcome string // ok, dropped, error …
}

// connWatch is the test side of one watchTCP process.
type connWatch struct {
	mu       sync.Mutex
	attempts map[int]attempt
	maxSeq   int
	closed   bool
	wake     chan struct{}
}

// startConnWatch starts watchTCP in the namespace of pod client against to,
// stopped when the test ends.
func startConnWatch(t *testing.T, l *lab.Lab, client string, to netip.AddrPort) *connWatch {
	t.Helper()
	ns := netnsPath(t, l, client)
	cmd := exec.Command("nsenter", "--net="+ns, "--", os.Args[0], "-test.run=^TestPolicyHelperProcess$", "--",
		"watch", to.String(), connWatchEvery.String())
	cmd.Env = append(os.Environ(), policyHelperEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &connWatch{attempts: map[int]attempt{}, maxSeq: -1, wake: make(chan struct{}, 1)}
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("connection watch %s -> %s: %s", client, to, stderr.String())
		}
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.SplitN(sc.Text(), " ", 3)
			if len(f) < 3 {
				continue
			}
			seq, err1 := strconv.Atoi(f[0])
			ns, err2 := strconv.ParseInt(f[1], 10, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			w.mu.Lock()
			w.attempts[seq] = attempt{start: time.Unix(0, ns), outcome: f[2]}
			w.maxSeq = max(w.maxSeq, seq)
			w.mu.Unlock()
			w.poke()
		}
		w.mu.Lock()
		w.closed = true
		w.mu.Unlock()
		w.poke()
	}()
	return w
}

func (w *connWatch) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// await waits until connWatchStable consecutive connections started at or
// after since were answered (allowed) or dropped (!allowed), and returns
// how long after since the first of them started.
func (w *connWatch) await(since time.Time, allowed bool, within time.Duration) (time.Duration, error) {
	want := "dropped"
	if allowed {
		want = "ok"
	}
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		d, found, seen, closed := w.scan(since, want)
		if found {
			return d, nil
		}
		if closed {
			return 0, fmt.Errorf("the connection watch ended; last attempts: %s", seen)
		}
		select {
		case <-w.wake:
		case <-deadline.C:
			return 0, fmt.Errorf("no %d consecutive %q connections within %s; last attempts: %s", connWatchStable, want, within, seen)
		}
	}
}

// scan looks for the first run of connWatchStable attempts with outcome
// want among those that started at or after since.
func (w *connWatch) scan(since time.Time, want string) (d time.Duration, found bool, seen string, closed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	run, runStart := 0, -1
	var last []string
	for seq := w.first(since); seq <= w.maxSeq; seq++ {
		a, ok := w.attempts[seq]
		if !ok {
			break // still in flight
		}
		last = append(last, a.outcome)
		if a.outcome != want {
			run = 0
			continue
		}
		if run == 0 {
			runStart = seq
		}
		if run++; run >= connWatchStable {
			return w.attempts[runStart].start.Sub(since), true, "", w.closed
		}
	}
	if len(last) > 10 {
		last = last[len(last)-10:]
	}
	return 0, false, strings.Join(last, ", "), w.closed
}

// staysDropped waits until connections have been attempted for dur after
// since and fails unless none that started in that time was answered. (An
// answer is proof; a drop could be a slow machine, so only drops are held.)
func (w *connWatch) staysDropped(since time.Time, dur time.Duration) error {
	end := since.Add(dur)
	deadline := time.NewTimer(dur + connWatchTimeout + kubeDeadline)
	defer deadline.Stop()
	for {
		answered, total, complete, closed := w.between(since, end)
		if answered > 0 {
			return fmt.Errorf("%d of %d connections started within %s were answered", answered, total, dur)
		}
		if complete {
			if total == 0 {
				return fmt.Errorf("no connection attempted within %s", dur)
			}
			return nil
		}
		if closed {
			return errors.New("the connection watch ended")
		}
		select {
		case <-w.wake:
		case <-deadline.C:
			return fmt.Errorf("connections started within %s did not all finish", dur)
		}
	}
}

// between counts the attempts that started in [from, to) and those of
// them answered; complete says all of them have finished.
func (w *connWatch) between(from, to time.Time) (answered, total int, complete, closed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for seq := w.first(from); seq <= w.maxSeq; seq++ {
		a, ok := w.attempts[seq]
		if !ok {
			return answered, total, false, w.closed // still in flight
		}
		if !a.start.Before(to) {
			return answered, total, true, w.closed
		}
		total++
		if a.outcome == "ok" {
			answered++
		}
	}
	return answered, total, false, w.closed
}

// first returns the first sequence number that may have started at or
// after since. Attempts start in sequence order, so it is the one after
// the last known to have started before since (one still in flight before
// that started earlier still). Callers hold w.mu.
func (w *connWatch) first(since time.Time) int {
	for seq := w.maxSeq; seq >= 0; seq-- {
		if a, ok := w.attempts[seq]; ok && a.start.Before(since) {
			return seq + 1
		}
	}
	return 0
}
