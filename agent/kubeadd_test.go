package agent

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/kube"
	"github.com/tabbynet/tabby/kube/kubetest"
)

// The address-selection annotations end to end: pods and namespaces are
// created through a real kube-apiserver, tabby-kube-controllers write their
// records into the agent's etcd, and the agent's CNI handler serves the
// ADD (with a fake dataplane). Only package kube and its tests talk to the
// API server; the agent reads etcd only.
func TestKubeAddressAnnotationsThroughAPIServer(t *testing.T) {
	srv := kubetest.Start(t)
	ctx := context.Background()
	e := newHandlerEnv(t) // pool1: 10.244.0.0/24, node1
	mustCreate(t, e.store, &api.IPPool{Metadata: api.ObjectMeta{Name: "pool2"}, Spec: api.IPPoolSpec{CIDR: "10.245.0.0/24", BlockSize: 28}})
	kc := srv.Client

	cfg := kube.Default()
	cfg.Identity = "agent-test"
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 4*time.Second, 3*time.Second, 500*time.Millisecond
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cfg.LeaseNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- kube.RunWith(cctx, cfg, kc, e.store, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controllers: %v", err)
		}
	})

	// Namespace "blue" asks for pool2 with Calico's key; "plain" asks nothing.
	for name, ann := range map[string]map[string]string{
		"blue":  {"cni.projectcalico.org/ipv4pools": `["pool2"]`},
		"plain": nil,
	} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": name}, Annotations: ann}}
		if _, err := kc.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	tests := []struct {
		name, ns    string
		ann         map[string]string // the pod's annotations
		allowNoIPAM bool              // feature_control.ip_addrs_no_ipam
		wantAddr    string            // the address, or its prefix ending in "."
		wantErr     string
		noIPAM      bool // the address bypasses IPAM
	}{
		{name: "namespace-pool", ns: "blue", wantAddr: "10.245.0."},
		{name: "pod-pool-wins", ns: "blue", ann: map[string]string{"tabby.dev/ipv4pools": `["pool1"]`}, wantAddr: "10.244.0."},
		{name: "pod-pool-calico", ns: "plain", ann: map[string]string{"cni.projectcalico.org/ipv4pools": `["10.245.0.0/24"]`}, wantAddr: "10.245.0."},
		{name: "unknown-pool", ns: "blue", ann: map[string]string{"cni.projectcalico.org/ipv4pools": `["nope"]`}, wantErr: `unknown IP pool "nope"`},
		{name: "ipaddrs-calico", ns: "plain", ann: map[string]string{"cni.projectcalico.org/ipAddrs": `["10.244.0.77"]`}, wantAddr: "10.244.0.77"},
		{name: "ipaddrs-tabby", ns: "blue", ann: map[string]string{"tabby.dev/ipAddrs": `["10.245.0.78"]`}, wantAddr: "10.245.0.78"},
		{name: "ipaddrs-outside-pools", ns: "plain", ann: map[string]string{"tabby.dev/ipAddrs": `["10.244.201.1"]`}, wantErr: "10.244.201.1"},
		{name: "noipam-not-allowed", ns: "plain", ann: map[string]string{"cni.projectcalico.org/ipAddrsNoIpam": `["10.244.200.9"]`},
			wantErr: "not allowed by the network configuration"},
		{name: "noipam-allowed", ns: "plain", ann: map[string]string{"cni.projectcalico.org/ipAddrsNoIpam": `["10.244.200.9"]`},
			allowNoIPAM: true, wantAddr: "10.244.200.9", noIPAM: true},
		{name: "noipam-tabby-key", ns: "blue", ann: map[string]string{"tabby.dev/ipAddrsNoIpam": `["10.244.200.10"]`},
			allowNoIPAM: true, wantAddr: "10.244.200.10", noIPAM: true},
		{name: "noipam-in-a-pool", ns: "plain", ann: map[string]string{"cni.projectcalico.org/ipAddrsNoIpam": `["10.244.0.90"]`},
			allowNoIPAM: true, wantErr: "is in IP pool pool1"},
		{name: "both-address-kinds", ns: "plain", ann: map[string]string{"cni.projectcalico.org/ipAddrs": `["10.244.0.79"]`,
			"tabby.dev/ipAddrsNoIpam": `["10.244.200.11"]`}, allowNoIPAM: true, wantErr: "both set"},
	}
	for _, tt := range tests {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: tt.ns, Name: tt.name, Labels: map[string]string{"case": tt.name}, Annotations: tt.ann},
			Spec: corev1.PodSpec{NodeName: "node1", ServiceAccountName: "sa-" + tt.ns,
				Containers: []corev1.Container{{Name: "c", Image: "none"}}},
		}
		if _, err := kc.CoreV1().Pods(tt.ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating pod %s: %v", tt.name, err)
		}
	}
	// ADD waits (bounded) for the pod's record, not for the namespace's:
	// wait for every record here, so that a loaded machine cannot turn a
	// slow controller into a wrong answer.
	keys := []string{datastore.KubeNamespaceKey("blue"), datastore.KubeNamespaceKey("plain")}
	for _, tt := range tests {
		keys = append(keys, datastore.KubePodKey(tt.ns, tt.name))
	}
	waitRecords(t, e.store, keys)
	// Bounded: a view that never reaches etcd's revision fails here, with
	// where it stopped, rather than timing the package out (seen once).
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if rev := storeRev(t, e.store); e.view.WaitRevision(wctx, rev) != nil {
		t.Fatalf("the view did not reach etcd's revision %d in 30 s: at %d, stats %+v", rev, e.view.Revision(), e.view.Stats())
	}

	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, conf, args := addReq("k" + string(rune('a'+i)))
			args.PodNamespace, args.PodName, args.Labels = tt.ns, tt.name, nil
			conf.FeatureControl.IPAddrsNoIPAM = tt.allowNoIPAM
			res, err := e.h.Add(ctx, req, conf, args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error()+detail(err), tt.wantErr) {
					t.Fatalf("ADD error = %v (%s), want %q", err, detail(err), tt.wantErr)
				}
				if eps := endpointsOf(t, e, tt.ns, tt.name); len(eps) != 0 {
					t.Errorf("failed ADD left endpoint %s", eps[0].Metadata.Name)
				}
				return
			}
			if err != nil {
				t.Fatalf("ADD: %v (%s)", err, detail(err))
			}
			addr, _ := netip.AddrFromSlice(res.IPs[0].Address.IP)
			addr = addr.Unmap()
			if got := addr.String(); got != tt.wantAddr && !(strings.HasSuffix(tt.wantAddr, ".") && strings.HasPrefix(got, tt.wantAddr)) {
				t.Errorf("address %s, want %s", got, tt.wantAddr)
			}
			eps := endpointsOf(t, e, tt.ns, tt.name)
			if len(eps) != 1 {
				t.Fatalf("%d endpoints for the pod", len(eps))
			}
			wep := eps[0]
			if wep.Metadata.Labels["case"] != tt.name || wep.Metadata.Labels[api.LabelServiceAccount] != "sa-"+tt.ns {
				t.Errorf("endpoint labels %v, want the pod's and its service account", wep.Metadata.Labels)
			}
			if api.Origin(wep) != api.OriginKubernetes {
				t.Errorf("endpoint origin %q, want kubernetes", api.Origin(wep))
			}
			if wep.Spec.NamespaceLabels["team"] != tt.ns {
				t.Errorf("endpoint namespace labels %v at ADD, want team=%s", wep.Spec.NamespaceLabels, tt.ns)
			}
			held, err := e.h.ipam.AddressesByHandle(ctx, ipamHandle(conf.Name, req.ContainerID))
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tt.noIPAM && (len(held) != 0 || wep.Spec.IPAMHandle != "" || wep.Metadata.Annotations[api.AnnotationNoIPAM] != "true"):
				t.Errorf("address without IPAM: IPAM holds %v, endpoint handle %q, annotations %v", held, wep.Spec.IPAMHandle, wep.Metadata.Annotations)
			case !tt.noIPAM && (len(held) != 1 || held[0] != addr):
				t.Errorf("IPAM holds %v for the pod, want [%s]", held, addr)
			}
			// A repeated ADD returns the same address.
			again, err := e.h.Add(ctx, req, conf, args)
			if err != nil || !again.IPs[0].Address.IP.Equal(res.IPs[0].Address.IP) {
				t.Errorf("repeated ADD: %v, %v", again, err)
			}
			rep, err := e.alloc.Check(ctx)
			if err != nil || !rep.OK() {
				t.Errorf("ipam check with the pod: %+v %v", rep, err)
			}
			if err := e.h.Del(ctx, req, conf, args); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if eps := endpointsOf(t, e, tt.ns, tt.name); len(eps) != 0 {
				t.Errorf("DEL left endpoint %s", eps[0].Metadata.Name)
			}
		})
	}
	rep, err := e.alloc.Check(ctx)
	if err != nil || !rep.OK() || len(rep.Leaks) != 0 {
		t.Errorf("ipam check at the end: %+v %v", rep, err)
	}
}

func endpointsOf(t *testing.T, e *handlerEnv, ns, pod string) []*api.WorkloadEndpoint {
	t.Helper()
	var out []*api.WorkloadEndpoint
	for _, w := range e.endpoints(t) {
		if w.Metadata.Namespace == ns && w.Spec.Pod == pod {
			out = append(out, w)
		}
	}
	return out
}

// waitRecords polls until the controllers have written every key.
func waitRecords(t *testing.T, s *datastore.Store, keys []string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, k := range keys {
		for {
			_, err := s.GetKV(context.Background(), k)
			if err == nil {
				break
			}
			if !errors.Is(err, datastore.ErrNotFound) || time.Now().After(deadline) {
				t.Fatalf("record %s: %v", k, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
