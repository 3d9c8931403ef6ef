package api

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestBGPPasswordForms(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      BGPPassword
		wantErr   string
	}{
		{"plain", `password: s3cret`, PlainPassword("s3cret"), ""},
		{"secret", `password: {secretKeyRef: {name: bgp-tor, key: md5}}`, BGPPassword{SecretKeyRef: &SecretKeyRef{Name: "bgp-tor", Key: "md5"}}, ""},
		{"unknown field", `password: {secretKeyRef: {name: a, key: b}, value: x}`, BGPPassword{}, "spec.password"},
		{"no ref", `password: {}`, BGPPassword{}, "secretKeyRef is missing"},
		{"ref typo", `password: {secretKeyRef: {name: a, kee: b}}`, BGPPassword{}, "spec.password"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := "apiVersion: tabby.dev/v1\nkind: BGPPeer\nmetadata: {name: p}\nspec: {peerIP: 198.18.0.1, asNumber: 65001, " + strings.TrimSpace(tc.doc) + "}\n"
			objs, err := Decode([]byte(doc))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Decode error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, objs[0].(*BGPPeer).Spec.Password); diff != "" {
				t.Errorf("password (-want +got):\n%s", diff)
			}
		})
	}
}

// TestEncodeRedactsPasswords: tabbyctl get -o yaml|json never prints a
// plain password, a reference is printed as it is, and the printed
// placeholder does not validate (applying it back is refused).
func TestEncodeRedactsPasswords(t *testing.T) {
	p := validPeer()
	p.Spec.Password = PlainPassword("hunter2-md5")
	c := validBGPConfig()
	c.Spec.NodeMeshPassword = PlainPassword("mesh-hunter2")
	for _, obj := range []Object{p, c} {
		for _, format := range []string{"yaml", "json"} {
			b, err := Encode(obj, format)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), "hunter2") || !strings.Contains(string(b), RedactedPassword) {
				t.Errorf("%s %s prints the password or no placeholder:\n%s", KindOf(obj), format, b)
			}
			back, err := Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if err := back[0].Validate(); err == nil || !strings.Contains(err.Error(), "what tabbyctl get prints") {
				t.Errorf("re-applying the printed %s: %v, want the placeholder refused", KindOf(obj), err)
			}
		}
	}
	if p.Spec.Password.Value != "hunter2-md5" {
		t.Error("Encode changed the object")
	}
	ref := validPeer()
	b, _ := Encode(ref, "yaml")
	if !strings.Contains(string(b), "secretKeyRef:") || !strings.Contains(string(b), "name: bgp-tor") {
		t.Errorf("a secretKeyRef is not printed as it is:\n%s", b)
	}
}

func TestValidateBGPConfigFields(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*BGPPeer)
		want []string
	}{
		{"local AS reserved", func(p *BGPPeer) { p.Spec.LocalASNumber = 23456 }, []string{"spec.localASNumber: 23456 is a reserved AS number"}},
		{"local AS with peerSelector", func(p *BGPPeer) {
			p.Spec.PeerIP, p.Spec.ASNumber = "", 0
			p.Spec.PeerSelector = &LabelSelector{MatchLabels: map[string]string{"rr": "yes"}}
		}, []string{"spec.localASNumber: must not be set with peerSelector"}},
		{"next hop both", func(p *BGPPeer) { p.Spec.KeepOriginalNextHop = true }, []string{"spec.keepOriginalNextHop: keepOriginalNextHop and nextHopMode cannot both be set"}},
		{"next hop mode", func(p *BGPPeer) { p.Spec.NextHopMode = "keep" }, []string{`spec.nextHopMode: "keep" is not one of Auto, Self, Keep`}},
		{"secret ref", func(p *BGPPeer) {
			p.Spec.Password = BGPPassword{Value: "x", SecretKeyRef: &SecretKeyRef{Name: "Bad_Name", Key: "a/b"}}
		}, []string{
			"spec.password: give either a password or a secretKeyRef, not both", "spec.password.secretKeyRef.name:", `spec.password.secretKeyRef.key: "a/b" is not a Secret key`}},
		{"secret ref empty", func(p *BGPPeer) { p.Spec.Password = BGPPassword{SecretKeyRef: &SecretKeyRef{}} }, []string{
			"spec.password.secretKeyRef.name: is required", "spec.password.secretKeyRef.key: is required"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := validPeer()
			tc.mod(p)
			checkProblems(t, p.Validate(), tc.want)
		})
	}
}

