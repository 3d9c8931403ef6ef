package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// TestServicesOutput: get services, node status and explain pod tell
// what becomes of each Service address from the records and the agents'
// published decisions.
func TestServicesOutput(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	c := NewClient(store, nil)
	for _, n := range []string{"n1", "n2"} {
		if _, err := store.Create(ctx, &api.Node{Metadata: api.ObjectMeta{Name: n}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: "198.18.0.1/24"}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Create(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16"}}); err != nil {
		t.Fatal(err)
	}
	web := &api.Service{Metadata: api.ObjectMeta{Namespace: "shop", Name: "web"}, Spec: api.ServiceSpec{Type: "LoadBalancer",
		ClusterIPs: []string{"10.96.0.10"}, LoadBalancerIPs: []string{"198.19.0.2"}, ExternalIPs: []string{"198.19.9.9"},
		ExternalTrafficPolicy: api.TrafficPolicyLocal, EndpointNodes: []string{"n2"}, EndpointAddresses: []string{"10.244.1.5"}}}
	if _, err := store.Create(ctx, web); err != nil {
		t.Fatal(err)
	}
	refused := api.ServiceAdvertisementStatus{Service: "shop/web", Kind: "externalIP", Prefix: "198.19.9.9/32", Refused: true,
		Reason: "198.19.9.9 is outside serviceExternalIPs [198.19.8.0/24]"}
	statuses := map[string][]api.ServiceAdvertisementStatus{
		"n1": {{Kind: "clusterIPRange", Prefix: "10.96.0.0/16", Advertised: true},
			{Service: "shop/db", Kind: "loadBalancerIP", Prefix: "198.19.0.4/32", Reason: "externalTrafficPolicy Local and no ready endpoint on this node"},
			{Service: "shop/web", Kind: "loadBalancerIP", Prefix: "198.19.0.2/32", Reason: "externalTrafficPolicy Local and no ready endpoint on this node"}, refused},
		"n2": {{Kind: "clusterIPRange", Prefix: "10.96.0.0/16", Advertised: true},
			{Service: "shop/web", Kind: "loadBalancerIP", Prefix: "198.19.0.2/32", Advertised: true}, refused},
	}
	for n, ss := range statuses {
		b, err := json.Marshal(api.AgentStatus{Node: n, Address: "198.18.0.1", Services: ss})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.PutKV(ctx, datastore.NodeStatusKey(n), b, 0); err != nil {
			t.Fatal(err)
		}
	}

	db := &api.Service{Metadata: api.ObjectMeta{Namespace: "shop", Name: "db"}, Spec: api.ServiceSpec{Type: "LoadBalancer",
		LoadBalancerIPs: []string{"198.19.0.4"}, ExternalTrafficPolicy: api.TrafficPolicyLocal, EndpointNodes: []string{"n3"}}}
	if _, err := store.Create(ctx, db); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := c.Get(ctx, &out, &errOut, GetOptions{Kind: "services", AllNamespaces: true, Output: OutputWide}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"shop", "web", "LoadBalancer", "Local",
		"10.96.0.10 in 10.96.0.0/16 from all 2 nodes; 198.19.0.2 from n2",
		"198.19.9.9: REFUSED: 198.19.9.9 is outside serviceExternalIPs [198.19.8.0/24] (on n1,n2)",
		"198.19.0.4: not advertised: externalTrafficPolicy Local and no ready endpoint on this node"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("get services -o wide:\n%s\nwant it to contain %q", out.String(), want)
		}
	}

	t.Logf("get services -o wide:\n%s", out.String())
	out.Reset()
	if err := c.NodeStatus(ctx, &out, NodeStatusOptions{Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Service advertisements",
		"10.96.0.0/16         clusterIPRange, advertised",
		"198.19.0.2/32        loadBalancerIP of shop/web, not advertised: externalTrafficPolicy Local and no ready endpoint on this node",
		"198.19.9.9/32        externalIP of shop/web, REFUSED: 198.19.9.9 is outside serviceExternalIPs"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("node status:\n%s\nwant it to contain %q", out.String(), want)
		}
	}

	t.Logf("node status:\n%s", out.String())
	w := &api.WorkloadEndpoint{Metadata: api.ObjectMeta{Namespace: "shop", Name: "n2-k8s-web-eth0"}, Spec: api.WorkloadEndpointSpec{
		Node: "n2", Orchestrator: "k8s", Pod: "web", ContainerID: "c1", InterfaceName: "cali0123456789a", IPNetworks: []string{"10.244.1.5/32"}}}
	if _, err := store.Create(ctx, w); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := c.Explain(ctx, &out, ExplainOptions{Target: "10.244.1.5"}); err != nil {
		t.Fatal(err)
	}
	t.Logf("explain pod:\n%s", out.String())
	for _, want := range []string{"Services leading here",
		"shop/web (LoadBalancer, externalTrafficPolicy Local, ready endpoints on n2)",
		"10.96.0.10 (clusterIP): in 10.96.0.0/16 from all 2 nodes",
		"198.19.0.2 (loadBalancerIP): from n2",
		"198.19.9.9 (externalIP): REFUSED"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("explain pod:\n%s\nwant it to contain %q", out.String(), want)
		}
	}
}
