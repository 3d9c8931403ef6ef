// Package version owns the version string every Tabby binary prints.
//
// The Makefile stamps it at link time from `git describe --always --dirty`
// (-ldflags "-X github.com/tabbynet/tabby/internal/version.stamped=…"). A
// binary built without the Makefile (go build, go install, go test) falls
// back to the VCS revision the Go toolchain records in the build info, so
// it still names the commit it came from. The package imports only the
// standard library: the CNI shim links it.
package version

import (
	"runtime/debug"
	"sync"
)

// stamped is set by the linker; empty when the build did not set it.
var stamped string

// String returns the version of this binary: the stamped one, else
// "<revision>[-dirty]" from the build info (12 hex characters, as git
// describe abbreviates), else "devel" when neither is known.
// It is safe for concurrent use.
func String() string { return resolved() }

var resolved = sync.OnceValue(func() string {
	bi, _ := debug.ReadBuildInfo()
	return resolve(stamped, bi)
})

// resolve picks the version from the stamp and the build info.
func resolve(stamp string, bi *debug.BuildInfo) string {
	if stamp != "" {
		return stamp
	}
	if bi == nil {
		return "devel"
	}
	var rev string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		// go install module@version records the module version instead.
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			return v
		}
		return "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}
