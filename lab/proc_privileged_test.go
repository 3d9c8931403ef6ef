package lab

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/testkit"
)

// TestPrivilegedStartDetachedAlive: a program started as the lab starts
// kube-apiserver (nsenter into a namespace, exec'ing the program, with a
// command line of more than 512 bytes) is alive from the first instant.
func TestPrivilegedStartDetachedAlive(t *testing.T) {
	testkit.RequirePrivileged(t, "ip", "nsenter")
	netns := testkit.NewNetNS(t, "tl-alive")
	argv := []string{"sleep", "30", strings.Repeat("0", 700)} // 30 + 0 seconds
	dir := t.TempDir()
	for range 20 {
		p, done, err := startDetached("sleeper", netns.Name, argv, filepath.Join(dir, "sleeper.log"), "")
		if err != nil {
			t.Fatal(err)
		}
		assertAliveThroughExecs(t, p, argv)
		if err := p.Stop(t.Context(), syscall.SIGKILL, 5*time.Second, done); err != nil {
			t.Fatal(err)
		}
		if t.Failed() {
			return
		}
	}
}
