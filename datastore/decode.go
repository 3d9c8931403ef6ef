package datastore

import (
	"bytes"
	"sync"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"
)

// Records are decoded with go-json-experiment's decoder set to behave as
// encoding/json does (case-insensitive field names, duplicate names and
// invalid UTF-8 accepted, unknown fields ignored, the types' own
// UnmarshalJSON methods used): the same objects from the same bytes, with
// a third of the allocations and less CPU (every agent decodes every
// endpoint of the cluster; docs/scale.md). String maps (labels,
// annotations, namespace labels) are decoded with their keys and values
// interned.
var decodeOptions = json.JoinOptions(jsonv1.DefaultOptionsV1(),
	json.WithUnmarshalers(json.UnmarshalFromFunc(unmarshalStringMap)))

// unmarshalRecord decodes a stored record into v.
func unmarshalRecord(data []byte, v any) error { return json.Unmarshal(data, v, decodeOptions) }

// unmarshalStringMap decodes a JSON object of strings into *m with its
// keys and values interned; anything else (null, a value that is not a
// string) is left to the default decoder and its errors.
func unmarshalStringMap(dec *jsontext.Decoder, m *map[string]string) error {
	if dec.PeekKind() != '{' {
		return json.SkipFunc
	}
	if _, err := dec.ReadToken(); err != nil {
		return err
	}
	if *m == nil {
		*m = map[string]string{}
	}
	for dec.PeekKind() != '}' {
		k, err := readInterned(dec)
		if err != nil {
			return err
		}
		v, err := readInterned(dec)
		if err != nil {
			return err
		}
		(*m)[k] = v
	}
	_, err := dec.ReadToken()
	return err
}

// readInterned reads one string value, interned when it is plain (no
// escapes, valid UTF-8), else decoded as encoding/json would.
func readInterned(dec *jsontext.Decoder) (string, error) {
	raw, err := dec.ReadValue()
	if err != nil {
		return "", err
	}
	if n := len(raw); n >= 2 && raw[0] == '"' && bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return interned.intern(raw[1 : n-1]), nil
	}
	var s string
	err = json.Unmarshal(raw, &s, jsonv1.DefaultOptionsV1())
	return s, err
}

// internTable shares the strings of labels and the like between the
// records that hold them: at 30,000 endpoints most label keys and values
// are a few strings repeated. Bounded: it forgets everything when full,
// so strings no record holds any more are not kept for ever.
type internTable struct {
	mu sync.Mutex
	m  map[string]string
}

// Bounds of the intern table: entries, and the longest string interned
// (longer ones are unlikely to repeat).
const (
	internMax    = 1 << 14
	internMaxLen = 64
)

var interned internTable

func (t *internTable) intern(b []byte) string {
	if len(b) > internMaxLen {
		return string(b)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.m[string(b)]; ok { // the conversion does not allocate
		return s
	}
	return t.addLocked(string(b))
}

// internString is intern for a string the caller already holds.
func (t *internTable) internString(s string) string {
	if len(s) > internMaxLen {
		return s
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if i, ok := t.m[s]; ok {
		return i
	}
	return t.addLocked(s)
}

func (t *internTable) addLocked(s string) string {
	if t.m == nil || len(t.m) >= internMax {
		t.m = make(map[string]string, 256)
	}
	t.m[s] = s
	return s
}
