package dataplane_test

import (
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// procWatch counts the processes this test process creates, as the kernel
// reports them: it listens to the process-events connector (CN_PROC), which
// announces every fork and clone in the machine, and keeps the forks whose
// parent is this process and whose child is a new process rather than a
// thread. Whatever starts a process — os/exec, a library's exec, a cgo
// fork — is seen, so "no event" proves that nothing was started, which a
// hook in our own exec calls could not (go-iptables runs commands of its
// own, for example).
type procWatch struct {
	c    *netlink.Conn
	self uint32

	mu       sync.Mutex
	children []uint32 // child pids, in the order the kernel reported them
	done     chan struct{}
	err      error
}

// CN_PROC's constants (linux/connector.h, linux/cn_proc.h); x/sys/unix
// lacks them.
const (
	cnIdxProc          = 1
	cnValProc          = 1
	procCnMcastListen  = 1
	procCnMcastIgnore  = 2
	procEventFork      = 0x1
	cnMsgHeaderLen     = 20 // cb_id (8), seq, ack (4 each), len, flags (2 each)
	procEventHeaderLen = 16 // what, cpu (4 each), timestamp (8)
)

// newProcWatch starts listening; it skips the test when the kernel does
// not offer the connector here (it needs CONFIG_PROC_EVENTS, root and the
// initial user and PID namespaces).
func newProcWatch(tb testing.TB) *procWatch {
	tb.Helper()
	c, err := netlink.Dial(unix.NETLINK_CONNECTOR, &netlink.Config{Groups: cnIdxProc})
	if err != nil {
		tb.Skipf("process-events connector unavailable: %v", err)
	}
	w := &procWatch{c: c, self: uint32(os.Getpid()), done: make(chan struct{})}
	if err := w.op(procCnMcastListen); err != nil {
		_ = c.Close()
		tb.Skipf("process-events connector unavailable: %v", err)
	}
	go w.read()
	tb.Cleanup(func() {
		_ = w.op(procCnMcastIgnore)
		_ = w.c.Close()
		<-w.done
	})
	// The kernel sends events only to listeners it knows of: wait until
	// one of our own children is seen, so that a silent connector (a
	// kernel without CONFIG_PROC_EVENTS, a container's PID namespace)
	// skips rather than passes.
	if _, err := w.mark(); err != nil {
		tb.Skipf("process-events connector silent: %v", err)
	}
	return w
}

func (w *procWatch) op(op uint32) error {
	b := make([]byte, cnMsgHeaderLen+4)
	binary.NativeEndian.PutUint32(b[0:], cnIdxProc)
	binary.NativeEndian.PutUint32(b[4:], cnValProc)
	binary.NativeEndian.PutUint16(b[16:], 4)
	binary.NativeEndian.PutUint32(b[cnMsgHeaderLen:], op)
	_, err := w.c.Send(netlink.Message{Header: netlink.Header{Type: netlink.Done}, Data: b})
	return err
}

func (w *procWatch) read() {
	defer close(w.done)
	for {
		msgs, err := w.c.Receive()
		if err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			return
		}
		for _, m := range msgs {
			d := m.Data
			if len(d) < cnMsgHeaderLen+procEventHeaderLen+16 {
				continue
			}
			ev := d[cnMsgHeaderLen:]
			if binary.NativeEndian.Uint32(ev[0:]) != procEventFork {
				continue
			}
			f := ev[procEventHeaderLen:]
			parentTgid, childPid, childTgid := binary.NativeEndian.Uint32(f[4:]), binary.NativeEndian.Uint32(f[8:]), binary.NativeEndian.Uint32(f[12:])
			if parentTgid == w.self && childTgid == childPid && childTgid != w.self {
				w.mu.Lock()
				w.children = append(w.children, childPid)
				w.mu.Unlock()
			}
		}
	}
}

// mark starts /bin/true and waits until the kernel's event for it arrives;
// it returns how many children were reported before it. A fork that
// finished before mark was called is reported before the marker's.
func (w *procWatch) mark() (int, error) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		return 0, err
	}
	pid := uint32(cmd.Process.Pid)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		for i, c := range w.children {
			if c == pid {
				n := i
				w.children = w.children[i+1:]
				w.mu.Unlock()
				return n, nil
			}
		}
		err := w.err
		w.mu.Unlock()
		if err != nil {
			return 0, err
		}
		time.Sleep(time.Millisecond)
	}
	return 0, errors.New("no event for a child process within 5s")
}

// count runs fn and returns how many processes this process created while
// it ran (the marker excluded).
func (w *procWatch) count(tb testing.TB, fn func()) int {
	tb.Helper()
	if _, err := w.mark(); err != nil {
		tb.Fatal(err)
	}
	fn()
	n, err := w.mark()
	if err != nil {
		tb.Fatal(err)
	}
	return n
}
