package kube_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/kube"
)

func TestRefusedServiceAddrs(t *testing.T) {
	cfg := func(ext, lb []string) *api.BGPConfiguration {
		c := &api.BGPConfiguration{}
		for _, e := range ext {
			c.Spec.ServiceExternalIPs = append(c.Spec.ServiceExternalIPs, api.ServiceCIDR{CIDR: e})
		}
		for _, e := range lb {
			c.Spec.ServiceLoadBalancerIPs = append(c.Spec.ServiceLoadBalancerIPs, api.ServiceCIDR{CIDR: e})
		}
		return c
	}
	rec := func(ext, lb []string) *api.Service {
		return &api.Service{Spec: api.ServiceSpec{ExternalIPs: ext, LoadBalancerIPs: lb}}
	}
	for _, tc := range []struct {
		name string
		rec  *api.Service
		cfg  *api.BGPConfiguration
		want []string
	}{
		{"no configuration", rec([]string{"198.19.9.9"}, nil), nil, nil},
		{"kind not configured: not advertised, not refused", rec([]string{"198.19.9.9"}, []string{"198.19.0.1"}), cfg(nil, nil), nil},
		{"inside", rec([]string{"198.19.8.1"}, []string{"198.19.0.1"}), cfg([]string{"198.19.8.0/24"}, []string{"198.19.0.0/24"}), nil},
		{"external outside", rec([]string{"198.19.8.1", "198.19.9.9", "198.19.9.9"}, nil), cfg([]string{"198.19.8.0/24"}, nil),
			[]string{"198.19.9.9 is outside serviceExternalIPs [198.19.8.0/24]"}},
		{"both outside", rec([]string{"198.19.9.9"}, []string{"198.19.1.1", "fd00::1"}), cfg([]string{"198.19.8.0/24"}, []string{"198.19.0.0/24", "fd00:1::/64"}),
			[]string{"198.19.1.1 is outside serviceLoadBalancerIPs [198.19.0.0/24 fd00:1::/64]", "198.19.9.9 is outside serviceExternalIPs [198.19.8.0/24]",
				"fd00::1 is outside serviceLoadBalancerIPs [198.19.0.0/24 fd00:1::/64]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, kube.RefusedServiceAddrs(tc.rec, tc.cfg)); diff != "" {
				t.Errorf("RefusedServiceAddrs (-want +got):\n%s", diff)
			}
		})
	}
}

// TestServiceAddressRefusedEvent: a Service whose external IP lies outside
// serviceExternalIPs gets a Warning event naming why; when the
// BGPConfiguration changes (and the Service does not), the new reason is
// reported at once, not at the next resync.
func TestServiceAddressRefusedEvent(t *testing.T) {
	c := newLBCluster(t, map[string]string{"lb": "198.19.0.0/30"})
	ctx := context.Background()
	setExt := func(cidr string) {
		t.Helper()
		bc := &api.BGPConfiguration{Metadata: api.ObjectMeta{Name: api.SingletonName},
			Spec: api.BGPConfigurationSpec{ServiceExternalIPs: []api.ServiceCIDR{{CIDR: cidr}}}}
		if _, err := c.store.Apply(ctx, bc); err != nil {
			t.Fatal(err)
		}
	}
	setExt("198.19.8.0/24")
	cfg := testConfig("a")
	cfg.Resync = time.Hour // only the BGPConfiguration's watch can bring the second event
	startControllers(t, cfg, c.ctrl, c.store)
	const ns = "default"
	if _, err := c.kc.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ext"},
		Spec: corev1.ServiceSpec{ExternalIPs: []string{"198.19.8.1", "198.19.9.9"}, Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitEvent(t, ns, "ext", kube.ReasonAdvertRefused, "not advertised over BGP: 198.19.9.9 is outside serviceExternalIPs [198.19.8.0/24]")
	setExt("198.19.9.0/24")
	setExt("198.19.10.0/24")
	c.waitEvent(t, ns, "ext", kube.ReasonAdvertRefused,
		"not advertised over BGP: 198.19.8.1 is outside serviceExternalIPs [198.19.10.0/24]; 198.19.9.9 is outside serviceExternalIPs [198.19.10.0/24]")
}
