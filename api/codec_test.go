package api

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRoundTrip(t *testing.T) {
	ts := time.Date(2025, 3, 4, 5, 6, 7, 890, time.UTC)
	withMeta := validWEP()
	withMeta.Metadata.ResourceVersion, withMeta.Metadata.UID, withMeta.Metadata.CreationTimestamp = "42", "c0ffee", &ts
	withMeta.Metadata.Annotations = map[string]string{"note": "line1\nline2: \"quoted\""}
	objs := append(validObjects(), withMeta)
	for _, obj := range objs {
		obj.SetDefaults()
		for _, format := range []string{"yaml", "json"} {
			t.Run(KindOf(obj)+"/"+obj.GetMeta().Name+"/"+format, func(t *testing.T) {
				b, err := Encode(obj, format)
				if err != nil {
					t.Fatalf("Encode: %v", err)
				}
				got, err := Decode(b)
				if err != nil {
					t.Fatalf("Decode: %v\n%s", err, b)
				}
				if diff := cmp.Diff([]Object{obj}, got); diff != "" {
					t.Errorf("round trip (-want +got):\n%s\n%s", diff, b)
				}
			})
		}
	}
	for _, format := range []string{"yaml", "json"} {
		b, err := EncodeList(objs, format)
		if err != nil {
			t.Fatalf("EncodeList(%s): %v", format, err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(EncodeList(%s)): %v", format, err)
		}
		if diff := cmp.Diff(objs, got); diff != "" {
			t.Errorf("list round trip in %s (-want +got):\n%s", format, diff)
		}
	}
}

func TestEncodeFillsTypeMeta(t *testing.T) {
	p := &IPPool{Metadata: ObjectMeta{Name: "p"}, Spec: IPPoolSpec{CIDR: "10.244.0.0/16"}}
	b, err := Encode(p, "yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := "apiVersion: tabby.dev/v1\nkind: IPPool\nmetadata:\n  name: p\nspec:\n  cidr: 10.244.0.0/16\n"
	if string(b) != want {
		t.Errorf("Encode = %q, want %q", b, want)
	}
	if p.TypeMeta != (TypeMeta{}) {
		t.Errorf("Encode modified its argument: %+v", p.TypeMeta)
	}
	if _, err := Encode(p, "xml"); err == nil {
		t.Error("Encode(xml) succeeded")
	}
	if _, err := Encode((*IPPool)(nil), "json"); err == nil {
		t.Error("Encode(nil) succeeded")
	}
}

func TestDecodeExamples(t *testing.T) {
	data, err := os.ReadFile("testdata/examples.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, KindOf(o))
		o.SetDefaults()
		if err := o.Validate(); err != nil {
			t.Errorf("%s %s: %v", KindOf(o), o.GetMeta().Name, err)
		}
	}
	want := []string{KindNode, KindIPPool, KindIPAMConfig, KindBGPConfiguration, KindBGPPeer, KindBGPFilter, KindBGPPeer,
		KindWorkloadEndpoint, KindNetworkPolicy, KindGlobalNetworkPolicy, KindHostEndpoint, KindClusterConfiguration}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Errorf("kinds (-want +got):\n%s", diff)
	}
	// Spot-check conversions: a duration given as seconds, string ports.
	peer := objs[4].(*BGPPeer)
	if peer.Spec.HoldTime == nil || peer.Spec.HoldTime.Duration != 30*time.Second {
		t.Errorf("holdTime = %v, want 30s", peer.Spec.HoldTime)
	}
	if b := peer.Spec.BFD; b == nil || !b.Enabled || b.EffectiveInterval() != 300*time.Millisecond || b.EffectiveMultiplier() != 3 {
		t.Errorf("bfd = %+v", peer.Spec.BFD)
	}
	filter := objs[5].(*BGPFilter)
	if r := filter.Spec.ImportV4[0]; r.PrefixLength == nil || r.PrefixLength.Max == nil || *r.PrefixLength.Max != 28 || r.PrefixLength.Min != nil {
		t.Errorf("prefixLength = %+v", r.PrefixLength)
	}
	gnp := objs[9].(*GlobalNetworkPolicy)
	if diff := cmp.Diff([]IntOrString{FromInt(5432), FromString("6000:6010")}, gnp.Spec.Ingress[0].Destination.Ports); diff != "" {
		t.Errorf("ports (-want +got):\n%s", diff)
	}
}

func TestDecodeForms(t *testing.T) {
	pool := func(name string) Object {
		return &IPPool{TypeMeta: TypeMeta{APIVersion, KindIPPool}, Metadata: ObjectMeta{Name: name}}
	}
	const p1 = "apiVersion: tabby.dev/v1\nkind: IPPool\nmetadata: {name: a}\n"
	const j1 = `{"apiVersion":"tabby.dev/v1","kind":"IPPool","metadata":{"name":"a"}}`
	tests := []struct {
		name string
		in   string
		want []Object
	}{
		{"empty", "", nil},
		{"only comments", "# nothing\n---\n# here\n", nil},
		{"one yaml", p1, []Object{pool("a")}},
		{"leading separator and comment", "---\n" + p1 + "--- # next\n" + strings.ReplaceAll(p1, "a}", "b}"), []Object{pool("a"), pool("b")}},
		{"empty documents skipped", "---\n---\n" + p1 + "---\n\n---\n", []Object{pool("a")}},
		{"document end marker", p1 + "...\n", []Object{pool("a")}},
		{"null document", "null\n---\n" + p1, []Object{pool("a")}},
		{"crlf", strings.ReplaceAll(p1+"---\n"+p1, "\n", "\r\n"), []Object{pool("a"), pool("a")}},
		{"yaml list kind", "apiVersion: v1\nkind: List\nitems:\n- " + j1 + "\n- " + strings.ReplaceAll(j1, `"a"`, `"b"`), []Object{pool("a"), pool("b")}},
		{"empty list", "apiVersion: v1\nkind: List\nitems: []\n", []Object{}},
		{"yaml sequence", "- " + j1 + "\n", []Object{pool("a")}},
		{"json", j1, []Object{pool("a")}},
		{"yaml flow style", "{apiVersion: tabby.dev/v1, kind: IPPool, metadata: {name: a}}", []Object{pool("a")}},
		{"json stream", j1 + "\n" + j1, []Object{pool("a"), pool("a")}},
		{"json array", "[" + j1 + "," + j1 + "]", []Object{pool("a"), pool("a")}},
		{"json list", `{"apiVersion":"tabby.dev/v1","kind":"List","items":[` + j1 + `]}`, []Object{pool("a")}},
		{"null values", "apiVersion: tabby.dev/v1\nkind: IPPool\nmetadata: {name: a, labels: null}\nspec: null\n", []Object{pool("a")}},
		{"null duration", "apiVersion: tabby.dev/v1\nkind: BGPPeer\nmetadata: {name: a}\nspec: {holdTime: null}\n",
			[]Object{&BGPPeer{TypeMeta: TypeMeta{APIVersion, KindBGPPeer}, Metadata: ObjectMeta{Name: "a"}}}},
		{"yaml number as string", "apiVersion: tabby.dev/v1\nkind: IPPool\nmetadata: {name: 123}\n", []Object{pool("123")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode([]byte(tt.in))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if len(tt.want) == 0 && len(got) == 0 {
				return
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decode (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	const ok = "apiVersion: tabby.dev/v1\nkind: IPPool\nmetadata: {name: a}\n"
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"unknown top-level field", ok + "status: {}\n", []string{"document 1: status: unknown field"}},
		{"unknown spec field in document 2", ok + "---\n" + ok + "spec:\n  cidr: 10.0.0.0/8\n  blocksize: 24\n",
			[]string{"document 2: spec.blocksize: unknown field", `did you mean "blockSize"`}},
		{"unknown nested field", "apiVersion: tabby.dev/v1\nkind: GlobalNetworkPolicy\nmetadata: {name: a}\nspec:\n  ingress:\n  - action: Allow\n    source: {nets: [], port: 80}\n",
			[]string{"spec.ingress[0].source.port: unknown field"}},
		{"unknown field in selector", "apiVersion: tabby.dev/v1\nkind: BGPPeer\nmetadata: {name: a}\nspec:\n  peerSelector:\n    matchExpressions:\n    - {key: a, op: Exists}\n",
			[]string{"spec.peerSelector.matchExpressions[0].op: unknown field"}},
		{"filter rule field case", "apiVersion: tabby.dev/v1\nkind: BGPFilter\nmetadata: {name: a}\nspec:\n  importV4:\n  - {cidr: 10.0.0.0/8, matchoperator: In, action: Accept}\n",
			[]string{"spec.importV4[0].matchoperator: unknown field", `did you mean "matchOperator"`}},
		{"filter unknown family", "apiVersion: tabby.dev/v1\nkind: BGPFilter\nmetadata: {name: a}\nspec: {import: []}\n",
			[]string{"spec.import: unknown field"}},
		{"filter prefix length field", "apiVersion: tabby.dev/v1\nkind: BGPFilter\nmetadata: {name: a}\nspec:\n  exportV4: [{cidr: 10.0.0.0/8, action: Reject, prefixLength: {minimum: 9}}]\n",
			[]string{"spec.exportV4[0].prefixLength.minimum: unknown field"}},
		{"peer bfd field", "apiVersion: tabby.dev/v1\nkind: BGPPeer\nmetadata: {name: a}\nspec: {bfd: {enabled: true, minRx: 100}}\n",
			[]string{"spec.bfd.minRx: unknown field"}},
		{"peer bfd interval", "apiVersion: tabby.dev/v1\nkind: BGPPeer\nmetadata: {name: a}\nspec: {bfd: {enabled: true, interval: fast}}\n",
			[]string{"spec.bfd.interval:", `invalid duration "fast"`}},
		{"peer maxPrefixes negative", "apiVersion: tabby.dev/v1\nkind: BGPPeer\nmetadata: {name: a}\nspec: {maxPrefixes: -1}\n",
			[]string{"spec.maxPrefixes:"}},
		{"unknown metadata field", "apiVersion: tabby.dev/v1\nkind: Node\nmetadata: {name: a, namespaces: x}\n", []string{"metadata.namespaces: unknown field"}},
		{"wrong apiVersion", "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: a}\n",
			[]string{`apiVersion: "projectcalico.org/v3" is not supported (want "tabby.dev/v1")`}},
		{"missing apiVersion", "kind: IPPool\nmetadata: {name: a}\n", []string{"apiVersion: is required"}},
		{"apiVersion not a string", "apiVersion: 1\nkind: IPPool\n", []string{"apiVersion: must be a string"}},
		{"missing kind", "apiVersion: tabby.dev/v1\nmetadata: {name: a}\n", []string{"kind: is required"}},
		{"unknown kind", "apiVersion: tabby.dev/v1\nkind: Pod\n", []string{`kind: unknown kind "Pod"`}},
		{"kind wrong case", "apiVersion: tabby.dev/v1\nkind: ippool\n", []string{`did you mean "IPPool"`}},
		{"kind alias", "apiVersion: tabby.dev/v1\nkind: gnp\n", []string{`unknown kind "gnp"`}},
		{"bad yaml", ok + "spec: [unclosed\n", []string{"document 1: invalid YAML"}},
		{"bad yaml in document 3", ok + "---\n" + ok + "---\n\tfoo: bar\n", []string{"document 3: invalid YAML"}},
		{"duplicate key", ok + "metadata: {name: b}\n", []string{"document 1: invalid YAML", `"metadata" already set`}},
		{"scalar document", "just a string\n", []string{"document 1: want a resource", "a string"}},
		{"type mismatch", ok + "spec: {blockSize: many}\n", []string{"spec.blockSize: cannot unmarshal string into int"}},
		{"spec not an object", ok + "spec: [1]\n", []string{"document 1:", "spec"}},
		{"bad duration", "apiVersion: tabby.dev/v1\nkind: BGPPeer\nmetadata: {name: a}\nspec: {holdTime: soon}\n", []string{"document 1: spec.holdTime:", `invalid duration "soon"`}},
		{"duration out of range", "apiVersion: tabby.dev/v1\nkind: BGPPeer\nmetadata: {name: a}\nspec: {keepaliveTime: 1e300}\n",
			[]string{"spec.keepaliveTime: duration of 1e+300 seconds is out of range"}},
		{"bad timestamp", "apiVersion: tabby.dev/v1\nkind: Node\nmetadata: {name: a, creationTimestamp: yesterday}\n",
			[]string{"metadata.creationTimestamp:"}},
		{"bad port type", "apiVersion: tabby.dev/v1\nkind: GlobalNetworkPolicy\nmetadata: {name: a}\nspec: {ingress: [{action: Allow, destination: {ports: [1.5]}}]}\n",
			[]string{"spec.ingress[0].destination.ports[0]: must be an integer or a string"}},
		{"list item error", "apiVersion: v1\nkind: List\nitems:\n- " + "{apiVersion: tabby.dev/v1, kind: IPPool}\n- {apiVersion: tabby.dev/v1, kind: Pod}\n",
			[]string{"document 1: items[1]: kind: unknown kind"}},
		{"list item not an object", "apiVersion: v1\nkind: List\nitems: [3]\n", []string{"items[0]: want a resource"}},
		{"list items not a list", "apiVersion: v1\nkind: List\nitems: {a: b}\n", []string{"items: must be a list"}},
		{"nested list", "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: tabby.dev/v1, kind: List}\n", []string{"items[0]: kind: a List cannot be nested"}},
		{"list wrong apiVersion", "apiVersion: v2\nkind: List\nitems: []\n", []string{"apiVersion:", "List"}},
		{"list unknown field", "apiVersion: v1\nkind: List\nitems: []\nextra: 1\n", []string{"extra: unknown field"}},
		{"trailing yaml content", "{apiVersion: tabby.dev/v1, kind: Node, metadata: {name: a}} {kind: Node}", []string{"document 1: invalid YAML: unexpected content after the document"}},
		{"two flow documents", "# x\n{apiVersion: tabby.dev/v1, kind: Node}\n[1]\n", []string{"document 1: invalid YAML"}},
		{"bad json", `{"apiVersion": "tabby.dev/v1",`, []string{"document 1: invalid JSON"}},
		{"bad json second value", `{"apiVersion":"tabby.dev/v1","kind":"Node","metadata":{"name":"a"}} {"kind":`, []string{"document 2: invalid JSON"}},
		{"json unknown field", `{"apiVersion":"tabby.dev/v1","kind":"Node","metadata":{"name":"a"},"spec":{"bgp":{"ipv4address":"x"}}}`,
			[]string{"spec.bgp.ipv4address: unknown field", `did you mean "ipv4Address"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode([]byte(tt.in))
			if err == nil {
				t.Fatalf("Decode succeeded: %v", got)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if tt.name == "unknown kind" && !errors.Is(err, ErrUnknownKind) {
				t.Errorf("error %v is not ErrUnknownKind", err)
			}
		})
	}
}
