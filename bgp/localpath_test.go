package bgp

import (
	"net/netip"
	"testing"
	"time"
)

// A path we originate carries the time it was made (GoBGP shows its age
// from it), not the zero Unix time.
func TestLocalPathTimestamp(t *testing.T) {
	s := &speaker{lifecycle: lifecycle{cfg: Config{RouterID: netip.MustParseAddr("198.18.0.11")}}}
	before := time.Now().Unix()
	p, err := s.localPath(Advertisement{Prefix: netip.MustParsePrefix("10.244.1.0/26")}, false)
	if err != nil {
		t.Fatal(err)
	}
	if p.Age < before || p.Age > time.Now().Unix() {
		t.Errorf("local path timestamp %v, want now (%v)", time.Unix(p.Age, 0), time.Unix(before, 0))
	}
}
