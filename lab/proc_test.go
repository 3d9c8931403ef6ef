package lab

import (
	"syscall"
	"testing"

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
