package api

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestWorkloadEndpointAddrs(t *testing.T) {
	tests := []struct {
		name    string
		nets    []string
		want    []string
		wantErr string
	}{
		{"none", nil, nil, ""},
		{"cidrs", []string{"10.244.0.5/32", "10.244.1.7/32"}, []string{"10.244.0.5", "10.244.1.7"}, ""},
		{"bare address", []string{"10.244.0.5"}, []string{"10.244.0.5"}, ""},
		{"bad entry skipped", []string{"nonsense", "10.244.0.9/32"}, []string{"10.244.0.9"},
			`spec.ipNetworks[0]: netip.ParsePrefix("nonsense"): no '/'`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &WorkloadEndpoint{Spec: WorkloadEndpointSpec{IPNetworks: tt.nets}}
			got, err := w.Addrs()
			var want []netip.Addr
			for _, s := range tt.want {
				want = append(want, netip.MustParseAddr(s))
			}
			if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
				t.Errorf("Addrs() (-want +got):\n%s", diff)
			}
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if gotErr != tt.wantErr {
				t.Errorf("Addrs() error = %q, want %q", gotErr, tt.wantErr)
			}
		})
	}
}
