package api

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

var jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// checkFields reports, with its path, the first object key in v (decoded
// JSON) that has no matching field in t, or the first value that a type with
// its own UnmarshalJSON (Duration, IntOrString, time.Time) rejects. Keys
// must match the json tags exactly, unlike encoding/json, which folds case.
// Other type mismatches are left to the decoder.
func checkFields(path string, v any, t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if v == nil {
		return nil
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshalerType) {
		// Decode the value here too, because encoding/json returns a
		// custom unmarshaler's error without the field's path.
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if err := reflect.New(t).Interface().(json.Unmarshaler).UnmarshalJSON(b); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		fields := jsonFields(t)
		for _, k := range sortedKeys(m) {
			ft, ok := fields[k]
			p := joinPath(path, k)
			if !ok {
				return fmt.Errorf("%s: unknown field%s", p, suggestField(k, fields))
			}
			if err := checkFields(p, m[k], ft); err != nil {
				return err
			}
		}
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		for _, k := range sortedKeys(m) {
			if err := checkFields(fmt.Sprintf("%s[%q]", path, k), m[k], t.Elem()); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		s, ok := v.([]any)
		if !ok {
			return nil
		}
		for i, e := range s {
			if err := checkFields(fmt.Sprintf("%s[%d]", path, i), e, t.Elem()); err != nil {
				return err
			}
		}
	}
	return nil
}

func joinPath(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// jsonFields maps the JSON names of t's fields, including those of inlined
// embedded structs, to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := make(map[string]reflect.Type)
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

// suggestField returns " (did you mean "x"?)" when k matches a field but
// for case.
func suggestField(k string, fields map[string]reflect.Type) string {
	for name := range fields {
		if strings.EqualFold(name, k) {
			return fmt.Sprintf(" (did you mean %q?)", name)
		}
	}
	return ""
}

func jsonTypeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number, float64:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
