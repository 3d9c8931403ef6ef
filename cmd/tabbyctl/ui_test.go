package main

import (
	"strings"
	"testing"
)

// TestUIListenLoopbackOnly: tabbyctl ui serves on loopback unless told
// otherwise, and says why it refuses.
func TestUIListenLoopbackOnly(t *testing.T) {
	for _, c := range []struct {
		listen string
		allow  bool
		want   string // "" for accepted
	}{
		{"127.0.0.1:9097", false, ""},
		{"127.0.0.2:0", false, ""},
		{"[::1]:9097", false, ""},
		{"localhost:9097", false, ""},
		{":9097", false, "not a loopback address"},
		{"0.0.0.0:9097", false, "--allow-remote"},
		{"198.18.0.1:9097", false, "not a loopback address"},
		{"0.0.0.0:9097", true, ""},
		{"127.0.0.1", false, "missing port"},
	} {
		err := checkLoopback(c.listen, c.allow)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%q allow=%v: %v, want %q", c.listen, c.allow, err, c.want)
		}
	}
}
