package kube_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/kube"
	"github.com/tabbynet/tabby/kube/kubetest"
)

// lbCluster is a dual-stack API server with the controllers' RBAC, an
// etcd with a pod pool and LoadBalancer pools.
type lbCluster struct {
	kc    kubernetes.Interface // admin
	ctrl  kubernetes.Interface // the controllers' least-privilege user
	store *datastore.Store
	alloc *ipam.Allocator
}

func newLBCluster(t testing.TB, pools map[string]string) *lbCluster {
	t.Helper()
	srv := kubetest.StartWith(t, kubetest.Options{ServiceCIDRs: "10.96.0.0/16,fd00:10:96::/112"})
	c := &lbCluster{kc: srv.Client, store: storetest.New(t)}
	c.alloc = ipam.New(c.store)
	ctx := context.Background()
	if _, err := c.alloc.CreatePool(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "pods"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16"}}); err != nil {
		t.Fatal(err)
	}
	for name, cidr := range pools {
		if _, err := c.alloc.CreatePool(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: name},
			Spec: api.IPPoolSpec{CIDR: cidr, AllowedUses: []api.IPPoolUse{api.UseLoadBalancer}}}); err != nil {
			t.Fatal(err)
		}
	}
	kubetest.ApplyControllersRBAC(t, c.kc, "../manifests/tabby-kube-controllers.yaml")
	c.ctrl = srv.As(t, "controllers")
	return c
}

type svcOpt func(*corev1.Service)

func lbService(ns, name string, opts ...svcOpt) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func withAnnotation(k, v string) svcOpt {
	return func(s *corev1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

func dualStack(p corev1.IPFamilyPolicy) svcOpt {
	return func(s *corev1.Service) { s.Spec.IPFamilyPolicy = &p }
}

func (c *lbCluster) create(t *testing.T, s *corev1.Service) {
	t.Helper()
	if _, err := c.kc.CoreV1().Services(s.Namespace).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Service %s/%s: %v", s.Namespace, s.Name, err)
	}
}

// ingress returns the Service's status.loadBalancer.ingress IPs.
func (c *lbCluster) ingress(ns, name string) ([]string, error) {
	s, err := c.kc.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, in := range s.Status.LoadBalancer.Ingress {
		out = append(out, in.IP)
	}
	return out, nil
}

func (c *lbCluster) waitIngress(t *testing.T, ns, name string, want ...string) {
	t.Helper()
	eventually(t, fmt.Sprintf("ingress of %s/%s is %v", ns, name, want), 20*time.Second, func() (bool, string) {
		got, err := c.ingress(ns, name)
		if err != nil {
			return false, err.Error()
		}
		return slices.Equal(got, want), fmt.Sprint(got)
	})
}

// waitAnyIngress waits until the Service shows n addresses and returns
// them.
func (c *lbCluster) waitAnyIngress(t *testing.T, ns, name string, n int) []string {
	t.Helper()
	var got []string
	eventually(t, fmt.Sprintf("%s/%s shows %d addresses", ns, name, n), 20*time.Second, func() (bool, string) {
		var err error
		got, err = c.ingress(ns, name)
		if err != nil {
			return false, err.Error()
		}
		return len(got) == n, fmt.Sprint(got)
	})
	return got
}

// waitEvent waits for an event on the Service with the reason and a
// message containing msg.
func (c *lbCluster) waitEvent(t *testing.T, ns, name, reason, msg string) {
	t.Helper()
	eventually(t, fmt.Sprintf("event %s %q on %s/%s", reason, msg, ns, name), 20*time.Second, func() (bool, string) {
		evs, err := c.kc.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.SelectorFromSet(fields.Set{"involvedObject.name": name, "reason": reason}).String()})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range evs.Items {
			if strings.Contains(e.Message, msg) {
				return true, ""
			}
			seen = append(seen, e.Message)
		}
		return false, fmt.Sprint(seen)
	})
}

// consistent checks that no address is recorded twice and that every
// LoadBalancer Service's status matches its record.
func (c *lbCluster) consistent(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	allocs, err := c.alloc.LBAllocations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[string][]string{}
	for _, a := range allocs {
		recorded[a.Service.String()] = append(recorded[a.Service.String()], a.Addr.String())
	}
	svcs, err := c.kc.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]string{}
	for _, s := range svcs.Items {
		var ips []string
		for _, in := range s.Status.LoadBalancer.Ingress {
			if prev, dup := shown[in.IP]; dup {
				t.Errorf("%s is shown by %s and %s/%s", in.IP, prev, s.Namespace, s.Name)
			}
			shown[in.IP] = s.Namespace + "/" + s.Name
			ips = append(ips, in.IP)
		}
		rec := recorded[s.Namespace+"/"+s.Name]
		slices.Sort(ips)
		slices.Sort(rec)
		if !slices.Equal(ips, rec) {
			t.Errorf("%s/%s shows %v, etcd records %v", s.Namespace, s.Name, ips, rec)
		}
	}
}

