package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/api"
)

// Containers outside Kubernetes are told apart by their whole ID: two IDs
// that share 12 characters are two workloads with two endpoints, and a DEL
// of one leaves the other alone.
func TestCNIEndpointNamesUseTheFullContainerID(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	ids := []string{
		"0123456789ab0000000000000000000000000000000000000000000000000001",
		"0123456789ab0000000000000000000000000000000000000000000000000002",
		"Upper_Case.ID-1", // valid for CNI, not a DNS name
		"upper-case.id-1", // what the one above lowercases to
	}
	for _, id := range ids {
		req, conf, args := addReq(id)
		args.PodName, args.PodNamespace = "", ""
		if _, err := e.h.Add(ctx, req, conf, args); err != nil {
			t.Fatalf("ADD %s: %v", id, err)
		}
	}
	weps := e.endpoints(t)
	if len(weps) != len(ids) {
		t.Fatalf("%d endpoints for %d containers", len(weps), len(ids))
	}
	names := map[string]string{}
	for _, w := range weps {
		if err := w.Validate(); err != nil {
			t.Errorf("endpoint %s: %v", w.Metadata.Name, err)
		}
		if other, dup := names[w.Metadata.Name]; dup {
			t.Errorf("containers %s and %s share endpoint %s", other, w.Spec.ContainerID, w.Metadata.Name)
		}
		names[w.Metadata.Name] = w.Spec.ContainerID
	}
	if _, ok := names["node1-cni-"+ids[0]+"-eth0"]; !ok {
		t.Errorf("no endpoint named by the full ID of %s: %v", ids[0], names)
	}

	req, conf, args := addReq(ids[0])
	args.PodName, args.PodNamespace = "", ""
	if err := e.h.Del(ctx, req, conf, args); err != nil {
		t.Fatal(err)
	}
	weps = e.endpoints(t)
	if len(weps) != len(ids)-1 {
		t.Fatalf("%d endpoints after one DEL, want %d", len(weps), len(ids)-1)
	}
	for _, w := range weps {
		if w.Spec.ContainerID == ids[0] {
			t.Errorf("the deleted container's endpoint is left")
		}
	}
	if n := len(e.wl.Specs()); n != len(ids)-1 {
		t.Errorf("%d links after one DEL, want %d", n, len(ids)-1)
	}
	addrs, _ := e.h.ipam.AddressesByHandle(ctx, ipamHandle(conf.Name, ids[1]))
	if len(addrs) != 1 {
		t.Errorf("the other container holds %v", addrs)
	}
}

// An endpoint written by an agent that named it by 12 characters of the
// container ID is removed by the DEL of its container, and only by it.
func TestCNIDelFindsLegacyEndpointName(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	id := "0123456789abcdef0000000000000000"
	req, conf, args := addReq(id)
	args.PodName, args.PodNamespace = "", ""
	w := newWorkloadID(req, args)
	legacy, _ := w.legacyEndpointName("node1")
	wep := buildEndpoint("node1", w, ipamHandle(conf.Name, id), nil, w.hostIfName(), "", nil)
	wep.Metadata.Name = legacy
	wep.Spec.IPNetworks = []string{"10.244.0.9/32"}
	mustCreate(t, e.store, wep)

	other, _, otherArgs := addReq("0123456789abffff0000000000000000")
	otherArgs.PodName, otherArgs.PodNamespace = "", ""
	if err := e.h.Del(ctx, other, conf, otherArgs); err != nil {
		t.Fatal(err)
	}
	if n := len(e.endpoints(t)); n != 1 {
		t.Fatalf("another container's DEL removed the legacy endpoint")
	}
	if err := e.h.Del(ctx, req, conf, args); err != nil {
		t.Fatal(err)
	}
	if n := len(e.endpoints(t)); n != 0 {
		t.Errorf("legacy endpoint left after its container's DEL")
	}
}

// Two workloads whose host interface names collide: the second ADD fails
// with a clear error and leaves the first one's interface alone.
func TestCNIHostInterfaceCollisionRefused(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	req, conf, args := addReq("c1")
	w := newWorkloadID(req, args)
	// Another pod already on the interface name c1 would get.
	squatter := testWEP("node1", "ns1", "someone-else", w.hostIfName(), "10.244.0.200", nil)
	obj, err := e.store.Create(ctx, squatter)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.view.WaitRevision(ctx, mustRev(t, obj)); err != nil {
		t.Fatal(err)
	}
	_, err = e.h.Add(ctx, req, conf, args)
	if err == nil || !strings.Contains(err.Error(), "collision") || !strings.Contains(err.Error(), squatter.Metadata.Name) {
		t.Fatalf("ADD over a colliding interface name: %v", err)
	}
	if len(e.wl.Specs()) != 0 {
		t.Errorf("links made: %v", e.wl.Specs())
	}
	if addrs, _ := e.h.ipam.AddressesByHandle(ctx, ipamHandle(conf.Name, "c1")); len(addrs) != 0 {
		t.Errorf("address left: %v", addrs)
	}
	// A new sandbox of the same pod is not a collision.
	mine := testWEP("node1", "ns1", "pod-c1", w.hostIfName(), "10.244.0.201", nil)
	if err := e.store.Delete(ctx, api.KindWorkloadEndpoint, "ns1", squatter.Metadata.Name, ""); err != nil {
		t.Fatal(err)
	}
	obj, err = e.store.Create(ctx, mine)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.view.WaitRevision(ctx, mustRev(t, obj)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.h.Add(ctx, req, conf, args); err != nil {
		t.Errorf("ADD of a new sandbox of the pod: %v", err)
	}
}
