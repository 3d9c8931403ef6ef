package manifests

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
)

// decodeTabby decodes Tabby resources strictly, defaults and validates them.
func decodeTabby(t *testing.T, what string, data []byte) []api.Object {
	t.Helper()
	objs, err := api.Decode(data)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	for _, o := range objs {
		o.SetDefaults()
		if err := o.Validate(); err != nil {
			t.Errorf("%s: %s %s: %v", what, o.GetTypeMeta().Kind, o.GetMeta().Name, err)
		}
	}
	return objs
}

// readmeYAML returns the Tabby resources in the ```yaml blocks of a README.
func readmeYAML(t *testing.T, path string) []api.Object {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []api.Object
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(b), -1)
	for i, m := range blocks {
		out = append(out, decodeTabby(t, fmt.Sprintf("%s yaml block %d", path, i+1), []byte(m[1]))...)
	}
	return out
}

func TestRouteReflectorResources(t *testing.T) {
	b, err := os.ReadFile("route-reflectors/bgp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeTabby(t, "bgp.yaml", b)
	var order []string
	for _, o := range objs {
		order = append(order, o.GetTypeMeta().Kind+"/"+o.GetMeta().Name)
	}
	// The mesh goes last, after the sessions that replace it.
	want := []string{"BGPPeer/rr-mesh", "BGPPeer/rr-clients", "BGPConfiguration/default"}
	if diff := cmp.Diff(want, order); diff != "" {
		t.Fatalf("resources (-want +got):\n%s", diff)
	}
	cfg := objs[2].(*api.BGPConfiguration)
	if cfg.MeshEnabled() {
		t.Error("the node-to-node mesh is still enabled")
	}

	doc := readmeYAML(t, "route-reflectors/README.md")
	var node *api.Node
	var meshOn *api.BGPConfiguration
	for _, o := range doc {
		switch o := o.(type) {
		case *api.Node:
			node = o
		case *api.BGPConfiguration:
			meshOn = o
		}
	}
	if node == nil || meshOn == nil {
		t.Fatalf("README lacks the reflector Node example or the mesh-on BGPConfiguration (found %d resources)", len(doc))
	}
	clusterID := node.RouteReflectorClusterID()
	if clusterID == "" || node.Metadata.Labels["route-reflector"] != "true" {
		t.Fatalf("README's reflector node has cluster ID %q and labels %v", clusterID, node.Metadata.Labels)
	}
	if !meshOn.MeshEnabled() {
		t.Error("README's way back does not enable the mesh")
	}

	// A cluster set up as the README says: two reflectors with the
	// README's cluster ID and label, three clients.
	var nodes []*api.Node
	for i, name := range []string{"rr1", "rr2", "c1", "c2", "c3"} {
		n := &api.Node{
			Metadata: api.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
			Spec:     api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: fmt.Sprintf("198.18.0.%d/24", 11+i)}},
		}
		if strings.HasPrefix(name, "rr") {
			n.Metadata.Labels["route-reflector"] = "true"
			n.Spec.BGP.RouteReflectorClusterID = clusterID
		}
		n.SetDefaults()
		if err := n.Validate(); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	peers := []*api.BGPPeer{objs[0].(*api.BGPPeer), objs[1].(*api.BGPPeer)}

	sessions := func(cfg *api.BGPConfiguration, peers []*api.BGPPeer) map[string][]string {
		out := map[string][]string{}
		for _, n := range nodes {
			for _, p := range bgp.DesiredPeers(n.Metadata.Name, nodes, cfg, peers, nil) {
				s := fmt.Sprintf("%s:%s", p.Name, p.Type)
				if p.RRClient {
					s += "(client)"
				}
				out[n.Metadata.Name] = append(out[n.Metadata.Name], s)
			}
			slices.Sort(out[n.Metadata.Name])
		}
		return out
	}
	wantRR := map[string][]string{
		"rr1": {"c1:rr-client(client)", "c2:rr-client(client)", "c3:rr-client(client)", "rr2:rr"},
		"rr2": {"c1:rr-client(client)", "c2:rr-client(client)", "c3:rr-client(client)", "rr1:rr"},
		"c1":  {"rr1:rr", "rr2:rr"},
		"c2":  {"rr1:rr", "rr2:rr"},
		"c3":  {"rr1:rr", "rr2:rr"},
	}
	if diff := cmp.Diff(wantRR, sessions(cfg, peers)); diff != "" {
		t.Errorf("sessions with the reflector resources (-want +got):\n%s", diff)
	}

	// The way back: mesh on, BGPPeers deleted: every node peers with
	// every other, and nobody is anybody's reflector client.
	for name, ss := range sessions(meshOn, nil) {
		if len(ss) != len(nodes)-1 {
			t.Errorf("mesh restored: %s has sessions %v, want %d", name, ss, len(nodes)-1)
		}
		for _, s := range ss {
			if strings.Contains(s, "(client)") {
				t.Errorf("mesh restored: %s treats %s as a reflector client", name, s)
			}
		}
	}
}
