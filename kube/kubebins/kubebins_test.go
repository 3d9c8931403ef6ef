package kubebins

import (
	"os"
	"strings"
	"testing"
)

// TestCoreDNSVersionMatchesBuildModule: the CoreDNS the lab looks for is
// the release scripts/coredns-build builds.
func TestCoreDNSVersionMatchesBuildModule(t *testing.T) {
	b, err := os.ReadFile("../../scripts/coredns-build/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "require github.com/coredns/coredns "+CoreDNSVersion+"\n") {
		t.Errorf("scripts/coredns-build/go.mod does not require github.com/coredns/coredns %s", CoreDNSVersion)
	}
}
