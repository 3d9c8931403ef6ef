package testkit

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
)

// netnsDir is where `ip netns add` puts its namespace files.
const netnsDir = "/run/netns"

// NetNS is a named network namespace made for one test.
type NetNS struct {
	// Name is the name `ip -n` and `ip netns exec` take.
	Name string
	// Path is its file, for nsenter --net= and pkg/ns.
	Path string
}

// NewNetNS makes a network namespace named prefix-<8 hex digits> (so that
// tests running at the same time never collide, and a leftover says which
// test made it) with its loopback up, and deletes it when the test ends,
// whatever happened in between; one the test deleted itself is fine. It
// needs root and iproute2: call RequirePrivileged(tb, "ip") first.
func NewNetNS(tb testing.TB, prefix string) NetNS {
	tb.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	name := prefix + "-" + hex.EncodeToString(b)
	n := NetNS{Name: name, Path: filepath.Join(netnsDir, name)}
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		tb.Fatalf("ip netns add %s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	tb.Cleanup(func() {
		if _, err := os.Stat(n.Path); errors.Is(err, os.ErrNotExist) {
			return
		}
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			tb.Errorf("ip netns del %s: %v: %s", name, err, strings.TrimSpace(string(out)))
		}
	})
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		tb.Fatalf("ip -n %s link set lo up: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	return n
}

// Do runs fn on a locked OS thread inside the namespace and returns its
// error (pkg/ns.WithNetNSPath: the thread goes back to its own namespace
// afterwards).
func (n NetNS) Do(fn func() error) error {
	return ns.WithNetNSPath(n.Path, func(ns.NetNS) error { return fn() })
}

// UniqueName is prefix and six random hex digits: a name (of a lab, a
// namespace, a link) that no other test running at the same time uses. It
// adds 6 characters, so that a prefix of up to 9 leaves room in a 15-byte
// interface name.
func UniqueName(tb testing.TB, prefix string) string {
	tb.Helper()
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	return prefix + hex.EncodeToString(b[:])
}
