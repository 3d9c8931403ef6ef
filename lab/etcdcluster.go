package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// StartEtcd starts every etcd member that is not running (all of them at
// first, again after StopEtcd) and waits until each serves and the cluster
// answers through the unix sockets.
func (l *Lab) StartEtcd(ctx context.Context) error {
	st := l.State()
	var started []string
	for _, m := range st.Etcd {
		if m.Proc.Alive() {
			continue
		}
		// Members of a cluster start together: each waits for a quorum.
		if err := l.startEtcdMember(st, m); err != nil {
			return err
		}
		started = append(started, m.Name)
	}
	if len(started) == 0 {
		return errors.New("etcd is running")
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for _, name := range started {
		if err := l.waitEtcdMember(wctx, name); err != nil {
			return err
		}
	}
	err := Poll(wctx, 100*time.Millisecond, func() (bool, error) {
		s, err := l.connect(wctx)
		if err != nil {
			return false, nil
		}
		_, _, err = s.ListKV(wctx, "lab-probe/")
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for etcd: %w", err)
	}
	return nil
}

// StopEtcd stops every etcd member (SIGTERM, then SIGKILL); their data stay.
func (l *Lab) StopEtcd(ctx context.Context) error {
	var errs []error
	for _, m := range l.State().Etcd {
		errs = append(errs, l.StopEtcdMember(ctx, m.Name, syscall.SIGTERM))
	}
	return errors.Join(errs...)
}

// StopEtcdMember sends sig to one etcd member (SIGKILL: a crash) and waits
// until it exited; its data stay for StartEtcdMember.
func (l *Lab) StopEtcdMember(ctx context.Context, name string, sig syscall.Signal) error {
	m := l.State().etcdMember(name)
	if m == nil {
		return fmt.Errorf("no etcd member %q", name)
	}
	if m.Proc == nil {
		return nil
	}
	progress(l.log, "stopping etcd member %s (pid %d, %v)", name, m.Proc.PID, sig)
	return m.Proc.Stop(ctx, sig, 10*time.Second, l.exitChan(m.Proc.PID))
}

// StartEtcdMember starts one stopped etcd member again on its data and
// waits until it has rejoined the cluster and serves.
func (l *Lab) StartEtcdMember(ctx context.Context, name string) error {
	st := l.State()
	m := st.etcdMember(name)
	if m == nil {
		return fmt.Errorf("no etcd member %q", name)
	}
	if m.Proc.Alive() {
		return fmt.Errorf("etcd member %s is running (pid %d)", name, m.Proc.PID)
	}
	if err := l.startEtcdMember(st, *m); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return l.waitEtcdMember(wctx, name)
}

// startEtcdMember starts the member's process without waiting for it.
func (l *Lab) startEtcdMember(st *State, m EtcdMember) error {
	dir := filepath.Join(l.dir, m.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating etcd directory: %w", err)
	}
	argv := []string{st.LabBinary, "etcd", "--dir", filepath.Join(dir, "data"), "--client-url", m.ClientURL(), "--unix-socket", l.EtcdSocket(m.Name)}
	if len(st.Etcd) > 1 {
		var cluster []string
		for _, o := range st.Etcd {
			cluster = append(cluster, o.Name+"="+o.peerURL())
		}
		argv = append(argv, "--name", m.Name, "--peer-url", m.peerURL(), "--initial-cluster", strings.Join(cluster, ","))
	}
	progress(l.log, "starting etcd member %s in %s at %s", m.Name, st.EtcdNS(), m.ClientURL())
	p, done, err := startDetached(m.Name, st.EtcdNS(), argv, filepath.Join(l.dir, m.Name+".log"), PIDFile(l.dir, m.Name))
	if err != nil {
		return err
	}
	l.trackExit(p.PID, done)
	return l.Update(func(s *State) error {
		if sm := s.etcdMember(m.Name); sm != nil {
			sm.Proc = p
			return nil
		}
		return fmt.Errorf("etcd member %q vanished while starting", m.Name)
	})
}

// waitEtcdMember waits until the member's unix socket accepts, which it
// does once the member serves (see RunEtcd).
func (l *Lab) waitEtcdMember(ctx context.Context, name string) error {
	m := l.State().etcdMember(name)
	if m == nil || m.Proc == nil {
		return fmt.Errorf("etcd member %q was not started", name)
	}
	done := l.exitChan(m.Proc.PID)
	sock := l.EtcdSocket(name)
	err := Poll(ctx, 100*time.Millisecond, func() (bool, error) {
		select {
		case <-done:
			return false, fmt.Errorf("etcd member %s exited; see %s", name, m.Proc.Log)
		default:
		}
		c, err := net.DialTimeout("unix", sock, time.Second)
		if err != nil {
			return false, nil
		}
		return true, c.Close()
	})
	if err != nil {
		return fmt.Errorf("waiting for etcd member %s: %w", name, err)
	}
	return nil
}
