//go:build unix

package cni

import (
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
)

// umaskMu serialises ListenUnixPrivate's umask changes with each other. The
// umask is per process: a file another goroutine creates in the window
// gets at most owner permissions, never more than it asked for.
var umaskMu sync.Mutex

// ListenUnixPrivate listens on a unix socket at path that only the owner
// can connect to. The socket is created with its final permissions (the
// umask is 0177 while it is bound), so there is no moment at which anyone
// else may connect, as there would be with a chmod after the bind.
func ListenUnixPrivate(path string) (*net.UnixListener, error) {
	umaskMu.Lock()
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	umaskMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("checking socket %s: %w", path, err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		ln.Close()
		return nil, fmt.Errorf("socket %s was created with mode %s, want no access for group and others", path, perm)
	}
	return ln, nil
}
