package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// startDetached starts argv inside the network namespace nsName, in its own
// session (so that it outlives the lab process and does not get the
// terminal's signals), with standard output and error appended to logPath
// and its pid written to pidPath. done is closed when the process exits,
// as long as this process lives.
func startDetached(role, nsName string, argv []string, logPath, pidPath string) (p *Proc, done <-chan struct{}, err error) {
	full := append([]string{"nsenter", "--net=" + NetNSPath(nsName), "--"}, argv...)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("starting %s: %w", role, err)
	}
	defer logf.Close()
	if err := markInheritedCloseOnExec(); err != nil {
		return nil, nil, fmt.Errorf("starting %s: %w", role, err)
	}
	cmd := exec.Command(full[0], full[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("starting %s: %w", role, err)
	}
	ch := make(chan struct{})
	go func() {
		_ = cmd.Wait() // reap; the exit status is in the log
		close(ch)
	}()
	p = &Proc{Role: role, PID: cmd.Process.Pid, Argv: full, Log: logPath}
	if st, err := procStartTime(p.PID); err == nil {
		p.StartTime = st
	}
	if pidPath != "" {
		if err := os.WriteFile(pidPath, []byte(strconv.Itoa(p.PID)+"\n"), 0o644); err != nil {
			_ = cmd.Process.Kill()
			return nil, nil, fmt.Errorf("starting %s: writing pid file: %w", role, err)
		}
	}
	return p, ch, nil
}

// StartDetached starts argv inside the network namespace nsName as
// startDetached does and remembers, for as long as this process lives,
// when it exits (Down and the Stop* methods wait for that instead of
// polling /proc). Record p in the State (Update) so that teardown stops it.
func (l *Lab) StartDetached(role, nsName string, argv []string, logPath, pidPath string) (p *Proc, done <-chan struct{}, err error) {
	p, done, err = startDetached(role, nsName, argv, logPath, pidPath)
	if err != nil {
		return nil, nil, err
	}
	l.trackExit(p.PID, done)
	return p, done, nil
}

// markInheritedCloseOnExec sets close-on-exec on every descriptor of this
// process above standard error. Go opens its own with it, but the ones this
// process inherited without it (a CI harness's or a shell's pipe) would
// otherwise be inherited in turn by every process the lab starts, which
// outlive this one: whoever waits for that pipe to close would wait for the
// lab's processes too.
func markInheritedCloseOnExec() error {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("listing open descriptors: %w", err)
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
	return nil
}

// procStartTime returns field 22 of /proc/<pid>/stat (start time in clock
// ticks since boot).
func procStartTime(pid int) (uint64, error) {
	fields, err := ProcStat(pid)
	if err != nil {
		return 0, err
	}
	if len(fields) < 20 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	// fields[0] is field 3 (state): the command, field 2, may hold spaces
	// and is cut off by procStat.
	return strconv.ParseUint(fields[19], 10, 64)
}

// ProcStat returns the fields of /proc/<pid>/stat after the command name,
// starting with the state.
func ProcStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return strings.Fields(string(b[i+1:])), nil
}

// Alive reports whether pid is still the process p describes: running (not
// a zombie), started at the recorded time, with a command line that is what
// we started or a tail of it (after nsenter and the like exec'd the next
// program).
func (p *Proc) Alive() bool {
	if p == nil || p.PID <= 0 {
		return false
	}
	fields, err := ProcStat(p.PID)
	if err != nil || len(fields) < 20 || fields[0] == "Z" || fields[0] == "X" {
		return false
	}
	if p.StartTime != 0 && fields[19] != strconv.FormatUint(p.StartTime, 10) {
		return false
	}
	b, err := readCmdline(p.PID)
	if err != nil {
		return false
	}
	if len(b) == 0 {
		// Still empty after readCmdline's retries: the process is in the
		// middle of an exec on a loaded machine (a kernel thread has no
		// command line, but never our pid). Its start time matched.
		return true
	}
	args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
	if slices.Equal(args, p.Argv) {
		return true
	}
	// A chain of programs that exec the next (nsenter, unshare, a
	// script's exec "$@") shows a tail of the command line as started;
	// the start time above is what tells a reused pid.
	for i := 1; i < len(p.Argv); i++ {
		if slices.Equal(args, p.Argv[i:]) {
			return true
		}
	}
	return false
}

// Describe says what /proc shows of the process, for an error message.
func (p *Proc) Describe() string {
	if p == nil {
		return "no process"
	}
	fields, err := ProcStat(p.PID)
	if err != nil {
		return fmt.Sprintf("pid %d: %v", p.PID, err)
	}
	state, start := "?", "?"
	if len(fields) > 19 {
		state, start = fields[0], fields[19]
	}
	b, _ := readCmdlineOnce(fmt.Sprintf("/proc/%d/cmdline", p.PID))
	return fmt.Sprintf("pid %d: state %s, start time %s (recorded %d), command line %q", p.PID, state, start, p.StartTime,
		strings.ReplaceAll(string(b), "\x00", " "))
}

// readCmdline reads /proc/<pid>/cmdline. Right after a fork and during an
// execve the command line is empty for a moment (exec.Cmd.Start returns
// when the close-on-exec pipe closes, before the new program's arguments
// are in place), so an empty one is read again for a little while.
func readCmdline(pid int) ([]byte, error) {
	path := fmt.Sprintf("/proc/%d/cmdline", pid)
	for range 100 {
		b, err := readCmdlineOnce(path)
		if err != nil || len(b) > 0 {
			return b, err
		}
		time.Sleep(2 * time.Millisecond) // the kernel gives us nothing to wait on
	}
	return nil, nil
}

// readCmdlineOnce reads a command line file in a single read(2). The
// kernel answers each read from the memory of the program running at that
// moment, so a file read in pieces (os.ReadFile's first read is 512 bytes)
// across an exec — nsenter becoming the program it starts — is the head of
// one command line and the rest of the next, or the head alone when the
// later read falls in the exec's empty moment: a command line that is
// neither what we started nor a tail of it. A buffer that comes back full
// may have cut the line short; it is read again whole in a larger one.
func readCmdlineOnce(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	for size := 4096; ; size *= 4 {
		b := make([]byte, size)
		n, err := unix.Pread(fd, b, 0)
		for errors.Is(err, unix.EINTR) {
			n, err = unix.Pread(fd, b, 0)
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n < size {
			return b[:n], nil
		}
	}
}

// Stop sends sig to the process if it is still ours, waits up to grace for
// it to exit and then kills it. done may be nil (the process was started by
// another lab process); then /proc is polled.
func (p *Proc) Stop(ctx context.Context, sig syscall.Signal, grace time.Duration, done <-chan struct{}) error {
	if !p.Alive() {
		return nil
	}
	if err := syscall.Kill(p.PID, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signalling %s (pid %d): %w", p.Role, p.PID, err)
	}
	if p.waitGone(ctx, grace, done) {
		return nil
	}
	if p.Alive() {
		if err := syscall.Kill(p.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("killing %s (pid %d): %w", p.Role, p.PID, err)
		}
	}
	if !p.waitGone(ctx, 5*time.Second, done) {
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.Role, p.PID)
	}
	return nil
}

// waitGone polls until the process has gone or timeout passed.
func (p *Proc) waitGone(ctx context.Context, timeout time.Duration, done <-chan struct{}) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if done != nil {
			select {
			case <-done:
				return true
			default:
			}
		} else if !p.Alive() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return false
		case <-tick.C:
		}
	}
}

// PIDFile is where a role's pid file lives in dir.
func PIDFile(dir, role string) string { return filepath.Join(dir, role+".pid") }
