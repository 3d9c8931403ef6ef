package api

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseAddressRequest(t *testing.T) {
	tests := []struct {
		name    string
		pod, ns map[string]string
		want    AddressRequest
		wantErr bool
	}{
		{name: "nothing"},
		{name: "calico pool on the namespace",
			ns:   map[string]string{"cni.projectcalico.org/ipv4pools": `["blue"]`},
			want: AddressRequest{IPv4Pools: []string{"blue"}}},
		{name: "pod pool wins over namespace",
			pod:  map[string]string{"tabby.dev/ipv4pools": `["red","10.9.0.0/16"]`},
			ns:   map[string]string{"cni.projectcalico.org/ipv4pools": `["blue"]`},
			want: AddressRequest{IPv4Pools: []string{"red", "10.9.0.0/16"}}},
		{name: "tabby prefix wins over calico on one object",
			pod:  map[string]string{"tabby.dev/ipv4pools": `["red"]`, "cni.projectcalico.org/ipv4pools": `["blue"]`},
			want: AddressRequest{IPv4Pools: []string{"red"}}},
		{name: "ipv6 pools",
			pod:  map[string]string{"cni.projectcalico.org/ipv6pools": `["v6"]`},
			want: AddressRequest{IPv6Pools: []string{"v6"}}},
		{name: "ipAddrs",
			pod:  map[string]string{"cni.projectcalico.org/ipAddrs": `["10.244.1.7"]`},
			want: AddressRequest{Addrs: []netip.Addr{netip.MustParseAddr("10.244.1.7")}}},
		{name: "ipAddrsNoIpam",
			pod:  map[string]string{"tabby.dev/ipAddrsNoIpam": `["10.9.9.9"]`},
			want: AddressRequest{Addrs: []netip.Addr{netip.MustParseAddr("10.9.9.9")}, NoIPAM: true}},
		{name: "addresses on the namespace are ignored",
			ns: map[string]string{"cni.projectcalico.org/ipAddrs": `["10.244.1.7"]`}},
		{name: "both address kinds", wantErr: true,
			pod: map[string]string{"cni.projectcalico.org/ipAddrs": `["10.244.1.7"]`, "cni.projectcalico.org/ipAddrsNoIpam": `["10.244.1.8"]`}},
		{name: "not a list", wantErr: true, pod: map[string]string{"cni.projectcalico.org/ipv4pools": `blue`}},
		{name: "bad address", wantErr: true, pod: map[string]string{"cni.projectcalico.org/ipAddrs": `["10.244.1.300"]`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseAddressRequest(tt.pod, tt.ns)
			if tt.wantErr {
				if !errors.Is(err, ErrAddressAnnotation) {
					t.Fatalf("err = %v, want ErrAddressAnnotation", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
				t.Errorf("(-want +got)\n%s", d)
			}
		})
	}
}

func TestAddressAnnotations(t *testing.T) {
	got := AddressAnnotations(map[string]string{
		"cni.projectcalico.org/ipv4pools": "x", "tabby.dev/ipAddrs": "y", "tabby.dev/other": "z", "foo": "bar",
	})
	want := map[string]string{"cni.projectcalico.org/ipv4pools": "x", "tabby.dev/ipAddrs": "y"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got)\n%s", d)
	}
}
