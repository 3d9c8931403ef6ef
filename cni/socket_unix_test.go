//go:build unix

package cni

import (
	"path/filepath"
	"syscall"
	"testing"
)

// The socket is born private whatever the process umask, and the umask is
// put back.
func TestListenUnixPrivate(t *testing.T) {
	old := syscall.Umask(0) // the most permissive: a bind would make 0777
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := ListenUnixPrivate(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if perm := st.Mode & 0o777; perm != 0o600 {
		t.Errorf("socket mode %o, want 600", perm)
	}
	if got := syscall.Umask(0); got != 0 {
		t.Errorf("umask left at %o", got)
	}
}
