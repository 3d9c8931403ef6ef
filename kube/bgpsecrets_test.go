package kube

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// Only the keys BGP resources name are copied, each missing one with its
// reason; a lookup of the record gives the agents' answers.
func TestBGPSecretsRecord(t *testing.T) {
	ref := func(name, key string) *api.SecretKeyRef { return &api.SecretKeyRef{Name: name, Key: key} }
	peers := []*api.BGPPeer{
		{Spec: api.BGPPeerSpec{Password: api.BGPPassword{SecretKeyRef: ref("bgp-tor", "md5")}}},
		{Spec: api.BGPPeerSpec{Password: api.BGPPassword{SecretKeyRef: ref("bgp-tor", "md5")}}}, // twice: once in the record
		{Spec: api.BGPPeerSpec{Password: api.BGPPassword{SecretKeyRef: ref("bgp-tor", "nokey")}}},
		{Spec: api.BGPPeerSpec{Password: api.BGPPassword{SecretKeyRef: ref("gone", "md5")}}},
		{Spec: api.BGPPeerSpec{Password: api.PlainPassword("plain")}},
		nil,
	}
	configs := []*api.BGPConfiguration{{Spec: api.BGPConfigurationSpec{NodeMeshPassword: api.BGPPassword{SecretKeyRef: ref("bgp-mesh", "key")}}}}
	secrets := map[string]*corev1.Secret{
		"bgp-tor":  {Data: map[string][]byte{"md5": []byte("tor-pw"), "unrelated": []byte("never copied")}},
		"bgp-mesh": {Data: map[string][]byte{"key": make([]byte, 81)}},
		"other":    {Data: map[string][]byte{"md5": []byte("never copied either")}},
	}
	get := func(name string) (*corev1.Secret, error) {
		if name == "broken" {
			return nil, errors.New("boom")
		}
		return secrets[name], nil
	}
	got := BGPSecretsRecord("tabby-system", BGPPasswordRefs(peers, configs), get)
	want := datastore.BGPSecrets{
		Namespace: "tabby-system",
		Values:    map[string]string{"bgp-tor/md5": "tor-pw"},
		Missing: map[string]string{
			"bgp-mesh/key":  `Secret tabby-system/bgp-mesh key "key" has 81 bytes; a TCP-MD5 key has 1 to 80`,
			"bgp-tor/nokey": `Secret tabby-system/bgp-tor has no key "nokey"`,
			"gone/md5":      "Secret tabby-system/gone not found",
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("record (-want +got):\n%s", diff)
	}
	if v, err := got.Lookup(*ref("bgp-tor", "md5")); v != "tor-pw" || err != nil {
		t.Errorf("Lookup = %q, %v", v, err)
	}
	if _, err := got.Lookup(*ref("gone", "md5")); err == nil || err.Error() != "Secret tabby-system/gone not found" {
		t.Errorf("Lookup of a missing Secret: %v", err)
	}
	if _, err := got.Lookup(*ref("never", "named")); !errors.Is(err, datastore.ErrSecretNotCopied) {
		t.Errorf("Lookup of a key no resource named: %v", err)
	}
	broken := BGPSecretsRecord("ns", []api.SecretKeyRef{*ref("broken", "k")}, get)
	if broken.Missing["broken/k"] != "reading Secret ns/broken: boom" {
		t.Errorf("a read error: %q", broken.Missing)
	}
}
