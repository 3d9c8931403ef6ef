package installcni

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// testRoot lays out a node's file system in a temporary directory: the
// image's binaries under image/, the host's CNI directories under host/.
type testRoot struct {
	dir string
	cfg Config
}

func newRoot(t *testing.T) *testRoot {
	t.Helper()
	dir := t.TempDir()
	r := &testRoot{dir: dir, cfg: Config{
		BinDir:       filepath.Join(dir, "host/opt/cni/bin"),
		ConfDir:      filepath.Join(dir, "host/etc/cni/net.d"),
		ConflistName: "10-tabby.conflist",
		SourceBinary: filepath.Join(dir, "image/usr/local/bin/tabby"),
		PluginsDir:   filepath.Join(dir, "image/opt/tabby/cni-plugins"),
		MTU:          1500,
		AgentSocket:  "/var/run/tabby/cni.sock",
	}}
	r.write(t, r.cfg.SourceBinary, "#!tabby shim v1\n", 0o755)
	r.write(t, filepath.Join(r.cfg.PluginsDir, "portmap"), "#!portmap from the image\n", 0o755)
	return r
}

func (r *testRoot) write(t *testing.T, path, content string, perm os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), perm); err != nil {
		t.Fatal(err)
	}
}

// files lists every file below the host directory as "path mode content"
// lines, so that tests compare whole trees.
func (r *testRoot) files(t *testing.T) []string {
	t.Helper()
	var out []string
	host := filepath.Join(r.dir, "host")
	err := filepath.WalkDir(host, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(host, path)
		line := rel + " " + fi.Mode().Perm().String()
		if filepath.Ext(path) != ".conflist" {
			line += " " + strings.TrimSpace(string(b))
		}
		out = append(out, line)
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return out
}

type fileID struct {
	Ino   uint64
	MTime time.Time
}

func statID(t *testing.T, path string) fileID {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fileID{Ino: fi.Sys().(*syscall.Stat_t).Ino, MTime: fi.ModTime()}
}

func TestInstallFreshNode(t *testing.T) {
	r := newRoot(t)
	rep, err := Install(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"etc/cni/net.d/10-tabby.conflist -rw-r--r--",
		"opt/cni/bin/portmap -rwxr-xr-x #!portmap from the image",
		"opt/cni/bin/tabby -rwxr-xr-x #!tabby shim v1",
	}
	if diff := cmp.Diff(want, r.files(t)); diff != "" {
		t.Errorf("host files (-want +got):\n%s", diff)
	}
	if len(rep.Written) != 3 || len(rep.Unchanged) != 0 {
		t.Errorf("report: written %v, unchanged %v; want 3 written", rep.Written, rep.Unchanged)
	}

	b, err := os.ReadFile(filepath.Join(r.cfg.ConfDir, r.cfg.ConflistName))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("conflist is not JSON: %v\n%s", err, b)
	}
	wantConf := map[string]any{
		"name":       "k8s-pod-network",
		"cniVersion": "1.0.0",
		"plugins": []any{
			map[string]any{"type": "tabby", "agent_socket": "/var/run/tabby/cni.sock", "mtu": float64(1500)},
			map[string]any{"type": "portmap", "snat": true, "capabilities": map[string]any{"portMappings": true}},
		},
	}
	if diff := cmp.Diff(wantConf, got); diff != "" {
		t.Errorf("conflist (-want +got):\n%s", diff)
	}
}

