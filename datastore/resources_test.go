package datastore_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

func pool(name, cidr string) *api.IPPool {
	return &api.IPPool{Metadata: api.ObjectMeta{Name: name}, Spec: api.IPPoolSpec{CIDR: cidr}}
}

func wep(ns, name, node string) *api.WorkloadEndpoint {
	return &api.WorkloadEndpoint{
		Metadata: api.ObjectMeta{Namespace: ns, Name: name},
		Spec: api.WorkloadEndpointSpec{
			Node: node, ContainerID: "c-" + name, InterfaceName: "eth0",
			IPNetworks: []string{"10.244.0.5/32"},
		},
	}
}

func TestResourceKey(t *testing.T) {
	tests := []struct {
		kind, ns, name string
		want           string
		wantErr        string
	}{
		{kind: "IPPool", name: "p1", want: "resources/ippools/p1"},
		{kind: "pool", name: "p1", want: "resources/ippools/p1"},
		{kind: "WorkloadEndpoint", ns: "default", name: "w1", want: "resources/workloadendpoints/default/w1"},
		{kind: "Node", name: "n1", want: "resources/nodes/n1"},
		{kind: "WorkloadEndpoint", name: "w1", wantErr: "namespace is required"},
		{kind: "Node", ns: "default", name: "n1", wantErr: "not namespaced"},
		{kind: "Node", name: "a/b", wantErr: "must not contain /"},
		{kind: "Node", name: "", wantErr: "name is required"},
		{kind: "Pod", name: "x", wantErr: "unknown kind"},
	}
	for _, tt := range tests {
		got, err := datastore.ResourceKey(tt.kind, tt.ns, tt.name)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ResourceKey(%q, %q, %q) error = %v, want one containing %q", tt.kind, tt.ns, tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ResourceKey(%q, %q, %q) = %q, %v; want %q", tt.kind, tt.ns, tt.name, got, err, tt.want)
		}
		kind, ns, name, ok := datastore.ParseResourceKey(got)
		info, _ := api.LookupKind(tt.kind)
		if !ok || kind != info.Kind || ns != tt.ns || name != tt.name {
			t.Errorf("ParseResourceKey(%q) = %q, %q, %q, %v", got, kind, ns, name, ok)
		}
	}
	for _, bad := range []string{"ipam/blocks/x", "resources/ippools", "resources/pool/x", "resources/workloadendpoints/w1", "resources/ippools/a/b"} {
		if _, _, _, ok := datastore.ParseResourceKey(bad); ok {
			t.Errorf("ParseResourceKey(%q) ok, want not a resource key", bad)
		}
	}
}

