package agent

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

func putJSON(t *testing.T, s *datastore.Store, key string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutKV(context.Background(), key, b, 0); err != nil {
		t.Fatal(err)
	}
}

func TestAddTakesLabelsAndAddressFromPodRecord(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	pool2 := &api.IPPool{Metadata: api.ObjectMeta{Name: "pool2"}, Spec: api.IPPoolSpec{CIDR: "10.245.0.0/24", BlockSize: 28}}
	if _, err := e.store.Create(ctx, pool2); err != nil {
		t.Fatal(err)
	}
	putJSON(t, e.store, datastore.KubeMarkerKey, api.KubeMarker{Identity: "test"})
	// The view must know pool2 before ADD resolves the annotation.
	if err := e.view.WaitRevision(ctx, storeRev(t, e.store)); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name     string
		pod, ns  map[string]string // annotations
		wantAddr string            // prefix of the address
		wantErr  string
	}{
		{name: "namespace pool", ns: map[string]string{"cni.projectcalico.org/ipv4pools": `["pool2"]`}, wantAddr: "10.245.0."},
		{name: "pod pool wins", pod: map[string]string{"tabby.dev/ipv4pools": `["10.244.0.0/24"]`},
			ns: map[string]string{"cni.projectcalico.org/ipv4pools": `["pool2"]`}, wantAddr: "10.244.0."},
		{name: "specific address", pod: map[string]string{"cni.projectcalico.org/ipAddrs": `["10.244.0.77"]`}, wantAddr: "10.244.0.77"},
		{name: "unknown pool", pod: map[string]string{"cni.projectcalico.org/ipv4pools": `["nope"]`}, wantErr: `unknown IP pool "nope"`},
		{name: "no IPAM refused", pod: map[string]string{"cni.projectcalico.org/ipAddrsNoIpam": `["10.9.9.9"]`}, wantErr: "not allowed by the network configuration"},
		{name: "both address kinds", pod: map[string]string{"cni.projectcalico.org/ipAddrs": `["10.244.0.78"]`,
			"cni.projectcalico.org/ipAddrsNoIpam": `["10.9.9.9"]`}, wantErr: "both set"},
	}
	ports := []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := "c" + string(rune('a'+i))
			req, conf, args := addReq(id)
			ns := "ns" + id
			args.PodNamespace = ns
			putJSON(t, e.store, datastore.KubeNamespaceKey(ns), api.KubeNamespace{Name: ns, Annotations: tt.ns,
				Labels: map[string]string{"team": "blue"}})
			putJSON(t, e.store, datastore.KubePodKey(ns, args.PodName), api.KubePod{Namespace: ns, Name: args.PodName,
				Labels: map[string]string{"role": "db"}, ServiceAccount: "sa1", Annotations: tt.pod, Ports: ports})
			res, err := e.h.Add(ctx, req, conf, args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error()+detail(err), tt.wantErr) {
					t.Fatalf("ADD error = %v (%s), want %q", err, detail(err), tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ADD: %v (%s)", err, detail(err))
			}
			if got := res.IPs[0].Address.IP.String(); !strings.HasPrefix(got, tt.wantAddr) {
				t.Errorf("address %s, want %s…", got, tt.wantAddr)
			}
			wep, err := datastore.GetAs[*api.WorkloadEndpoint](ctx, e.store, api.KindWorkloadEndpoint, ns, "node1-k8s-"+args.PodName+"-eth0")
			if err != nil {
				t.Fatal(err)
			}
			if wep.Metadata.Labels["role"] != "db" || wep.Metadata.Labels["app"] != "" || wep.Metadata.Labels[api.LabelServiceAccount] != "sa1" {
				t.Errorf("endpoint labels %v, want the pod record's", wep.Metadata.Labels)
			}
			if api.Origin(wep) != api.OriginKubernetes {
				t.Errorf("endpoint origin %q, want kubernetes", api.Origin(wep))
			}
			// Namespace labels and named ports too, from the first write:
			// the endpoint's policy is programmed before ADD returns, so
			// waiting for the controllers to add them would run the pod
			// under the wrong policy (namespaceSelector, named ports).
			if diff := cmp.Diff(map[string]string{"team": "blue"}, wep.Spec.NamespaceLabels); diff != "" {
				t.Errorf("endpoint namespace labels (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(ports, wep.Spec.Ports); diff != "" {
				t.Errorf("endpoint named ports (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAddWaitsForPodRecordThenFails(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	// Outside Kubernetes (no marker) nothing is required.
	req, conf, args := addReq("free")
	if _, err := e.h.Add(ctx, req, conf, args); err != nil {
		t.Fatalf("ADD without controllers: %v", err)
	}
	if eps := e.endpoints(t); len(eps) != 1 || api.Origin(eps[0]) != api.OriginAgent {
		t.Errorf("endpoint of an ADD outside Kubernetes: %v, want one of origin agent", eps)
	}
	putJSON(t, e.store, datastore.KubeMarkerKey, api.KubeMarker{Identity: "test"})

	req, conf, args = addReq("missing")
	start := time.Now()
	_, err := e.h.Add(ctx, req, conf, args)
	if err == nil || !strings.Contains(err.Error(), "ns1/pod-missing") {
		t.Fatalf("ADD of an unrecorded pod: %v, want an error naming the pod", err)
	}
	if d := time.Since(start); d < kubePodWait || d > kubePodWait+3*time.Second {
		t.Errorf("ADD failed after %s, want about %s", d, kubePodWait)
	}

	// A record that arrives during the wait is used.
	req, conf, args = addReq("late")
	go func() {
		time.Sleep(300 * time.Millisecond)
		b, _ := json.Marshal(api.KubePod{Namespace: "ns1", Name: "pod-late", Labels: map[string]string{"late": "yes"}})
		_, _ = e.store.PutKV(ctx, datastore.KubePodKey("ns1", "pod-late"), b, 0)
	}()
	if _, err := e.h.Add(ctx, req, conf, args); err != nil {
		t.Fatalf("ADD with a late record: %v", err)
	}
}

func detail(err error) string {
	if te, ok := err.(*types.Error); ok {
		return te.Details
	}
	return ""
}

func storeRev(t *testing.T, s *datastore.Store) int64 {
	t.Helper()
	_, rev, err := s.ListKV(context.Background(), datastore.KubeMarkerKey)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// A pod's records (its own, its namespace's and the controllers' marker)
// take one read: inside Kubernetes and outside it.
func TestPodRecordsInOneRead(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	// The read's revision is at least the last write's: the policy gate
	// waits for the view to reach it.
	lastWrite := storeRev(t, e.store)
	reads := func(ns, name string) (*api.KubePod, *api.KubeNamespace, int64) {
		t.Helper()
		before := e.store.Requests()
		pod, nsRec, rev, err := e.h.readPodRecords(ctx, ns, name)
		if err != nil {
			t.Fatalf("readPodRecords(%s/%s): %v", ns, name, err)
		}
		if rev < lastWrite {
			t.Errorf("readPodRecords(%s/%s) read at revision %d, before the last write's %d", ns, name, rev, lastWrite)
		}
		after := e.store.Requests()
		if after.List != before.List || after.Txn != before.Txn || after.Put != before.Put {
			t.Errorf("readPodRecords(%s/%s): requests %+v → %+v, want reads only", ns, name, before, after)
		}
		return pod, nsRec, after.Get - before.Get
	}
	if pod, nsRec, n := reads("ns1", "pod-a"); pod != nil || nsRec != nil || n != 1 {
		t.Errorf("outside Kubernetes: %v, %v in %d reads, want nothing in 1", pod, nsRec, n)
	}
	putJSON(t, e.store, datastore.KubeMarkerKey, api.KubeMarker{Identity: "test"})
	putJSON(t, e.store, datastore.KubePodKey("ns1", "pod-a"), api.KubePod{Namespace: "ns1", Name: "pod-a", Labels: map[string]string{"app": "a"}})
	putJSON(t, e.store, datastore.KubeNamespaceKey("ns1"), api.KubeNamespace{Name: "ns1", Labels: map[string]string{"team": "x"}})
	lastWrite = storeRev(t, e.store)
	pod, nsRec, n := reads("ns1", "pod-a")
	if pod == nil || pod.Labels["app"] != "a" || nsRec == nil || nsRec.Labels["team"] != "x" || n != 1 {
		t.Errorf("inside Kubernetes: %+v, %+v in %d reads, want the pod's and the namespace's records in 1", pod, nsRec, n)
	}
	// A namespace without a record reads as an empty one.
	putJSON(t, e.store, datastore.KubePodKey("ns2", "pod-b"), api.KubePod{Namespace: "ns2", Name: "pod-b"})
	if pod, nsRec, _ := reads("ns2", "pod-b"); pod == nil || nsRec == nil || len(nsRec.Labels) != 0 {
		t.Errorf("a namespace without a record: %+v, %+v, want the pod and an empty namespace", pod, nsRec)
	}
}
