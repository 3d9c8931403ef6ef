package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/testkit"
)

func TestMain(m *testing.M) {
	if os.Getenv("TABBY_TEST_RUN_PAUSE") == "1" {
		run(func() { fmt.Println("ready") })
		return
	}
	os.Exit(m.Run())
}

// procField returns a field of /proc/<pid>/status ("" when pid is gone).
func procField(pid int, name string) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestExitsOnSignal: pause runs until SIGTERM or SIGINT and then exits 0
// (a sandbox stopped by the runtime is not a failure).
func TestExitsOnSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), "TABBY_TEST_RUN_PAUSE=1")
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			// Signal only once pause catches the signals.
			if line, err := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
				t.Fatalf("pause said %q (%v), want ready", line, err)
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("pause exited with %v after %v, want status 0", err, sig)
			}
		})
	}
}

// TestReap: every exited child is reaped, several at once.
func TestReap(t *testing.T) {
	var pids []int
	for range 3 {
		cmd := exec.Command("true")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, cmd.Process.Pid)
	}
	for _, pid := range pids {
		testkit.Eventually(t, time.Minute, "a zombie", testkit.Cond(func() bool { return strings.HasPrefix(procField(pid, "State"), "Z") }))
	}
	reap()
	for _, pid := range pids {
		if s := procField(pid, "State"); s != "" {
			t.Errorf("child %d still there (%s) after reap", pid, s)
		}
		if _, err := syscall.Wait4(pid, nil, syscall.WNOHANG, nil); !errors.Is(err, syscall.ECHILD) {
			t.Errorf("child %d: wait4 says %v, want ECHILD", pid, err)
		}
	}
}
