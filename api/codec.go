package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strings"

	yaml2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"
)

// KindList is the kind of a document that wraps several resources in
// "items", as kubectl writes them.
const KindList = "List"

// Decode parses one or more resources: YAML documents separated by "---"
// lines, or one or more JSON values. A document may be a single resource,
// a "kind: List" with items, or a top-level array of resources. Decoding is
// strict: every document needs apiVersion tabby.dev/v1 and a known kind,
// and unknown or misspelt fields (matched case-sensitively) are errors that
// name the field. Errors name the document ("document 2: …"), counting
// non-empty documents from 1.
//
// Decode neither defaults nor validates; callers call SetDefaults and
// Validate. It is safe to call on any input.
func Decode(data []byte) ([]Object, error) {
	docs, err := splitDocuments(data)
	if err != nil {
		return nil, err
	}
	var out []Object
	for i, doc := range docs {
		objs, err := decodeDocument(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		out = append(out, objs...)
	}
	return out, nil
}

// splitDocuments turns the input into JSON documents.
func splitDocuments(data []byte) ([][]byte, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && (trimmed[0] == '{' || trimmed[0] == '[') {
		docs, err := splitJSON(trimmed)
		if err == nil || len(docs) > 0 {
			return docs, err
		}
		// Not even one JSON value: perhaps YAML in flow style
		// ("{kind: IPPool, …}"). If it is not that either, report the
		// error of the language it looks more like.
		docs, yerr := splitYAMLDocuments(data)
		switch {
		case yerr == nil:
			return docs, nil
		case looksLikeJSON(trimmed):
			return nil, err
		}
		return nil, yerr
	}
	return splitYAMLDocuments(data)
}

// splitYAMLDocuments converts each non-blank YAML document to JSON.
func splitYAMLDocuments(data []byte) ([][]byte, error) {
	var docs [][]byte
	for _, doc := range splitYAML(data) {
		if isBlankYAML(doc) {
			continue
		}
		j, err := yaml.YAMLToJSONStrict(doc)
		if err == nil {
			err = checkSingleDocument(doc)
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: invalid YAML: %w", len(docs)+1, err)
		}
		docs = append(docs, j)
	}
	return docs, nil
}

// looksLikeJSON reports whether data, which starts with '{' or '[',
// continues as JSON would: with a quoted key, a closing bracket or a value.
func looksLikeJSON(data []byte) bool {
	rest := bytes.TrimLeft(data[1:], " \t\r\n")
	if len(rest) == 0 {
		return true
	}
	if data[0] == '[' {
		return bytes.IndexByte([]byte("{[\"]-0123456789tfn"), rest[0]) >= 0
	}
	return rest[0] == '"' || rest[0] == '}'
}

// checkSingleDocument catches what yaml.YAMLToJSONStrict lets through:
// content after the first node ("{a: 1} junk"), which it silently drops.
func checkSingleDocument(doc []byte) error {
	dec := yaml2.NewDecoder(bytes.NewReader(doc))
	var v any
	if err := dec.Decode(&v); err != nil {
		return err
	}
	if err := dec.Decode(&v); !errors.Is(err, io.EOF) {
		if err == nil {
			err = errors.New("more than one document")
		}
		return fmt.Errorf("unexpected content after the document: %w", err)
	}
	return nil
}

func splitJSON(data []byte) ([][]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var docs [][]byte
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			// The documents read so far tell the caller the input is
			// JSON.
			return docs, fmt.Errorf("document %d: invalid JSON: %w", len(docs)+1, err)
		}
		docs = append(docs, raw)
	}
}

// splitYAML splits on lines that are exactly "---" (optionally followed by
// spaces or a comment). A "..." document end marker line ends a document.
func splitYAML(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), len(data)+1)
	for sc.Scan() {
		line := sc.Text()
		if isDocSeparator(line) || strings.TrimRight(line, " \t\r") == "..." {
			docs = append(docs, bytes.Clone(cur.Bytes()))
			cur.Reset()
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	return append(docs, cur.Bytes())
}

func isDocSeparator(line string) bool {
	rest, ok := strings.CutPrefix(line, "---")
	if !ok {
		return false
	}
	rest = strings.TrimLeft(rest, " \t\r")
	return rest == "" || strings.HasPrefix(rest, "#")
}

// isBlankYAML reports whether a document holds only whitespace, comments
// and directives.
func isBlankYAML(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		l := strings.TrimSpace(line)
		if l != "" && !strings.HasPrefix(l, "#") && !strings.HasPrefix(l, "%") {
			return false
		}
	}
	return true
}

