package lab

import (
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMarkInheritedCloseOnExec: a descriptor opened without close-on-exec
// (as one inherited from a harness is) gets it, so that the lab's
// processes do not inherit it.
func TestMarkInheritedCloseOnExec(t *testing.T) {
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil { // no O_CLOEXEC
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	for _, fd := range p {
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC != 0 {
			t.Fatalf("fd %d: flags %#x (%v) before, want no FD_CLOEXEC", fd, flags, err)
		}
	}
	if err := markInheritedCloseOnExec(); err != nil {
		t.Fatal(err)
	}
	for _, fd := range p {
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("fd %d: flags %#x (%v), want FD_CLOEXEC", fd, flags, err)
		}
	}
}

// TestProcAliveThroughExecChain: a process that execs the next program
// twenty times is alive at every moment from its start. Its command line
// is longer than one 512-byte read, as kube-apiserver's is: read in pieces
// across an exec it was the head of one program's and the rest of the
// next's, which made a just-started kube-apiserver look exited.
func TestProcAliveThroughExecChain(t *testing.T) {
	argv := slices.Repeat([]string{"env"}, 20)
	argv = append(argv, "sleep", "30", strings.Repeat("0", 700)) // 30 + 0 seconds
	for range 20 {
		cmd := exec.Command(argv[0], argv[1:]...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		start, err := procStartTime(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		p := &Proc{Role: "chain", PID: cmd.Process.Pid, Argv: argv, StartTime: start}
		assertAliveThroughExecs(t, p, argv[len(argv)-3:])
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			return
		}
	}
}

// assertAliveThroughExecs calls p.Alive from the moment p was started
// until its command line is last (the last program of its exec chain
// runs), and fails the test at the first false.
func assertAliveThroughExecs(t *testing.T, p *Proc, last []string) {
	t.Helper()
	want := strings.Join(last, "\x00") + "\x00"
	for deadline := time.Now().Add(10 * time.Second); ; {
		if !p.Alive() {
			t.Errorf("alive() = false while the exec chain runs (now %s)", p.Describe())
			return
		}
		if b, _ := readCmdline(p.PID); string(b) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("the exec chain did not reach %q in 10 s (now %s)", last[0], p.Describe())
			return
		}
	}
}
