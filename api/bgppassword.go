package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
)

// secretKeyRE is what Kubernetes takes as a key of a Secret's data.
var secretKeyRE = regexp.MustCompile(`^[-._a-zA-Z0-9]+$`)

// BGPPassword is a TCP-MD5 password of BGP sessions (BGPPeer.spec.password,
// BGPConfiguration.spec.nodeMeshPassword). It is written either as a plain
// string, as before, or as a reference to a key of a Kubernetes Secret
// (Calico's form):
//
//	password: s3cret
//	password: {secretKeyRef: {name: bgp-tor, key: password}}
//
// Agents hold no Kubernetes rights: tabby-kube-controllers copies the
// referenced keys, and only those, from Secrets of its own namespace into
// the etcd record datastore.BGPSecretsKey, outside the resources, which the
// agents read (docs/bgp.md, "Passwords from Secrets"). tabbyctl get never
// prints a plain value (see RedactedPassword).
type BGPPassword struct {
	// Value is a plain password (the string form).
	Value string
	// SecretKeyRef names a key of a Secret in tabby-kube-controllers'
	// namespace.
	SecretKeyRef *SecretKeyRef
}

// SecretKeyRef selects one key of a Secret.
type SecretKeyRef struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

// String renders r as "name/key", the way it is indexed in
// datastore.BGPSecrets and shown in status.
func (r SecretKeyRef) String() string { return r.Name + "/" + r.Key }

// RedactedPassword is what tabbyctl get prints in place of a plain
// password. Validation refuses it, so that a resource printed and applied
// again cannot set the placeholder as the password.
const RedactedPassword = "(redacted)"

// PlainPassword is a BGPPassword holding the plain password pw.
func PlainPassword(pw string) BGPPassword { return BGPPassword{Value: pw} }

// IsZero reports whether no password is set (for omitzero).
func (p BGPPassword) IsZero() bool { return p.Value == "" && p.SecretKeyRef == nil }

// MarshalJSON writes the string form for a plain password and the object
// form for a reference.
func (p BGPPassword) MarshalJSON() ([]byte, error) {
	if p.SecretKeyRef != nil {
		return json.Marshal(struct {
			SecretKeyRef *SecretKeyRef `json:"secretKeyRef"`
		}{p.SecretKeyRef})
	}
	return json.Marshal(p.Value)
}

// UnmarshalJSON reads either form; an object may hold secretKeyRef only,
// with name and key and nothing else.
func (p *BGPPassword) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*p = BGPPassword{}
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*p = BGPPassword{Value: s}
		return nil
	}
	var obj struct {
		SecretKeyRef *SecretKeyRef `json:"secretKeyRef"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&obj); err != nil {
		return fmt.Errorf("want a password string or {secretKeyRef: {name, key}}: %w", err)
	}
	if obj.SecretKeyRef == nil {
		return errors.New("want a password string or {secretKeyRef: {name, key}}: secretKeyRef is missing")
	}
	*p = BGPPassword{SecretKeyRef: obj.SecretKeyRef}
	return nil
}

// redacted returns p with a plain value replaced by RedactedPassword.
func (p BGPPassword) redacted() BGPPassword {
	if p.Value != "" {
		p.Value = RedactedPassword
	}
	return p
}

// Redacted implements Redactor: the peer with a plain password replaced.
func (p *BGPPeer) Redacted() Object {
	cp := *p
	cp.Spec.Password = p.Spec.Password.redacted()
	return &cp
}

// Redacted implements Redactor: the configuration with a plain mesh
// password replaced.
func (c *BGPConfiguration) Redacted() Object {
	cp := *c
	cp.Spec.NodeMeshPassword = c.Spec.NodeMeshPassword.redacted()
	return &cp
}

// Redactor is a resource holding secrets: Redacted returns a copy fit for
// printing. Encode uses it.
type Redactor interface {
	Redacted() Object
}

// maxMD5KeyLen is the kernel's TCP_MD5SIG_MAXKEYLEN.
const maxMD5KeyLen = 80

// MaxBGPPasswordLen is the longest TCP-MD5 key the kernel takes.
const MaxBGPPasswordLen = maxMD5KeyLen

func (v *validator) password(path string, pw BGPPassword) {
	if r := pw.SecretKeyRef; r != nil {
		if pw.Value != "" {
			v.add(path, "give either a password or a secretKeyRef, not both")
		}
		if r.Name == "" {
			v.add(path+".secretKeyRef.name", "is required")
		} else if msg := checkDNSSubdomain(r.Name); msg != "" {
			v.add(path+".secretKeyRef.name", "%s", msg)
		}
		if r.Key == "" {
			v.add(path+".secretKeyRef.key", "is required")
		} else if !secretKeyRE.MatchString(r.Key) || len(r.Key) > 253 {
			v.add(path+".secretKeyRef.key", "%q is not a Secret key: letters, digits, '-', '_' and '.', at most 253", r.Key)
		}
		return
	}
	switch {
	case pw.Value == RedactedPassword:
		v.add(path, "%q is what tabbyctl get prints in place of a password: give the password, or a secretKeyRef", RedactedPassword)
	case len(pw.Value) > maxMD5KeyLen:
		v.add(path, "is %d bytes long; TCP MD5 keys are at most %d", len(pw.Value), maxMD5KeyLen)
	}
}