// decodeDocument decodes one JSON document: a resource, a List or an array.
func decodeDocument(doc []byte) ([]Object, error) {
	var generic any
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	if err := dec.Decode(&generic); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	switch g := generic.(type) {
	case nil:
		return nil, nil
	case []any:
		return decodeItems("", g)
	case map[string]any:
		kind, _ := g["kind"].(string)
		if kind != KindList {
			obj, err := decodeObject(g)
			if err != nil {
				return nil, err
			}
			return []Object{obj}, nil
		}
		for _, k := range sortedKeys(g) {
			switch k {
			case "apiVersion", "kind", "items", "metadata":
			default:
				return nil, fmt.Errorf("%s: unknown field in a List", k)
			}
		}
		if av, _ := g["apiVersion"].(string); av != "" && av != "v1" && av != APIVersion {
			return nil, fmt.Errorf("apiVersion: %q is not supported for a List (want %q or \"v1\")", av, APIVersion)
		}
		if g["items"] == nil {
			return nil, nil
		}
		items, ok := g["items"].([]any)
		if !ok {
			return nil, errors.New("items: must be a list")
		}
		return decodeItems("items", items)
	default:
		return nil, fmt.Errorf("want a resource (an object with apiVersion and kind), got %s", jsonTypeName(generic))
	}
}

func decodeItems(path string, items []any) ([]Object, error) {
	out := make([]Object, 0, len(items))
	for i, it := range items {
		m, ok := it.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s[%d]: want a resource (an object with apiVersion and kind), got %s", path, i, jsonTypeName(it))
		}
		obj, err := decodeObject(m)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", path, i, err)
		}
		out = append(out, obj)
	}
	return out, nil
}

// decodeObject decodes one resource from its generic JSON form.
func decodeObject(m map[string]any) (Object, error) {
	av, ok := m["apiVersion"].(string)
	switch {
	case m["apiVersion"] == nil:
		return nil, fmt.Errorf("apiVersion: is required (want %q)", APIVersion)
	case !ok:
		return nil, errors.New("apiVersion: must be a string")
	case av != APIVersion:
		return nil, fmt.Errorf("apiVersion: %q is not supported (want %q)", av, APIVersion)
	}
	kind, ok := m["kind"].(string)
	switch {
	case m["kind"] == nil:
		return nil, errors.New("kind: is required")
	case !ok:
		return nil, errors.New("kind: must be a string")
	case kind == KindList:
		return nil, errors.New("kind: a List cannot be nested in a List")
	}
	info, found := LookupKind(kind)
	if !found {
		return nil, fmt.Errorf("kind: %w %q", ErrUnknownKind, kind)
	}
	if info.Kind != kind {
		return nil, fmt.Errorf("kind: %w %q (did you mean %q?)", ErrUnknownKind, kind, info.Kind)
	}
	obj, err := New(kind)
	if err != nil {
		return nil, err
	}
	if err := checkFields("", m, reflect.TypeOf(obj).Elem()); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("re-encoding: %w", err)
	}
	// yaml.UnmarshalStrict (over JSON, a subset of YAML) rather than
	// encoding/json: it converts scalars to the target type, so that an
	// unquoted YAML number works as a string field ("name: 123").
	if err := yaml.UnmarshalStrict(raw, obj); err != nil {
		return nil, cleanJSONError(err)
	}
	return obj, nil
}

// cleanJSONError drops the layers of prefixes the yaml and json packages
// put before the useful part of the message.
// A type error becomes "<path>: cannot unmarshal <what> into <type>".
func cleanJSONError(err error) error {
	msg := err.Error()
	for _, p := range []string{"error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
		msg = strings.ReplaceAll(msg, p, "")
	}
	if m := typeErrorRE.FindStringSubmatch(msg); m != nil {
		msg = fmt.Sprintf("%s: cannot unmarshal %s into %s", m[2], m[1], m[3])
	}
	return errors.New(msg)
}

var typeErrorRE = regexp.MustCompile(`^cannot unmarshal (.+) into Go struct field [A-Za-z0-9_]+\.(\S+) of type (\S+)$`)
