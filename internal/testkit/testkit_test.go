package testkit

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestPollReturnsLastError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	n := 0
	err := Poll(ctx, time.Millisecond, func() error {
		n++
		return errors.New("still " + strings.Repeat("x", n%2))
	})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "last: still") {
		t.Fatalf("Poll = %v, want the deadline and the last error", err)
	}
	if n < 2 {
		t.Errorf("cond called %d times, want several", n)
	}
}

func TestPollCallsOnceAfterDeadline(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls := 0
	if err := Poll(ctx, time.Hour, func() error { calls++; return nil }); err != nil || calls != 1 {
		t.Fatalf("Poll = %v after %d calls, want nil after 1", err, calls)
	}
}

func TestEventually(t *testing.T) {
	start := time.Now()
	n := 0
	d := Eventually(t, 5*time.Second, "the third call", Cond(func() bool { n++; return n == 3 }))
	if n != 3 || d <= 0 || d > time.Since(start) {
		t.Fatalf("Eventually returned %v after %d calls", d, n)
	}
}

// TestEventuallyFails runs a failing Eventually in a child process, which
// is the only way to see a FailNow from outside.
func TestEventuallyFails(t *testing.T) {
	if os.Getenv("TESTKIT_CHILD") == "1" {
		Eventually(t, 20*time.Millisecond, "the impossible", func() error { return errors.New("nope") })
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestEventuallyFails$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TESTKIT_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "the impossible: not within 20ms: context deadline exceeded (last: nope)") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func TestSkipReason(t *testing.T) {
	t.Setenv(SkipPrivilegedEnv, "1")
	if r := privilegedSkipReason(nil); r != "TABBY_SKIP_PRIVILEGED is set" {
		t.Errorf("with %s set: %q", SkipPrivilegedEnv, r)
	}
	t.Setenv(SkipPrivilegedEnv, "")
	r := privilegedSkipReason([]string{"no-such-command-tabby"})
	if os.Geteuid() == 0 && r != "no-such-command-tabby not installed" {
		t.Errorf("root, missing command: %q", r)
	}
	if os.Geteuid() != 0 && !strings.HasPrefix(r, "needs root") {
		t.Errorf("not root: %q", r)
	}
}

func TestPrivilegedNewNetNS(t *testing.T) {
	RequirePrivileged(t, "ip")
	var n NetNS
	t.Run("make", func(t *testing.T) {
		n = NewNetNS(t, "tbtk")
		if !strings.HasPrefix(n.Name, "tbtk-") || n.Path != "/run/netns/"+n.Name {
			t.Fatalf("NewNetNS = %+v", n)
		}
		out, err := exec.Command("ip", "-n", n.Name, "-o", "link", "show", "lo").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "UP") {
			t.Fatalf("lo in %s: %v: %s", n.Name, err, out)
		}
		var inside, outside string
		if err := n.Do(func() error {
			b, err := os.Readlink("/proc/thread-self/ns/net")
			inside = b
			return err
		}); err != nil {
			t.Fatal(err)
		}
		outside, _ = os.Readlink("/proc/self/ns/net")
		if inside == outside || inside == "" {
			t.Errorf("Do ran in %q, this process is in %q", inside, outside)
		}
	})
	if _, err := os.Stat(n.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left after the subtest ended (stat: %v)", n.Path, err)
	}
	// One the test deleted itself is fine.
	t.Run("deleted by the test", func(t *testing.T) {
		m := NewNetNS(t, "tbtk")
		if out, err := exec.Command("ip", "netns", "del", m.Name).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	})
}

func TestUniqueName(t *testing.T) {
	a, b := UniqueName(t, "tl"), UniqueName(t, "tl")
	if len(a) != 8 || !strings.HasPrefix(a, "tl") || a == b {
		t.Errorf("UniqueName: %q and %q", a, b)
	}
}
