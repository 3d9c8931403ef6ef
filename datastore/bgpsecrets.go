package datastore

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/tabbynet/tabby/api"
)

// BGPSecretsKey holds the values of the Secret keys that BGP passwords
// name (BGPPeer password.secretKeyRef, BGPConfiguration nodeMeshPassword),
// copied by tabby-kube-controllers, the only Tabby process with Kubernetes
// API rights, from Secrets of its own namespace (docs/bgp.md, "Passwords
// from Secrets"). Only keys some resource names are copied. It is not a
// resource: no tabbyctl get prints it. The agents read it through the
// cluster view; tabbyctl reads it only for the reasons a key is missing.
const BGPSecretsKey = "config/bgp-secrets"

// BGPSecrets is the value of BGPSecretsKey.
type BGPSecrets struct {
	// Namespace is the namespace the Secrets were read from.
	Namespace string `json:"namespace"`
	// Values are the referenced keys' values by "name/key"
	// (api.SecretKeyRef.String).
	Values map[string]string `json:"values,omitempty"`
	// Missing says, by "name/key", why a referenced key has no value
	// (no such Secret, no such key in it, a value a TCP-MD5 key cannot
	// be).
	Missing map[string]string `json:"missing,omitempty"`
}

// ErrSecretNotCopied is Lookup's answer for a key the controllers have
// not copied (yet): no tabby-kube-controllers runs, or it has not seen
// the resource naming it.
var ErrSecretNotCopied = errors.New("not copied from Kubernetes (is tabby-kube-controllers running?)")

// Lookup returns the value of the key ref names, or why there is none.
// It implements bgp.PasswordLookup.
func (s BGPSecrets) Lookup(ref api.SecretKeyRef) (string, error) {
	if v, ok := s.Values[ref.String()]; ok {
		return v, nil
	}
	if why, ok := s.Missing[ref.String()]; ok {
		return "", errors.New(why)
	}
	return "", ErrSecretNotCopied
}

// DecodeBGPSecrets parses a stored BGPSecrets record.
func DecodeBGPSecrets(val []byte) (BGPSecrets, error) {
	var s BGPSecrets
	if err := json.Unmarshal(val, &s); err != nil {
		return BGPSecrets{}, fmt.Errorf("%s: %w", BGPSecretsKey, err)
	}
	return s, nil
}
