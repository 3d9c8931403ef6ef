package embedded

import (
	"errors"
	"net"
	"testing"
)

// Start retries with new ports only when a port it picked was taken.
func TestAddrInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = net.Listen("tcp", l.Addr().String())
	if err == nil {
		t.Fatal("a second listener on the same port succeeded")
	}
	if !addrInUse(err) {
		t.Errorf("addrInUse(%v) = false, want true", err)
	}
	if addrInUse(errors.New("etcd: data directory is corrupt")) {
		t.Error("addrInUse of another error = true")
	}
}
