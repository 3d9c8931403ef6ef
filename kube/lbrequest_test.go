package kube

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/ipam"
)

func TestWantsTabbyLB(t *testing.T) {
	mine, other := LoadBalancerClass, "example.com/lb"
	for _, tt := range []struct {
		name  string
		typ   corev1.ServiceType
		class *string
		want  bool
	}{
		{"LoadBalancer without class", corev1.ServiceTypeLoadBalancer, nil, true},
		{"Tabby's class", corev1.ServiceTypeLoadBalancer, &mine, true},
		{"another class", corev1.ServiceTypeLoadBalancer, &other, false},
		{"ClusterIP", corev1.ServiceTypeClusterIP, nil, false},
		{"NodePort", corev1.ServiceTypeNodePort, nil, false},
	} {
		s := &corev1.Service{Spec: corev1.ServiceSpec{Type: tt.typ, LoadBalancerClass: tt.class}}
		if got := wantsTabbyLB(s); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestLBRequest(t *testing.T) {
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	svc := func(ann map[string]string, mutate func(*corev1.Service)) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "u1", Annotations: ann},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}}
		if mutate != nil {
			mutate(s)
		}
		return s
	}
	base := ipam.LBRequest{Service: ipam.LBService{Namespace: "shop", Name: "web"}, UID: "u1", Families: []int{4}, Pools: map[int][]string{}}
	with := func(f func(*ipam.LBRequest)) ipam.LBRequest { r := base; r.Pools = map[int][]string{}; f(&r); return r }
	for _, tt := range []struct {
		name    string
		svc     *corev1.Service
		want    ipam.LBRequest
		wantErr string
	}{
		{"plain", svc(nil, nil), base, ""},
		{"dual-stack, IPv6 first, status preferred", svc(nil, func(s *corev1.Service) {
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "fd00::5"}, {Hostname: "lb.example"}}
		}), with(func(r *ipam.LBRequest) { r.Families = []int{6, 4}; r.Prefer = addrs("fd00::5") }), ""},
		{"spec.loadBalancerIP and Tabby's annotation over Calico's", svc(map[string]string{
			"tabby.dev/loadBalancerIPs": `["198.19.0.9", "fd00::9"]`, "projectcalico.org/loadBalancerIPs": `["198.19.0.1"]`,
		}, func(s *corev1.Service) { s.Spec.LoadBalancerIP = "198.19.0.9" }),
			with(func(r *ipam.LBRequest) { r.Addrs = addrs("198.19.0.9", "fd00::9") }), ""},
		{"pools, Calico's names, comma list", svc(map[string]string{
			"projectcalico.org/ipv4pools": "lb-a, 198.19.1.0/24", "tabby.dev/ipv6pools": `["lb6"]`,
		}, nil), with(func(r *ipam.LBRequest) { r.Pools = map[int][]string{4: {"lb-a", "198.19.1.0/24"}, 6: {"lb6"}} }), ""},
		{"bad address", svc(map[string]string{"tabby.dev/loadBalancerIPs": "198.19.0.300"}, nil), ipam.LBRequest{},
			`annotation tabby.dev/loadBalancerIPs: "198.19.0.300" is not an IP address`},
		{"bad spec address", svc(nil, func(s *corev1.Service) { s.Spec.LoadBalancerIP = "web" }), ipam.LBRequest{},
			`spec.loadBalancerIP: "web" is not an IP address`},
		{"bad list", svc(map[string]string{"tabby.dev/ipv4pools": `["lb-a"`}, nil), ipam.LBRequest{},
			"annotation tabby.dev/ipv4pools"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := lbRequest(tt.svc)
			if tt.wantErr != "" {
				if err == nil || !errors.Is(err, errLBRequest) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want errLBRequest with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got, cmpopts.EquateEmpty(), cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); d != "" {
				t.Errorf("request (-want +got):\n%s", d)
			}
		})
	}
}

// PreferDualStack falls back to the first family only for problems of the
// second one.
func TestSecondFamilyOnly(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"second family exhausted", &ipam.LBExhaustedError{Family: 6}, true},
		{"first family exhausted", &ipam.LBExhaustedError{Family: 4}, false},
		{"no pool of the second family, wrapped", fmt.Errorf("assigning: %w", &ipam.LBNoPoolError{Family: 6, Reason: "none"}), true},
		{"no pool of the first family", &ipam.LBNoPoolError{Family: 4}, false},
		{"address taken", &ipam.LBTakenError{}, false},
		{"etcd down", errors.New("context deadline exceeded"), false},
	} {
		if got := secondFamilyOnly(tt.err, 6); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
