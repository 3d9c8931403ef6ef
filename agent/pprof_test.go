package agent

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestServePprof: the opt-in listener serves the profile index and a CPU
// profile, and stops when its context ends.
func TestServePprof(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- servePprof(ctx, addr, slog.New(slog.DiscardHandler)) }()
	get := func(path string) (int, string, error) {
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	deadline := time.Now().Add(10 * time.Second)
	var code int
	var body string
	for {
		code, body, err = get("/debug/pprof/")
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling for the listener, not for a result
	}
	if err != nil || code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Fatalf("index: %d %v, body %.200q", code, err, body)
	}
	code, body, err = get("/debug/pprof/profile?seconds=1")
	if err != nil || code != http.StatusOK || len(body) == 0 {
		t.Fatalf("cpu profile: %d %v, %d bytes", code, err, len(body))
	}
	if code, _, err := get("/status"); err != nil || code != http.StatusNotFound {
		t.Fatalf("/status on the pprof listener: %d %v, want 404 (profiles only)", code, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("servePprof: %v", err)
	}
}
