package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/embedded"
	"github.com/tabbynet/tabby/datastore/storetest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// fixedNow is the clock of every command run by the tests.
var fixedNow = time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)

// harness runs tabbyctl commands in process against an embedded etcd and
// records a transcript (command, stdout, stderr, error) to compare with a
// golden file.
type harness struct {
	t     *testing.T
	store *datastore.Store
	etcd  *embedded.Etcd
	dir   string
	env   map[string]string
	host  string
	// hook, if set, adjusts each app before it runs (for example the
	// command runner of --live).
	hook func(*app)
	log  strings.Builder
}

// newHarness starts etcd; commands find it through TABBY_ETCD_ENDPOINTS.
func newHarness(t *testing.T) *harness {
	t.Helper()
	s, e := storetest.NewWithEtcd(t)
	return &harness{
		t: t, store: s, etcd: e, dir: t.TempDir(), host: "node-1",
		env: map[string]string{"TABBY_ETCD_ENDPOINTS": strings.Join(e.Endpoints(), ",")},
	}
}

// newOfflineHarness has no etcd, for commands that do not need one.
func newOfflineHarness(t *testing.T) *harness {
	return &harness{t: t, dir: t.TempDir(), host: "node-1", env: map[string]string{}}
}

// file writes a file into the test's directory and returns its path.
func (h *harness) file(name, content string) string {
	h.t.Helper()
	p := filepath.Join(h.dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
	return p
}

// run runs one command with stdin and records it.
func (h *harness) run(stdin string, args ...string) (stdout string, err error) {
	h.t.Helper()
	a := newApp()
	a.getenv = func(k string) string { return h.env[k] }
	a.hostname = func() (string, error) { return h.host, nil }
	a.now = func() time.Time { return fixedNow }
	a.version = "v0.0.0-test"
	a.stdin = strings.NewReader(stdin)
	a.defaultConfig = filepath.Join(h.dir, "no-such-config.yaml")
	if h.hook != nil {
		h.hook(a)
	}
	root := a.rootCmd()
	var out, errOut bytes.Buffer
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetIn(strings.NewReader(stdin))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = root.ExecuteContext(ctx)
	if cerr := a.close(); cerr != nil {
		h.t.Errorf("closing: %v", cerr)
	}

	h.log.WriteString("$ tabbyctl " + quoteArgs(args) + "\n")
	h.log.WriteString(out.String())
	if errOut.Len() > 0 {
		h.log.WriteString("[stderr]\n" + errOut.String())
	}
	if err != nil {
		h.log.WriteString("[error]\n" + err.Error() + "\n")
	}
	h.log.WriteString("\n")
	return out.String(), err
}

// ok runs a command that must succeed.
func (h *harness) ok(args ...string) string {
	h.t.Helper()
	out, err := h.run("", args...)
	if err != nil {
		h.t.Errorf("tabbyctl %s: %v", quoteArgs(args), err)
	}
	return out
}

// fail runs a command that must fail.
func (h *harness) fail(args ...string) error {
	h.t.Helper()
	_, err := h.run("", args...)
	if err == nil {
		h.t.Errorf("tabbyctl %s: succeeded, want an error", quoteArgs(args))
	}
	return err
}

func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t'\"") {
			a = "'" + a + "'"
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

var normalizers = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`(uid: |"uid": ")[0-9a-f-]{36}`), "${1}<uid>"},
	{regexp.MustCompile(`(creationTimestamp: )"?[0-9T:Z-]+"?`), "${1}<time>"},
	{regexp.MustCompile(`("creationTimestamp": ")[0-9T:Z-]+`), "${1}<time>"},
	{regexp.MustCompile(`(resourceVersion: )"?[0-9]+"?`), "${1}<rv>"},
	{regexp.MustCompile(`("resourceVersion": ")[0-9]+`), "${1}<rv>"},
	{regexp.MustCompile(`(revision[ :"]+)[0-9]+`), "${1}<rev>"},
}

// normalize replaces what differs between runs: the etcd endpoint, the
// temporary directory, uids, timestamps and revisions.
func (h *harness) normalize(s string) string {
	if h.etcd != nil {
		for _, ep := range h.etcd.Endpoints() {
			s = strings.ReplaceAll(s, ep, "<etcd>")
		}
	}
	s = strings.ReplaceAll(s, h.dir, "<dir>")
	for _, n := range normalizers {
		s = n.re.ReplaceAllString(s, n.repl)
	}
	return s
}

// golden compares the transcript with testdata/<name>.golden.
func (h *harness) golden(name string) {
	h.t.Helper()
	got := h.normalize(h.log.String())
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			h.t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		h.t.Fatalf("reading golden file (run with -update to create it): %v", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		h.t.Errorf("%s differs (-want +got; run with -update to accept):\n%s", path, diff)
	}
}

// show adds a file's contents to the transcript.
func (h *harness) show(path string) {
	h.t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		h.t.Fatal(err)
	}
	h.log.WriteString("# " + path + "\n" + string(b) + "\n")
}