func TestInstallIsIdempotent(t *testing.T) {
	r := newRoot(t)
	if _, err := Install(r.cfg); err != nil {
		t.Fatal(err)
	}
	paths := []string{
		filepath.Join(r.cfg.BinDir, "tabby"),
		filepath.Join(r.cfg.BinDir, "portmap"),
		filepath.Join(r.cfg.ConfDir, r.cfg.ConflistName),
	}
	before := map[string]fileID{}
	for _, p := range paths {
		before[p] = statID(t, p)
	}
	tree := r.files(t)

	rep, err := Install(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Written) != 0 {
		t.Errorf("second run wrote %v", rep.Written)
	}
	// portmap was there already, so it is neither written nor reported.
	wantUnchanged := []string{paths[0], paths[2]}
	if diff := cmp.Diff(wantUnchanged, rep.Unchanged); diff != "" {
		t.Errorf("unchanged (-want +got):\n%s", diff)
	}
	for _, p := range paths {
		if got := statID(t, p); got != before[p] {
			t.Errorf("%s: inode/mtime %v after the second run, was %v", p, got, before[p])
		}
	}
	if diff := cmp.Diff(tree, r.files(t)); diff != "" {
		t.Errorf("tree changed (-first +second):\n%s", diff)
	}
}

// TestInstallReplacesWhatDiffers: a changed MTU, a new shim or a wrong mode
// is each fixed, and only that file is rewritten.
func TestInstallReplacesWhatDiffers(t *testing.T) {
	tests := []struct {
		name    string
		change  func(t *testing.T, r *testRoot)
		written string // base name of the one file rewritten
	}{
		{"mtu", func(t *testing.T, r *testRoot) { r.cfg.MTU = 9000 }, "10-tabby.conflist"},
		{"agent socket", func(t *testing.T, r *testRoot) { r.cfg.AgentSocket = "/run/tabby/cni.sock" }, "10-tabby.conflist"},
		{"new shim", func(t *testing.T, r *testRoot) { r.write(t, r.cfg.SourceBinary, "#!tabby shim v2\n", 0o755) }, "tabby"},
		{"conflist edited on the node", func(t *testing.T, r *testRoot) {
			r.write(t, filepath.Join(r.cfg.ConfDir, r.cfg.ConflistName), "{}", 0o644)
		}, "10-tabby.conflist"},
		{"shim mode", func(t *testing.T, r *testRoot) {
			if err := os.Chmod(filepath.Join(r.cfg.BinDir, "tabby"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "tabby"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRoot(t)
			if _, err := Install(r.cfg); err != nil {
				t.Fatal(err)
			}
			tt.change(t, r)
			rep, err := Install(r.cfg)
			if err != nil {
				t.Fatal(err)
			}
			var written []string
			for _, p := range rep.Written {
				written = append(written, filepath.Base(p))
			}
			if diff := cmp.Diff([]string{tt.written}, written); diff != "" {
				t.Errorf("written (-want +got):\n%s", diff)
			}
			// And the result is again a fixed point.
			rep, err = Install(r.cfg)
			if err != nil || len(rep.Written) != 0 {
				t.Errorf("third run: written %v, err %v", rep.Written, err)
			}
		})
	}
}

// TestInstallReplacesAtomically: an existing file is replaced by rename, so
// a reader holding the old file still reads all of the old content, and the
// path switches to a new inode holding all of the new content.
func TestInstallReplacesAtomically(t *testing.T) {
	r := newRoot(t)
	shimPath := filepath.Join(r.cfg.BinDir, "tabby")
	oldShim := "#!old shim that is running right now\n"
	r.write(t, shimPath, oldShim, 0o755)
	confPath := filepath.Join(r.cfg.ConfDir, r.cfg.ConflistName)
	oldConf := `{"name":"old","cniVersion":"0.4.0","plugins":[{"type":"tabby"}]}`
	r.write(t, confPath, oldConf, 0o644)

	held := map[string]*os.File{}
	ids := map[string]fileID{}
	for _, p := range []string{shimPath, confPath} {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		held[p] = f
		ids[p] = statID(t, p)
	}

	if _, err := Install(r.cfg); err != nil {
		t.Fatal(err)
	}
	for p, old := range map[string]string{shimPath: oldShim, confPath: oldConf} {
		b, err := readAllAt(held[p])
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != old {
			t.Errorf("%s: the old file as held open now reads %q; it was written in place, not replaced", filepath.Base(p), b)
		}
		if statID(t, p).Ino == ids[p].Ino {
			t.Errorf("%s: same inode after the replacement", filepath.Base(p))
		}
	}
	if b, _ := os.ReadFile(shimPath); string(b) != "#!tabby shim v1\n" {
		t.Errorf("shim after install: %q", b)
	}
	assertNoTemp(t, r)
}

func readAllAt(f *os.File) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	b := make([]byte, fi.Size())
	_, err = f.ReadAt(b, 0)
	return b, err
}

func assertNoTemp(t *testing.T, r *testRoot) {
	t.Helper()
	for _, d := range []string{r.cfg.BinDir, r.cfg.ConfDir} {
		m, err := filepath.Glob(filepath.Join(d, tempPrefix+"*"))
		if err != nil {
			t.Fatal(err)
		}
		if len(m) > 0 {
			t.Errorf("temporary files left: %v", m)
		}
	}
}

// TestInstallNoPartialFileVisible: while installs alternate between two
// configurations, a reader polling the path only ever sees one of the two
// complete files.
func TestInstallNoPartialFileVisible(t *testing.T) {
	r := newRoot(t)
	// A long configuration, so that a write in place would be observable
	// half done.
	pad := strings.Repeat(" ", 256<<10)
	r.cfg.Template = strings.Replace(DefaultTemplate, `"name"`, pad+`"name"`, 1)
	confPath := filepath.Join(r.cfg.ConfDir, r.cfg.ConflistName)
	var want [2][]byte
	for i, mtu := range []int{1500, 9000} {
		b, _, err := Render(r.cfg.Template, mtu, r.cfg.AgentSocket)
		if err != nil {
			t.Fatal(err)
		}
		want[i] = b
	}
	r.cfg.MTU = 1500
	if _, err := Install(r.cfg); err != nil {
		t.Fatal(err)
	}

	done := make(chan struct{})
	var wg sync.WaitGroup
	var reads, bad int
	var badSample []byte
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			b, err := os.ReadFile(confPath)
			reads++
			if err != nil || !(bytes.Equal(b, want[0]) || bytes.Equal(b, want[1])) {
				bad++
				if badSample == nil {
					badSample = b
				}
			}
		}
	}()
	for i := 0; i < 60; i++ {
		r.cfg.MTU = []int{9000, 1500}[i%2]
		rep, err := Install(r.cfg)
		if err != nil {
			close(done)
			wg.Wait()
			t.Fatal(err)
		}
		if len(rep.Written) != 1 {
			t.Errorf("run %d wrote %v, want the conflist only", i, rep.Written)
		}
	}
	close(done)
	wg.Wait()
	if bad > 0 {
		t.Errorf("%d of %d reads saw a partial or missing file (first: %d bytes)", bad, reads, len(badSample))
	}
	assertNoTemp(t, r)
}

