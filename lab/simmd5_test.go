package lab

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestSimMD5 dials a loopback listener that requires a TCP-MD5 key: the
// right key connects, no key and a wrong key do not (the kernel drops the
// SYN, as a reflector's does).
func TestSimMD5(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	lc := net.ListenConfig{Control: md5Control(lo, "mesh-key")}
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	for _, tc := range []struct {
		password string
		ok       bool
	}{{"mesh-key", true}, {"", false}, {"other", false}} {
		d := net.Dialer{Timeout: time.Second, Control: md5Control(lo, tc.password)}
		c, err := d.Dial("tcp4", ln.Addr().String())
		if c != nil {
			c.Close()
		}
		if (err == nil) != tc.ok {
			t.Errorf("password %q: dial error %v, want success %v", tc.password, err, tc.ok)
		}
	}
}

func TestSimMD5Refused(t *testing.T) {
	for _, tc := range []struct {
		peer, password, want string
	}{
		{"fd00::1", "k", "only IPv4 peers"},
		{"198.18.0.1", strings.Repeat("k", 81), "81 bytes, at most 80"},
	} {
		_, err := tcpMD5Sig(netip.MustParseAddr(tc.peer), tc.password)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %d bytes: %v, want %q", tc.peer, len(tc.password), err, tc.want)
		}
	}
}
