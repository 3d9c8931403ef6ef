package bgp

import (
	"errors"
	"fmt"

	"github.com/tabbynet/tabby/api"
)

// PasswordLookup returns the value of the Secret key ref names, as
// tabby-kube-controllers copied it to the datastore, or why there is none
// (the Secret or the key does not exist, the controllers never copied
// it).
type PasswordLookup func(ref api.SecretKeyRef) (string, error)

// Unresolved is a session left out because its password is a Secret
// reference that does not resolve: the session is down, with Reason in
// the node's status.
type Unresolved struct {
	Peer   Peer
	Reason string
}

// errNoLookup is the reason when no lookup is given (no Secrets known).
var errNoLookup = errors.New("no Secret values are known to this agent")

func lookupPassword(lookup PasswordLookup, ref api.SecretKeyRef) (string, error) {
	if lookup == nil {
		return "", fmt.Errorf("secret key %s: %w", ref, errNoLookup)
	}
	v, err := lookup(ref)
	if err != nil {
		return "", fmt.Errorf("secret key %s: %w", ref, err)
	}
	if v == "" || len(v) > api.MaxBGPPasswordLen {
		return "", fmt.Errorf("secret key %s: the value has %d bytes; a TCP-MD5 key has 1 to %d", ref, len(v), api.MaxBGPPasswordLen)
	}
	return v, nil
}

// ResolvePasswords fills in the password of every peer whose password is
// a Secret reference (Peer.PasswordRef) through lookup. A peer whose
// reference does not resolve is left out of ok (its session is not made:
// no session ever runs without the password it was given) and returned in
// down with the reason; every other peer is unaffected. It is pure; the
// order of peers is kept.
func ResolvePasswords(peers []Peer, lookup PasswordLookup) (ok []Peer, down []Unresolved) {
	ok = make([]Peer, 0, len(peers))
	for _, p := range peers {
		if p.PasswordRef == nil {
			ok = append(ok, p)
			continue
		}
		v, err := lookupPassword(lookup, *p.PasswordRef)
		if err != nil {
			down = append(down, Unresolved{Peer: p, Reason: "password: " + err.Error()})
			continue
		}
		p.Password = v
		ok = append(ok, p)
	}
	return ok, down
}
