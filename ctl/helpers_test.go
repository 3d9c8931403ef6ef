package ctl

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseLabelChanges(t *testing.T) {
	tests := []struct {
		in         []string
		set        [][2]string
		remove     []string
		wantErrSub string
	}{
		{in: []string{"a=b", "c-", "d="}, set: [][2]string{{"a", "b"}, {"d", ""}}, remove: []string{"c"}},
		{in: []string{"x=y=z"}, set: [][2]string{{"x", "y=z"}}},
		{in: nil, wantErrSub: "at least one"},
		{in: []string{"=v"}, wantErrSub: "empty key"},
		{in: []string{"-"}, wantErrSub: "want key=value or key-"},
		{in: []string{"plain"}, wantErrSub: "want key=value or key-"},
	}
	for _, tt := range tests {
		set, remove, err := parseLabelChanges(tt.in)
		if tt.wantErrSub != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErrSub) {
				t.Errorf("parseLabelChanges(%q) error = %v, want %q", tt.in, err, tt.wantErrSub)
			}
			continue
		}
		if err != nil {
			t.Errorf("parseLabelChanges(%q): %v", tt.in, err)
			continue
		}
		if diff := cmp.Diff(tt.set, set); diff != "" {
			t.Errorf("parseLabelChanges(%q) set (-want +got):\n%s", tt.in, diff)
		}
		if diff := cmp.Diff(tt.remove, remove); diff != "" {
			t.Errorf("parseLabelChanges(%q) remove (-want +got):\n%s", tt.in, diff)
		}
	}
}

func TestKernelRoute(t *testing.T) {
	tests := []struct {
		r      kernelRoute
		prefix string
		gws    []string
		text   string
	}{
		{kernelRoute{Dst: "10.244.0.5", Dev: "cali1"}, "10.244.0.5/32", nil, "10.244.0.5 dev cali1"},
		{kernelRoute{Type: "blackhole", Dst: "10.244.0.0/26"}, "10.244.0.0/26", nil, "blackhole 10.244.0.0/26"},
		{kernelRoute{Dst: "default", Gateway: "198.18.0.1", Dev: "eth0"}, "0.0.0.0/0", []string{"198.18.0.1"}, "default via 198.18.0.1 dev eth0"},
		{
			kernelRoute{Dst: "10.244.1.0/26", Nexthops: []struct {
				Gateway string `json:"gateway"`
				Dev     string `json:"dev"`
			}{{"198.18.0.12", "eth0"}, {"198.18.0.13", "eth0"}}},
			"10.244.1.0/26", []string{"198.18.0.12", "198.18.0.13"},
			"10.244.1.0/26 nexthop via 198.18.0.12 dev eth0 nexthop via 198.18.0.13 dev eth0",
		},
	}
	for _, tt := range tests {
		if got := tt.r.prefix(); got != netip.MustParsePrefix(tt.prefix) {
			t.Errorf("%+v prefix() = %s, want %s", tt.r, got, tt.prefix)
		}
		if diff := cmp.Diff(tt.gws, tt.r.gateways()); diff != "" {
			t.Errorf("%+v gateways() (-want +got):\n%s", tt.r, diff)
		}
		if got := tt.r.String(); got != tt.text {
			t.Errorf("String() = %q, want %q", got, tt.text)
		}
	}
}

func TestTables(t *testing.T) {
	tb := newTable("NAME", "CIDR")
	tb.add("pool-a", "10.244.0.0/16")
	tb.add("b", "10.96.0.0/20")
	var plain, boxed strings.Builder
	if err := tb.writePlain(&plain); err != nil {
		t.Fatal(err)
	}
	if err := tb.writeBoxed(&boxed); err != nil {
		t.Fatal(err)
	}
	wantPlain := "NAME     CIDR\npool-a   10.244.0.0/16\nb        10.96.0.0/20\n"
	wantBoxed := `+--------+---------------+
| NAME   | CIDR          |
+--------+---------------+
| pool-a | 10.244.0.0/16 |
| b      | 10.96.0.0/20  |
+--------+---------------+
`
	if diff := cmp.Diff(wantPlain, plain.String()); diff != "" {
		t.Errorf("plain (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantBoxed, boxed.String()); diff != "" {
		t.Errorf("boxed (-want +got):\n%s", diff)
	}
}

func TestPercent(t *testing.T) {
	for _, tt := range []struct {
		n, total int
		want     string
	}{{0, 64, "0 (0%)"}, {1, 64, "1 (2%)"}, {63, 64, "63 (98%)"}, {64, 64, "64 (100%)"}, {3, 0, "3"}} {
		if got := percent(tt.n, tt.total); got != tt.want {
			t.Errorf("percent(%d, %d) = %q, want %q", tt.n, tt.total, got, tt.want)
		}
	}
}