func TestLoadBalancerIPAM(t *testing.T) {
	c := newLBCluster(t, map[string]string{"lb-a": "198.19.0.0/30", "lb-b": "198.19.1.0/31", "lb6": "fd00:198:19::/126"})
	ctx := context.Background()
	// Two replicas: only the leader acts.
	startControllers(t, testConfig("a"), c.ctrl, c.store)
	startControllers(t, testConfig("b"), c.ctrl, c.store)
	const ns = "default"

	// Assign: the first address of the first pool.
	c.create(t, lbService(ns, "first"))
	c.waitIngress(t, ns, "first", "198.19.0.0")
	c.waitEvent(t, ns, "first", kube.ReasonLBAssigned, "198.19.0.0")

	// A specific address by spec.loadBalancerIP and by annotation.
	c.create(t, lbService(ns, "by-spec", func(s *corev1.Service) { s.Spec.LoadBalancerIP = "198.19.0.3" }))
	c.waitIngress(t, ns, "by-spec", "198.19.0.3")
	c.create(t, lbService(ns, "by-annotation", withAnnotation("tabby.dev/loadBalancerIPs", `["198.19.1.1"]`)))
	c.waitIngress(t, ns, "by-annotation", "198.19.1.1")

	// A pool by annotation (Calico's name).
	c.create(t, lbService(ns, "by-pool", withAnnotation("projectcalico.org/ipv4pools", `["lb-b"]`)))
	c.waitIngress(t, ns, "by-pool", "198.19.1.0")

	// Bad requests: an address outside every pool, one held by another
	// Service, a pool that is not a LoadBalancer pool.
	c.create(t, lbService(ns, "outside", func(s *corev1.Service) { s.Spec.LoadBalancerIP = "203.0.113.7" }))
	c.waitEvent(t, ns, "outside", kube.ReasonLBFailed, "address 203.0.113.7 is outside every LoadBalancer pool")
	c.create(t, lbService(ns, "taken", withAnnotation("tabby.dev/loadBalancerIPs", "198.19.0.3")))
	c.waitEvent(t, ns, "taken", kube.ReasonLBFailed, "address 198.19.0.3 is already assigned to Service default/by-spec")
	c.create(t, lbService(ns, "pod-pool", withAnnotation("tabby.dev/ipv4pools", `["pods"]`)))
	c.waitEvent(t, ns, "pod-pool", kube.ReasonLBFailed, `requested pool "pods" is not a LoadBalancer pool`)

	// Exhaustion: lb-a has 198.19.0.1 and .2 left.
	c.create(t, lbService(ns, "second"))
	c.create(t, lbService(ns, "third"))
	c.waitAnyIngress(t, ns, "second", 1)
	c.waitAnyIngress(t, ns, "third", 1)
	c.create(t, lbService(ns, "starved"))
	c.waitEvent(t, ns, "starved", kube.ReasonLBFailed, "have no free IPv4 address")
	if got, _ := c.ingress(ns, "starved"); len(got) != 0 {
		t.Fatalf("exhausted, yet starved shows %v", got)
	}

	// Release on delete: the waiting Service gets the freed address.
	if err := c.kc.CoreV1().Services(ns).Delete(ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitIngress(t, ns, "starved", "198.19.0.0")

	// Release on type change; "taken" then gets the address it asked for.
	s, err := c.kc.CoreV1().Services(ns).Get(ctx, "by-spec", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.Type = corev1.ServiceTypeClusterIP
	s.Spec.LoadBalancerIP = ""
	if _, err := c.kc.CoreV1().Services(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitIngress(t, ns, "by-spec")
	c.waitIngress(t, ns, "taken", "198.19.0.3")

	// Another class is not Tabby's; Tabby's class is.
	other, mine := "example.com/other-lb", kube.LoadBalancerClass
	c.create(t, lbService(ns, "other-class", func(s *corev1.Service) { s.Spec.LoadBalancerClass = &other }))
	c.create(t, lbService(ns, "tabby-class", func(s *corev1.Service) { s.Spec.LoadBalancerClass = &mine }, withAnnotation("tabby.dev/ipv4pools", "lb-b")))
	c.waitEvent(t, ns, "tabby-class", kube.ReasonLBFailed, "[lb-b] have no free IPv4 address")

	// Dual-stack: one address of each family, in the Service's order.
	c.create(t, lbService(ns, "dual", dualStack(corev1.IPFamilyPolicyRequireDualStack), func(s *corev1.Service) {
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
	}, withAnnotation("tabby.dev/ipv4pools", "lb-b")))
	c.waitEvent(t, ns, "dual", kube.ReasonLBFailed, "[lb-b] have no free IPv4 address")
	if err := c.kc.CoreV1().Services(ns).Delete(ctx, "by-pool", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// by-pool's 198.19.1.0 frees; tabby-class and dual both wait for it:
	// exactly one gets it.
	eventually(t, "one of the waiting Services gets 198.19.1.0", 20*time.Second, func() (bool, string) {
		tc, _ := c.ingress(ns, "tabby-class")
		d, _ := c.ingress(ns, "dual")
		return slices.Contains(tc, "198.19.1.0") != slices.Contains(d, "198.19.1.0"), fmt.Sprint(tc, d)
	})
	// The one left waiting is made to show an address it does not hold
	// (another Service's): it shows nothing again.
	loser := "dual"
	if got, _ := c.ingress(ns, "dual"); len(got) > 0 {
		loser = "tabby-class"
	}
	ls, err := c.kc.CoreV1().Services(ns).Get(ctx, loser, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ls.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.1.1"}}
	if _, err := c.kc.CoreV1().Services(ns).UpdateStatus(ctx, ls, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitIngress(t, ns, loser)
	c.create(t, lbService(ns, "dual6", dualStack(corev1.IPFamilyPolicyRequireDualStack), func(s *corev1.Service) {
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
	}, withAnnotation("tabby.dev/ipv4pools", "lb-a"), withAnnotation("tabby.dev/loadBalancerIPs", "fd00:198:19::2")))
	c.waitEvent(t, ns, "dual6", kube.ReasonLBFailed, "[lb-a] have no free IPv4 address")
	if err := c.kc.CoreV1().Services(ns).Delete(ctx, "starved", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitIngress(t, ns, "dual6", "fd00:198:19::2", "198.19.0.0")

	time.Sleep(time.Second) // let anything wrong happen
	if got, _ := c.ingress(ns, "other-class"); len(got) != 0 {
		t.Errorf("a Service of another class got %v", got)
	}
	c.consistent(t, ns)
}

// The only replica stops; meanwhile a Service is deleted, one changes
// type, and the records of two Services are lost while both show the
// same address (as after restoring an old etcd). Another replica takes
// over: it releases what is gone, keeps every address that still has its
// record, gives the contested address to the older Service and a new one
// to the newer, and assigns nothing twice.
func TestLoadBalancerIPAMRestart(t *testing.T) {
	c := newLBCluster(t, map[string]string{"lb": "198.19.0.0/28"})
	ctx := context.Background()
	const ns = "default"
	stop := startControllers(t, testConfig("a"), c.ctrl, c.store)
	names := []string{"s0", "s1", "s2", "s3", "s4", "s5"}
	before := map[string]string{}
	for _, n := range names {
		if n == "s5" {
			time.Sleep(1100 * time.Millisecond) // s5 newer than s4 (timestamps have whole seconds)
		}
		c.create(t, lbService(ns, n))
	}
	for _, n := range names {
		before[n] = c.waitAnyIngress(t, ns, n, 1)[0]
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	if err := c.kc.CoreV1().Services(ns).Delete(ctx, "s0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s1, err := c.kc.CoreV1().Services(ns).Get(ctx, "s1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s1.Spec.Type = corev1.ServiceTypeClusterIP
	if _, err := c.kc.CoreV1().Services(ns).Update(ctx, s1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// s4 and s5 lose their records; s5 (newer) claims s4's address.
	for _, n := range []string{"s4", "s5"} {
		if err := c.alloc.ReleaseLB(ctx, ipam.LBService{Namespace: ns, Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	s5, err := c.kc.CoreV1().Services(ns).Get(ctx, "s5", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s5.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: before["s4"]}}
	if _, err := c.kc.CoreV1().Services(ns).UpdateStatus(ctx, s5, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	startControllers(t, testConfig("b"), c.ctrl, c.store)
	eventually(t, "s0's and s1's addresses released", 20*time.Second, func() (bool, string) {
		allocs, err := c.alloc.LBAllocations(ctx)
		if err != nil {
			return false, err.Error()
		}
		var held []string
		for _, a := range allocs {
			held = append(held, a.Service.Name)
		}
		return !slices.Contains(held, "s0") && !slices.Contains(held, "s1"), fmt.Sprint(held)
	})
	c.waitIngress(t, ns, "s1")
	for _, n := range []string{"s2", "s3", "s4"} {
		c.waitIngress(t, ns, n, before[n])
	}
	got := c.waitAnyIngress(t, ns, "s5", 1)[0]
	eventually(t, "s5 moved off s4's address", 20*time.Second, func() (bool, string) {
		ips, err := c.ingress(ns, "s5")
		if err != nil || len(ips) != 1 {
			return false, fmt.Sprint(ips, err)
		}
		got = ips[0]
		return got != before["s4"], got
	})
	c.waitEvent(t, ns, "s5", kube.ReasonLBAssigned, got)
	c.consistent(t, ns)
	// The replacement is a new free address, not one of a live Service.
	for _, n := range []string{"s2", "s3", "s4"} {
		if before[n] == got {
			t.Errorf("s5 got %s, %s's address", got, n)
		}
	}
	if a := netip.MustParseAddr(got); !netip.MustParsePrefix("198.19.0.0/28").Contains(a) {
		t.Errorf("s5 got %s, outside the pool", got)
	}

	// No IPv6 LoadBalancer pool here: PreferDualStack takes IPv4 only,
	// RequireDualStack is refused with an event.
	c.create(t, lbService(ns, "prefer", dualStack(corev1.IPFamilyPolicyPreferDualStack)))
	if ips := c.waitAnyIngress(t, ns, "prefer", 1); !netip.MustParseAddr(ips[0]).Is4() {
		t.Errorf("PreferDualStack got %v", ips)
	}
	c.create(t, lbService(ns, "require", dualStack(corev1.IPFamilyPolicyRequireDualStack)))
	c.waitEvent(t, ns, "require", kube.ReasonLBFailed, "no enabled IPv6 LoadBalancer pool")
	// A new pool wakes the Services waiting for one.
	if _, err := c.alloc.CreatePool(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "lb6"},
		Spec: api.IPPoolSpec{CIDR: "fd00:198:19::/120", AllowedUses: []api.IPPoolUse{api.UseLoadBalancer}}}); err != nil {
		t.Fatal(err)
	}
	if ips := c.waitAnyIngress(t, ns, "require", 2); ips[1] != "fd00:198:19::" {
		t.Errorf("RequireDualStack after the IPv6 pool was created: %v", ips)
	}
	c.consistent(t, ns)
}

// Two controllers that both believe they lead (each holds a Lease of its
// own, as an old leader that has not noticed the new one): both assign,
// and the etcd transactions alone keep every address with one Service,
// one address per Service, and status and records in agreement.
func TestLoadBalancerIPAMTwoLeaders(t *testing.T) {
	c := newLBCluster(t, map[string]string{"lb": "198.19.0.0/28"})
	ctx := context.Background()
	const ns = "default"
	other := testConfig("b")
	other.LeaseName = "tabby-kube-controllers-split"
	startControllers(t, testConfig("a"), c.ctrl, c.store)
	startControllers(t, other, c.kc, c.store) // its own Lease: the admin may take it
	const n = 24
	for i := range n {
		c.create(t, lbService(ns, fmt.Sprintf("s%02d", i)))
	}
	settled := func(want int) func() (bool, string) {
		return func() (bool, string) {
			allocs, err := c.alloc.LBAllocations(ctx)
			if err != nil {
				return false, err.Error()
			}
			svcs, err := c.kc.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			shown := 0
			for _, s := range svcs.Items {
				shown += len(s.Status.LoadBalancer.Ingress)
			}
			return len(allocs) == want && shown == want, fmt.Sprintf("%d recorded, %d shown", len(allocs), shown)
		}
	}
	eventually(t, "the pool's 16 addresses given", 30*time.Second, settled(16))
	for i := range 5 {
		if err := c.kc.CoreV1().Services(ns).Delete(ctx, fmt.Sprintf("s%02d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the 5 freed addresses given again", 30*time.Second, settled(16))
	time.Sleep(time.Second) // let a late writer show itself
	c.consistent(t, ns)
	evs, err := c.kc.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + kube.ReasonLBFailed})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) == 0 {
		t.Error("no exhaustion event for the Services left without an address")
	}
}
