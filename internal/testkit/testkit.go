// Package testkit holds the test helpers every Tabby package shares:
// skipping privileged tests, network namespaces for them, waiting for a
// condition with a deadline, and quantiles for benchmarks. It is imported by
// tests only.
//
// Naming rule: a test or benchmark that needs root (it creates network
// namespaces, links, routes or firewall rules, or starts a lab) is named
// TestPrivileged… or BenchmarkPrivileged… and begins with
// RequirePrivileged, so that the unit tier (TABBY_SKIP_PRIVILEGED=1, or not
// root) skips it with a message saying why, and `go test -run
// '^TestPrivileged'` over the packages that have such tests is the
// privileged tier (scripts/test-tiers.sh). No other test outside e2e/ needs
// root; e2e/'s tests all do and are a tier of their own (they start with
// RequirePrivileged too).
package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// SkipPrivilegedEnv, when set to anything, makes RequirePrivileged skip.
const SkipPrivilegedEnv = "TABBY_SKIP_PRIVILEGED"

// RequirePrivileged skips tb unless it may run as a privileged test: it
// skips when SkipPrivilegedEnv is set, when the process is not root, and
// when one of the named commands is not installed. The skip message says
// which.
func RequirePrivileged(tb testing.TB, commands ...string) {
	tb.Helper()
	if reason := privilegedSkipReason(commands); reason != "" {
		tb.Skip("privileged test skipped: " + reason)
	}
}

func privilegedSkipReason(commands []string) string {
	if os.Getenv(SkipPrivilegedEnv) != "" {
		return SkipPrivilegedEnv + " is set"
	}
	if uid := os.Geteuid(); uid != 0 {
		return fmt.Sprintf("needs root to create network namespaces (uid %d)", uid)
	}
	for _, c := range commands {
		if _, err := exec.LookPath(c); err != nil {
			return fmt.Sprintf("%s not installed", c)
		}
	}
	return ""
}
