// Package api owns Tabby's resource types: their wire form (YAML and JSON,
// apiVersion tabby.dev/v1), defaults, validation and decoding. It imports
// nothing of Tabby's and nothing that touches the network.
package api

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
)

// APIVersion is the apiVersion of every Tabby resource.
const APIVersion = "tabby.dev/v1"

// Resource kinds.
const (
	KindNode                = "Node"
	KindIPPool              = "IPPool"
	KindIPAMConfig          = "IPAMConfig"
	KindBGPConfiguration    = "BGPConfiguration"
	KindBGPPeer             = "BGPPeer"
	KindBGPFilter           = "BGPFilter"
	KindWorkloadEndpoint    = "WorkloadEndpoint"
	KindNetworkPolicy       = "NetworkPolicy"
	KindGlobalNetworkPolicy = "GlobalNetworkPolicy"
)

// SingletonName is the only valid name of singleton kinds (IPAMConfig,
// BGPConfiguration).
const SingletonName = "default"

// TypeMeta carries apiVersion and kind.
type TypeMeta struct {
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
}

// ObjectMeta is the metadata every resource has. ResourceVersion is the
// datastore revision the object was read at; the datastore fills it and uses
// it for compare-and-swap on update.
type ObjectMeta struct {
	Name              string            `json:"name"`
	Namespace         string            `json:"namespace,omitempty"`
	Labels            map[string]string `json:"labels,omitempty"`
	Annotations       map[string]string `json:"annotations,omitempty"`
	ResourceVersion   string            `json:"resourceVersion,omitempty"`
	UID               string            `json:"uid,omitempty"`
	CreationTimestamp *time.Time        `json:"creationTimestamp,omitempty"`
}

// Object is implemented by every resource type (as a pointer).
type Object interface {
	// GetTypeMeta returns the object's apiVersion and kind.
	GetTypeMeta() *TypeMeta
	// GetMeta returns the object's metadata for reading and writing.
	GetMeta() *ObjectMeta
	// SetDefaults fills unset fields with their defaults and sets
	// apiVersion and kind. It is idempotent.
	SetDefaults()
	// Validate reports every problem, each with its field path.
	Validate() error
}

// Duration is a time.Duration written as a Go duration string ("90s").
type Duration struct {
	time.Duration
}

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(d.Duration.String())
}

// UnmarshalJSON implements json.Unmarshaler. It accepts a duration string
// ("30s", "2m") or a number of seconds; null leaves d unchanged.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var secs float64
		if err2 := json.Unmarshal(b, &secs); err2 != nil {
			return fmt.Errorf("duration must be a string like \"30s\" or a number of seconds")
		}
		ns := secs * float64(time.Second)
		// Beyond ±2^63 ns the conversion is undefined; refuse rather
		// than wrap.
		if math.IsNaN(ns) || ns >= math.MaxInt64 || ns <= math.MinInt64 {
			return fmt.Errorf("duration of %v seconds is out of range", secs)
		}
		d.Duration = time.Duration(ns)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration %q: %w", s, err)
	}
	d.Duration = v
	return nil
}

// IntOrString holds a number or a string, as Kubernetes ports do
// (80, "http", and for Tabby's own rules "8000:8080").
type IntOrString struct {
	IsString bool
	IntVal   int32
	StrVal   string
}

// FromInt returns an IntOrString holding n.
func FromInt(n int32) IntOrString { return IntOrString{IntVal: n} }

// FromString returns an IntOrString holding s.
func FromString(s string) IntOrString { return IntOrString{IsString: true, StrVal: s} }

// String returns the value as text.
func (v IntOrString) String() string {
	if v.IsString {
		return v.StrVal
	}
	return strconv.Itoa(int(v.IntVal))
}

// MarshalJSON implements json.Marshaler.
func (v IntOrString) MarshalJSON() ([]byte, error) {
	if v.IsString {
		return json.Marshal(v.StrVal)
	}
	return json.Marshal(v.IntVal)
}

// UnmarshalJSON implements json.Unmarshaler.
func (v *IntOrString) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		v.IsString = true
		v.IntVal = 0
		return json.Unmarshal(b, &v.StrVal)
	}
	v.IsString = false
	v.StrVal = ""
	if err := json.Unmarshal(b, &v.IntVal); err != nil {
		return fmt.Errorf("must be an integer or a string")
	}
	return nil
}