// TestInstallFailedWriteLeavesNothing: when the rename cannot happen (the
// destination is a directory), the error names the file and no temporary
// file is left behind; the other files are still installed.
func TestInstallFailedWriteLeavesNothing(t *testing.T) {
	r := newRoot(t)
	blocker := filepath.Join(r.cfg.BinDir, "tabby", "in-the-way")
	r.write(t, blocker, "x", 0o644)
	_, err := Install(r.cfg)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(r.cfg.BinDir, "tabby")) {
		t.Fatalf("err = %v, want one naming the shim's path", err)
	}
	assertNoTemp(t, r)
	if b, err := os.ReadFile(filepath.Join(r.cfg.BinDir, "portmap")); err != nil || string(b) != "#!portmap from the image\n" {
		t.Errorf("portmap not installed despite the shim's failure: %q, %v", b, err)
	}
	// The configuration must not be written while the shim is missing.
	if _, err := os.Stat(filepath.Join(r.cfg.ConfDir, r.cfg.ConflistName)); !os.IsNotExist(err) {
		t.Errorf("conflist written although the shim could not be installed (stat err %v)", err)
	}
}

func TestInstallKeepsTheHostsChainedPlugins(t *testing.T) {
	r := newRoot(t)
	hostPortmap := filepath.Join(r.cfg.BinDir, "portmap")
	r.write(t, hostPortmap, "#!the host's own portmap\n", 0o755)
	rep, err := Install(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(rep.Written, hostPortmap) {
		t.Errorf("portmap reported written")
	}
	if b, _ := os.ReadFile(hostPortmap); string(b) != "#!the host's own portmap\n" {
		t.Errorf("the host's portmap was replaced: %q", b)
	}
}

func TestInstallMissingChainedPlugin(t *testing.T) {
	r := newRoot(t)
	r.cfg.PluginsDir = ""
	_, err := Install(r.cfg)
	if err == nil || !strings.Contains(err.Error(), `"portmap"`) {
		t.Fatalf("err = %v, want one naming portmap", err)
	}
	if _, err := os.Stat(filepath.Join(r.cfg.ConfDir, r.cfg.ConflistName)); !os.IsNotExist(err) {
		t.Errorf("conflist written although portmap is missing (stat err %v)", err)
	}
}

func TestInstallReportsShadowingConfigurations(t *testing.T) {
	r := newRoot(t)
	for _, name := range []string{"05-other.conflist", "10-tabby.conf", "99-loopback.conf", "00-notes.txt"} {
		r.write(t, filepath.Join(r.cfg.ConfDir, name), "{}", 0o644)
	}
	rep, err := Install(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range rep.Shadowed {
		got = append(got, filepath.Base(p))
	}
	if diff := cmp.Diff([]string{"05-other.conflist", "10-tabby.conf"}, got); diff != "" {
		t.Errorf("shadowed (-want +got):\n%s", diff)
	}
}

func TestUninstallRemovesOnlyItsFiles(t *testing.T) {
	r := newRoot(t)
	r.write(t, filepath.Join(r.cfg.BinDir, "loopback"), "#!loopback", 0o755)
	r.write(t, filepath.Join(r.cfg.ConfDir, "20-other.conflist"), "{}", 0o644)
	r.write(t, filepath.Join(r.cfg.ConfDir, "tabby-notes.txt"), "operator's notes", 0o644)
	if _, err := Install(r.cfg); err != nil {
		t.Fatal(err)
	}
	// What an install killed between write and rename leaves.
	stale := filepath.Join(r.cfg.ConfDir, tempPrefix+"10-tabby.conflist-123.tmp")
	r.write(t, stale, "{", 0o600)

	rep, err := Uninstall(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"etc/cni/net.d/20-other.conflist -rw-r--r--",
		"etc/cni/net.d/tabby-notes.txt -rw-r--r-- operator's notes",
		"opt/cni/bin/loopback -rwxr-xr-x #!loopback",
		// portmap stays: other networks on the node may chain it.
		"opt/cni/bin/portmap -rwxr-xr-x #!portmap from the image",
	}
	if diff := cmp.Diff(want, r.files(t)); diff != "" {
		t.Errorf("host files after uninstall (-want +got):\n%s", diff)
	}
	wantRemoved := []string{
		filepath.Join(r.cfg.ConfDir, "10-tabby.conflist"),
		filepath.Join(r.cfg.BinDir, "tabby"),
		stale,
	}
	if diff := cmp.Diff(wantRemoved, rep.Removed); diff != "" {
		t.Errorf("removed (-want +got):\n%s", diff)
	}

	rep, err = Uninstall(r.cfg)
	if err != nil {
		t.Fatalf("second uninstall: %v", err)
	}
	if len(rep.Removed) != 0 {
		t.Errorf("second uninstall removed %v", rep.Removed)
	}
}

func TestUninstallNeedsNoSourceBinary(t *testing.T) {
	r := newRoot(t)
	if _, err := Install(r.cfg); err != nil {
		t.Fatal(err)
	}
	r.cfg.SourceBinary = ""
	if _, err := Uninstall(r.cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r.cfg.BinDir, "tabby")); !os.IsNotExist(err) {
		t.Errorf("shim still there (stat err %v)", err)
	}
}
