package ctl

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/api"
)

// Source is one input of -f: a file's name and contents.
type Source struct {
	Name string
	Data []byte
}

// manifestExts are the files of a directory that -f DIR reads.
var manifestExts = []string{".yaml", ".yml", ".json"}

// ReadSources reads the inputs of -f: files, directories (their .yaml,
// .yml and .json files, sorted, not recursively) and "-" for stdin.
func ReadSources(paths []string, stdin io.Reader) ([]Source, error) {
	if len(paths) == 0 {
		return nil, errors.New("no input: give -f FILE, -f DIR or -f -")
	}
	var out []Source
	for _, p := range paths {
		if p == "-" {
			b, err := io.ReadAll(stdin)
			if err != nil {
				return nil, fmt.Errorf("reading stdin: %w", err)
			}
			out = append(out, Source{Name: "<stdin>", Data: b})
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", p, errors.Unwrap(err))
		}
		if !st.IsDir() {
			b, err := os.ReadFile(p)
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", p, err)
			}
			out = append(out, Source{Name: p, Data: b})
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", p, err)
		}
		n := 0
		for _, e := range entries {
			if e.IsDir() || !slices.Contains(manifestExts, strings.ToLower(filepath.Ext(e.Name()))) {
				continue
			}
			f := filepath.Join(p, e.Name())
			b, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", f, err)
			}
			out = append(out, Source{Name: f, Data: b})
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("%s: no .yaml, .yml or .json files", p)
		}
	}
	return out, nil
}

// item is one decoded resource and where it came from.
type item struct {
	src string
	obj api.Object
}

// decodeSources decodes every source. A source that does not decode is
// reported (with the document) and skipped; the others are still returned.
// Namespaced resources without a namespace get ns ("default" if empty); a
// resource whose namespace differs from an explicit ns is an error.
func decodeSources(srcs []Source, ns string) ([]item, []error) {
	var items []item
	var errs []error
	for _, s := range srcs {
		objs, err := api.Decode(s.Data)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.Name, err))
			continue
		}
		if len(objs) == 0 {
			errs = append(errs, fmt.Errorf("%s: no resources", s.Name))
			continue
		}
		for _, obj := range objs {
			info, _ := api.LookupKind(api.KindOf(obj))
			m := obj.GetMeta()
			if info.Namespaced {
				switch {
				case m.Namespace == "":
					m.Namespace = namespaceFor(info, ns)
				case ns != "" && m.Namespace != ns:
					errs = append(errs, fmt.Errorf("%s: %s: namespace %q does not match the namespace %q given with -n", s.Name, ref(obj), m.Namespace, ns))
					continue
				}
			}
			items = append(items, item{src: s.Name, obj: obj})
		}
	}
	return items, errs
}

// validationError renders an invalid object's problems one per line,
// indented under the object.
func validationError(it item, err error) error {
	where := ref(it.obj)
	if it.src != "" {
		where = it.src + ": " + where
	}
	var fes api.FieldErrors
	if !errors.As(err, &fes) {
		return fmt.Errorf("%s: %w", where, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s is invalid:", where)
	for _, fe := range fes {
		b.WriteString("\n  " + fe.Error())
	}
	return errors.New(b.String())
}
