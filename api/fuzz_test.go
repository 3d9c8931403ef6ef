package api

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// FuzzDecode checks that Decode never panics, and that whatever it accepts
// encodes (as YAML and JSON) and decodes back to an equal object; along the
// way it exercises SetDefaults, Validate and the selectors on the result.
// Seeds: testdata/examples.yaml, the encoded valid fixtures, and the
// corpus under testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	examples, err := os.ReadFile("testdata/examples.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(examples)
	for _, doc := range strings.Split(string(examples), "\n---") {
		f.Add([]byte(doc))
	}
	for _, obj := range validObjects() {
		for _, format := range []string{"yaml", "json"} {
			b, err := Encode(obj, format)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	for _, s := range []string{
		"", "---", "[]", "{}", "null", "[null]", "apiVersion: v1\nkind: List\nitems: [{}]\n",
		"apiVersion: tabby.dev/v1\nkind: BGPPeer\nmetadata: {name: a}\nspec: {holdTime: 1e300}\n",
		"apiVersion: tabby.dev/v1\nkind: GlobalNetworkPolicy\nmetadata: {name: a}\nspec: {order: .inf}\n",
		"apiVersion: tabby.dev/v1\nkind: Node\nmetadata: {name: a, creationTimestamp: \"2024-01-02T03:04:05.123+01:30\"}\n",
		`{"apiVersion":"tabby.dev/v1","kind":"IPPool","metadata":{"name":"a","labels":{"k":"\u0000"}}}`,
		"apiVersion: tabby.dev/v1\nkind: NetworkPolicy\nmetadata: {name: a}\nspec: {ingress: [{ports: [{port: \"x\"}, {port: 7}]}]}\n",
		"&a [*a]", "a: &a [*a, *a]\nb: *a\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := Decode(data)
		if err != nil {
			return
		}
		for _, obj := range objs {
			for _, format := range []string{"yaml", "json"} {
				b, err := Encode(obj, format)
				if err != nil {
					t.Fatalf("decoded %#v but cannot encode it as %s: %v", obj, format, err)
				}
				again, err := Decode(b)
				if err != nil {
					t.Fatalf("cannot decode our own %s: %v\n%s", format, err, b)
				}
				if len(again) != 1 {
					t.Fatalf("re-decoding gave %d objects, want 1\n%s", len(again), b)
				}
				// nil and empty slices and maps encode alike; a plain
				// password is printed redacted.
				want := obj
				if r, ok := obj.(Redactor); ok {
					want = r.Redacted()
				}
				if diff := cmp.Diff(want, again[0], cmpopts.EquateEmpty()); diff != "" {
					t.Fatalf("%s round trip changed the object (-decoded +re-decoded):\n%s\n%s", format, diff, b)
				}
			}
			_ = obj.Validate()
			obj.SetDefaults()
			_ = obj.Validate()
			labels := obj.GetMeta().Labels
			for _, sel := range selectorsOf(obj) {
				_ = sel.Matches(labels)
				_ = sel.String()
			}
		}
	})
}

// selectorsOf returns the top-level selectors of obj.
func selectorsOf(obj Object) []*LabelSelector {
	switch o := obj.(type) {
	case *IPPool:
		return []*LabelSelector{o.Spec.NodeSelector}
	case *BGPPeer:
		return []*LabelSelector{o.Spec.NodeSelector, o.Spec.PeerSelector}
	case *NetworkPolicy:
		return []*LabelSelector{&o.Spec.PodSelector}
	case *GlobalNetworkPolicy:
		return []*LabelSelector{o.Spec.Selector, o.Spec.NamespaceSelector}
	}
	return nil
}