func TestTypedCreateGetUpdateDelete(t *testing.T) {
	ctx := context.Background()
	s := storetest.New(t)

	in := pool("p1", "10.244.0.0/16")
	created, err := s.Create(ctx, in)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if in.Metadata.UID != "" || in.Metadata.ResourceVersion != "" {
		t.Errorf("Create modified the caller's object: %+v", in.Metadata)
	}
	p := created.(*api.IPPool)
	if p.Spec.BlockSize != api.DefaultBlockSize || p.Kind != api.KindIPPool || p.APIVersion != api.APIVersion {
		t.Errorf("Create did not default: %+v", p)
	}
	if len(p.Metadata.UID) != 36 || p.Metadata.CreationTimestamp == nil {
		t.Errorf("Create did not set uid and creationTimestamp: %+v", p.Metadata)
	}
	kv, err := s.GetKV(ctx, "resources/ippools/p1")
	if err != nil {
		t.Fatal(err)
	}
	if p.Metadata.ResourceVersion != strconv.FormatInt(kv.ModRevision, 10) {
		t.Errorf("resourceVersion %q, ModRevision %d", p.Metadata.ResourceVersion, kv.ModRevision)
	}
	if strings.Contains(string(kv.Value), "resourceVersion") {
		t.Errorf("stored value holds resourceVersion: %s", kv.Value)
	}
	var stored map[string]any
	if err := json.Unmarshal(kv.Value, &stored); err != nil {
		t.Errorf("stored value is not JSON: %v", err)
	}

	if _, err := s.Create(ctx, pool("p1", "10.245.0.0/16")); !errors.Is(err, datastore.ErrExists) {
		t.Errorf("Create twice: %v, want ErrExists", err)
	}
	if _, err := s.Create(ctx, pool("bad", "not-a-cidr")); err == nil || !strings.Contains(err.Error(), "spec.cidr") {
		t.Errorf("Create invalid: %v, want a validation error naming spec.cidr", err)
	}

	got, err := s.Get(ctx, "ippools", "", "p1")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if diff := cmp.Diff(created, got); diff != "" {
		t.Errorf("Get (-created +got):\n%s", diff)
	}
	if _, err := s.Get(ctx, "IPPool", "", "missing"); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("Get missing: %v, want ErrNotFound", err)
	}

	// Update with the current version wins; a second update from the same
	// (now stale) version conflicts. uid and creationTimestamp are kept.
	upd := got.(*api.IPPool)
	upd.Spec.NATOutgoing = true
	upd.Metadata.UID = ""
	updated, err := s.Update(ctx, upd)
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if updated.GetMeta().UID != p.Metadata.UID || !updated.GetMeta().CreationTimestamp.Equal(*p.Metadata.CreationTimestamp) {
		t.Errorf("Update changed uid or creationTimestamp: %+v", updated.GetMeta())
	}
	if updated.GetMeta().ResourceVersion == p.Metadata.ResourceVersion {
		t.Errorf("Update kept resourceVersion %s", p.Metadata.ResourceVersion)
	}
	stale := got.(*api.IPPool)
	stale.Spec.Disabled = true
	if _, err := s.Update(ctx, stale); !errors.Is(err, datastore.ErrConflict) {
		t.Errorf("Update stale: %v, want ErrConflict", err)
	}
	noRV := pool("p1", "10.244.0.0/16")
	if _, err := s.Update(ctx, noRV); err == nil || errors.Is(err, datastore.ErrConflict) {
		t.Errorf("Update without resourceVersion: %v, want an error asking for it", err)
	}
	missing := pool("p2", "10.246.0.0/16")
	missing.Metadata.ResourceVersion = "5"
	if _, err := s.Update(ctx, missing); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("Update missing: %v, want ErrNotFound", err)
	}

	if err := s.Delete(ctx, "IPPool", "", "p1", p.Metadata.ResourceVersion); !errors.Is(err, datastore.ErrConflict) {
		t.Errorf("Delete stale: %v, want ErrConflict", err)
	}
	if err := s.Delete(ctx, "IPPool", "", "p1", updated.GetMeta().ResourceVersion); err != nil {
		t.Errorf("Delete: %v", err)
	}
	if err := s.Delete(ctx, "IPPool", "", "p1", ""); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("Delete missing: %v, want ErrNotFound", err)
	}
}

