package lab

import (
	"strings"
	"testing"
)

func TestNeighbourEntries(t *testing.T) {
	for _, tc := range []struct {
		nodes, rrs, pods, want int
	}{
		{1, 0, 0, 4},
		{3, 0, 2, 6 + 12 + 12},
		{30, 0, 0, 870 + 120},
		{31, 0, 0, 930 + 124},
		{60, 2, 0, 2*59 + 58*2 + 240},
	} {
		if got := neighbourEntries(tc.nodes, tc.rrs, tc.pods); got != tc.want {
			t.Errorf("neighbourEntries(%d, %d, %d) = %d, want %d", tc.nodes, tc.rrs, tc.pods, got, tc.want)
		}
	}
}

// TestCheckNeighbourTable: with the kernel's default limit of 1024 a full
// mesh fits 30 nodes, not 31 and not the 60 that once never converged; the
// refusal names the limit, the largest size that fits and the way out.
func TestCheckNeighbourTable(t *testing.T) {
	const limit = 1024
	for _, tc := range []struct {
		name             string
		nodes, rrs, pods int
		wantErr          bool
		wantInMessage    []string
	}{
		{"demo", 3, 0, 2, false, nil},
		{"largest mesh", 30, 0, 0, false, nil},
		{"one too many", 31, 0, 0, true, []string{"gc_thresh3=1024", "at most 30 nodes fit", "--route-reflectors 2) this lab fits", "sysctl -w net.ipv4.neigh.default.gc_thresh3=2048"}},
		{"sixty", 60, 0, 0, true, []string{"60 nodes", "at most 30 nodes fit", "route reflectors"}},
		{"sixty with reflectors", 60, 2, 0, false, nil},
		{"pods count", 28, 0, 4, true, []string{"at most 26 nodes fit"}},
		{"reflectors too", 244, 2, 2, true, []string{"2-reflector lab of 244 nodes", "at most 85 nodes fit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkNeighbourTable(tc.nodes, tc.rrs, tc.pods, limit)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error %v", err, tc.wantErr)
			}
			for _, s := range tc.wantInMessage {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q lacks %q", err, s)
				}
			}
		})
	}
}
