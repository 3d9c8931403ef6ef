package policy

import (
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPacketQueryRoundTrip(t *testing.T) {
	a := netip.MustParseAddr
	for _, c := range []struct {
		h string
		p Packet
	}{
		{"forward", Packet{Src: a("10.244.1.2"), Dst: a("10.244.2.3"), Proto: "tcp", SrcPort: 40000, DstPort: 80, In: "cali0123456789a", Out: "eth0"}},
		{"input", Packet{Src: a("fd00::1"), Dst: a("fd00::2"), Proto: "icmpv6", ICMPType: 135, In: "cali1"}},
		{"forward", Packet{Src: a("10.0.0.1"), Dst: a("10.0.0.2"), Proto: "udp", DstPort: 53, Established: true}},
	} {
		h, p, err := ParsePacketQuery(c.p.Query(c.h))
		if err != nil {
			t.Fatalf("%v: %v", c.p, err)
		}
		if d := cmp.Diff(c, struct {
			h string
			p Packet
		}{h, p}, cmp.AllowUnexported(c), cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); d != "" {
			t.Errorf("(-want +got):\n%s", d)
		}
	}
}

// TestParsePacketQueryBad: every bad field is named, and hostile values
// are cut short in the message.
func TestParsePacketQueryBad(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"", []string{"path:", "src:", "dst:", "proto:"}},
		{"path=forward&src=10.0.0.1&dst=fd00::1&proto=tcp", []string{"src, dst:"}},
		{"path=forward&src=10.0.0.1&dst=10.0.0.2&proto=gre&dport=70000&sport=-1", []string{"proto:", "dport:", "sport:"}},
		{"path=forward&src=10.0.0.1&dst=10.0.0.2&proto=tcp&path=prerouting", []string{"path:"}},
		{"path=forward&src=10.0.0.1&dst=10.0.0.2&proto=tcp&in=" + huge, []string{"in:"}},
		{"src=10.0.0.1&src=10.0.0.3&dst=10.0.0.2&proto=tcp&" + huge + "=1", []string{"src: given 2 times", "unknown parameter"}},
		{"path=forward&src=10.0.0.1&dst=10.0.0.2&proto=tcp&established=yes", []string{"established:"}},
	} {
		q, err := url.ParseQuery(c.query)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = ParsePacketQuery(q)
		if err == nil {
			t.Fatalf("%.80s: no error", c.query)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%.80s: error %q lacks %q", c.query, err, w)
			}
		}
		if len(err.Error()) > 1000 {
			t.Errorf("%.80s: error of %d bytes", c.query, len(err.Error()))
		}
	}
}