func TestTypedListNamespaces(t *testing.T) {
	ctx := context.Background()
	s := storetest.New(t)
	for _, w := range []*api.WorkloadEndpoint{wep("ns2", "a", "n1"), wep("ns1", "b", "n1"), wep("ns1", "a", "n2")} {
		if _, err := s.Create(ctx, w); err != nil {
			t.Fatalf("Create %s/%s: %v", w.Metadata.Namespace, w.Metadata.Name, err)
		}
	}
	names := func(objs []api.Object) []string {
		var out []string
		for _, o := range objs {
			out = append(out, o.GetMeta().Namespace+"/"+o.GetMeta().Name)
		}
		return out
	}
	all, rev, err := s.List(ctx, "wep", "")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"ns1/a", "ns1/b", "ns2/a"}, names(all)); diff != "" {
		t.Errorf("List all (-want +got):\n%s", diff)
	}
	if rev == 0 {
		t.Error("List revision 0")
	}
	ns1, _, err := s.List(ctx, "WorkloadEndpoint", "ns1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"ns1/a", "ns1/b"}, names(ns1)); diff != "" {
		t.Errorf("List ns1 (-want +got):\n%s", diff)
	}
	if _, _, err := s.List(ctx, "Node", "ns1"); err == nil {
		t.Error("List of a cluster-scoped kind in a namespace succeeded")
	}
	// Watch events decode with DecodeResource.
	ch := s.Watch(ctx, datastore.ResourcesPrefix+"workloadendpoints/", rev+1)
	if err := s.Delete(ctx, "wep", "ns2", "a", ""); err != nil {
		t.Fatal(err)
	}
	e := next(t, ch)
	if e.Type != datastore.EventDelete || e.PrevKV == nil {
		t.Fatalf("event = %+v, want a delete with its previous value", e)
	}
	obj, err := datastore.DecodeResource(*e.PrevKV)
	if err != nil || obj.GetMeta().Name != "a" || obj.(*api.WorkloadEndpoint).Spec.Node != "n1" {
		t.Errorf("DecodeResource(prev) = %+v, %v", obj, err)
	}
}

func TestApplyConcurrent(t *testing.T) {
	ctx := context.Background()
	s := storetest.New(t)
	first, err := s.Apply(ctx, pool("p", "10.244.0.0/16"))
	if err != nil {
		t.Fatalf("Apply create: %v", err)
	}
	// Applying the same object writes nothing.
	again, err := s.Apply(ctx, pool("p", "10.244.0.0/16"))
	if err != nil || again.GetMeta().ResourceVersion != first.GetMeta().ResourceVersion {
		t.Errorf("Apply unchanged = %v, %v; want resourceVersion %s", again, err, first.GetMeta().ResourceVersion)
	}
	var wg sync.WaitGroup
	errs := make([]error, 10)
	for i := range errs {
		wg.Go(func() {
			p := pool("p", "10.244.0.0/16")
			p.Metadata.Labels = map[string]string{"writer": strconv.Itoa(i)}
			_, errs[i] = s.Apply(ctx, p)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Apply %d: %v", i, err)
		}
	}
	got, err := s.Get(ctx, "IPPool", "", "p")
	if err != nil {
		t.Fatal(err)
	}
	if got.GetMeta().UID != first.GetMeta().UID || got.GetMeta().Labels["writer"] == "" {
		t.Errorf("after concurrent Apply: %+v", got.GetMeta())
	}
}

func TestDecodeResourceAs(t *testing.T) {
	kv := datastore.KV{Key: "resources/ippools/p1", Value: []byte(`{"metadata":{"name":"p1"},"spec":{"cidr":"10.244.0.0/16"}}`), ModRevision: 7}
	p, err := datastore.DecodeResourceAs[*api.IPPool](kv)
	if err != nil {
		t.Fatalf("DecodeResourceAs[*api.IPPool]: %v", err)
	}
	if p.Spec.CIDR != "10.244.0.0/16" || p.Metadata.ResourceVersion != "7" || p.Kind != api.KindIPPool {
		t.Errorf("DecodeResourceAs[*api.IPPool] = %+v", p)
	}
	// A key of another kind is an error, not a panic.
	if n, err := datastore.DecodeResourceAs[*api.Node](kv); err == nil || !strings.Contains(err.Error(), "not a *api.Node") {
		t.Errorf("DecodeResourceAs[*api.Node] of a pool = %v, %v; want an error naming the types", n, err)
	}
	if _, err := datastore.DecodeResourceAs[*api.IPPool](datastore.KV{Key: "resources/ippools/p1", Value: []byte("{")}); err == nil {
		t.Error("DecodeResourceAs of bad JSON: no error")
	}
}
