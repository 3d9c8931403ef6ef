package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	"sigs.k8s.io/yaml"
)

// Encode renders obj as "yaml" or "json" (indented) for people to read:
// a plain password is printed as RedactedPassword (Redactor). When obj's
// apiVersion or kind is unset, the output carries the right ones; obj is
// not modified.
func Encode(obj Object, format string) ([]byte, error) {
	if obj == nil || reflect.ValueOf(obj).IsNil() {
		return nil, errors.New("encoding: nil object")
	}
	kind := KindOf(obj)
	if kind == "" {
		return nil, fmt.Errorf("encoding: %T is not a Tabby resource", obj)
	}
	if r, ok := obj.(Redactor); ok {
		obj = r.Redacted() // a copy: obj is not modified
	}
	if tm := obj.GetTypeMeta(); tm.APIVersion != APIVersion || tm.Kind != kind {
		cp := reflect.New(reflect.TypeOf(obj).Elem())
		cp.Elem().Set(reflect.ValueOf(obj).Elem())
		obj = cp.Interface().(Object)
		setTypeMeta(obj.GetTypeMeta(), kind)
	}
	return encodeValue(obj, format)
}

// EncodeList renders several objects: YAML documents separated by "---",
// or a JSON "kind: List" with items. Decode reads both back.
func EncodeList(objs []Object, format string) ([]byte, error) {
	switch format {
	case "yaml":
		var buf bytes.Buffer
		for i, o := range objs {
			b, err := Encode(o, format)
			if err != nil {
				return nil, fmt.Errorf("item %d: %w", i, err)
			}
			if i > 0 {
				buf.WriteString("---\n")
			}
			buf.Write(b)
		}
		return buf.Bytes(), nil
	case "json":
		items := make([]json.RawMessage, 0, len(objs))
		for i, o := range objs {
			b, err := Encode(o, format)
			if err != nil {
				return nil, fmt.Errorf("item %d: %w", i, err)
			}
			items = append(items, b)
		}
		return encodeValue(struct {
			APIVersion string            `json:"apiVersion"`
			Kind       string            `json:"kind"`
			Items      []json.RawMessage `json:"items"`
		}{"v1", KindList, items}, format)
	}
	return nil, fmt.Errorf("encoding: unknown format %q (want yaml or json)", format)
}

func encodeValue(v any, format string) ([]byte, error) {
	switch format {
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("encoding yaml: %w", err)
		}
		return b, nil
	case "json":
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return nil, fmt.Errorf("encoding json: %w", err)
		}
		return append(b, '\n'), nil
	}
	return nil, fmt.Errorf("encoding: unknown format %q (want yaml or json)", format)
}