func TestValidateFilterMatchAndOperations(t *testing.T) {
	for _, tc := range []struct {
		name string
		rule BGPFilterRule
		want []string
	}{
		{"peer type", BGPFilterRule{PeerType: "ebgp", Action: FilterActionAccept}, []string{`spec.exportV6[0].peerType: "ebgp" is not one of eBGP, iBGP`}},
		{"community", BGPFilterRule{Communities: &BGPFilterCommunityMatch{Values: []string{"65536:1"}}, Action: FilterActionAccept}, []string{"spec.exportV6[0].communities.values[0]:"}},
		{"two communities", BGPFilterRule{Communities: &BGPFilterCommunityMatch{Values: []string{"1:1", "1:2"}}, Action: FilterActionAccept}, []string{"spec.exportV6[0].communities.values: has 2 values"}},
		{"no community", BGPFilterRule{Communities: &BGPFilterCommunityMatch{}, Action: FilterActionAccept}, []string{"spec.exportV6[0].communities.values: is required"}},
		{"as path", BGPFilterRule{ASPathPrefix: []uint32{0}, Action: FilterActionAccept}, []string{"spec.exportV6[0].asPathPrefix[0]: 0 is not an AS number"}},
		{"operations on reject", BGPFilterRule{Action: FilterActionReject, Operations: []BGPFilterOperation{{SetLocalPreference: &BGPFilterSetLocalPreference{Value: 1}}}},
			[]string{"spec.exportV6[0].operations: may only be used with action Accept"}},
		{"operation fields", BGPFilterRule{Action: FilterActionAccept, Operations: []BGPFilterOperation{{}, {
			AddCommunity: &BGPFilterAddCommunity{Value: "65535:65282"}, SetLocalPreference: &BGPFilterSetLocalPreference{Value: 1}}}},
			[]string{"spec.exportV6[0].operations[0]: must set exactly one", "spec.exportV6[0].operations[1]: must set exactly one",
				"spec.exportV6[0].operations[1].addCommunity.value: \"65535:65282\" is the well-known community NO_ADVERTISE"}},
		{"prepend", BGPFilterRule{Action: FilterActionAccept, ASPathPrefix: []uint32{65001}, Operations: []BGPFilterOperation{
			{PrependASPath: &BGPFilterPrependASPath{Prefix: []uint32{65010, 65011}}}, {PrependASPath: &BGPFilterPrependASPath{}}}},
			[]string{"spec.exportV6[0].operations[0].prependASPath.prefix: with asPathPrefix", "spec.exportV6[0].operations[1].prependASPath.prefix: is required",
				"spec.exportV6[0].operations: has 2 prependASPath entries"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := validFilter()
			f.Spec.ExportV6 = []BGPFilterRule{tc.rule}
			checkProblems(t, f.Validate(), tc.want)
		})
	}
}

// checkProblems checks that err reports exactly the problems want (each a
// prefix of one line of it).
func checkProblems(t *testing.T, err error, want []string) {
	t.Helper()
	if err == nil {
		t.Fatalf("valid, want %q", want)
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Errorf("got %d problems, want %d:\n%s", len(lines), len(want), err)
	}
	for _, w := range want {
		found := false
		for _, l := range lines {
			found = found || strings.HasPrefix(l, w)
		}
		if !found {
			t.Errorf("no problem %q in:\n%s", w, err)
		}
	}
}
