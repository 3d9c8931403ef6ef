package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeBins writes each file of the spec into a directory, its content
// naming it, so that a mix-up of sources shows.
func fakeBins(t *testing.T, specs ...Spec) string {
	t.Helper()
	dir := t.TempDir()
	for _, s := range specs {
		for _, f := range s.Files {
			if err := os.WriteFile(filepath.Join(dir, f.Src), []byte("binary "+f.Src), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// readTar returns the regular files of a tar stream by name, and every
// header in order.
func readTar(t *testing.T, r io.Reader) (map[string][]byte, []*tar.Header) {
	t.Helper()
	files := map[string][]byte{}
	var hdrs []*tar.Header
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, hdrs
		}
		if err != nil {
			t.Fatal(err)
		}
		hdrs = append(hdrs, h)
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = b
		}
	}
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// blobOf returns the blob of a digest after checking it hashes to it, as
// containerd's import does.
func blobOf(t *testing.T, files map[string][]byte, digest string) []byte {
	t.Helper()
	alg, hex, _ := strings.Cut(digest, ":")
	b, ok := files["blobs/"+alg+"/"+hex]
	if !ok {
		t.Fatalf("archive has no blob %s", digest)
	}
	if sha(b) != digest {
		t.Fatalf("blob %s hashes to %s", digest, sha(b))
	}
	return b
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
}

// TestOCIArchive reads an archive back the way an importer does: the
// layout marker, the index naming the image, the manifest, config and
// layer blobs by digest, and the files in the layer.
func TestOCIArchive(t *testing.T) {
	for _, s := range []Spec{Tabby("v7"), Pause()} {
		t.Run(s.Name, func(t *testing.T) {
			bins := fakeBins(t, s)
			out := filepath.Join(t.TempDir(), "img.tar")
			if err := Write(out, s, bins); err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			files, _ := readTar(t, bytes.NewReader(raw))
			if got := string(files["oci-layout"]); got != `{"imageLayoutVersion":"1.0.0"}` {
				t.Errorf("oci-layout %q", got)
			}
			var index struct {
				SchemaVersion int          `json:"schemaVersion"`
				Manifests     []descriptor `json:"manifests"`
			}
			if err := json.Unmarshal(files["index.json"], &index); err != nil {
				t.Fatal(err)
			}
			if index.SchemaVersion != 2 || len(index.Manifests) != 1 {
				t.Fatalf("index %+v: want schema 2 and one manifest", index)
			}
			md := index.Manifests[0]
			_, tag, _ := strings.Cut(s.Name[strings.LastIndex(s.Name, "/"):], ":")
			if diff := cmp.Diff(map[string]string{annotationContainerdName: s.Name, annotationRefName: tag}, md.Annotations); diff != "" {
				t.Errorf("index annotations (-want +got):\n%s", diff)
			}
			mb := blobOf(t, files, md.Digest)
			if md.Size != int64(len(mb)) || md.MediaType != "application/vnd.oci.image.manifest.v1+json" {
				t.Errorf("manifest descriptor %+v for %d bytes", md, len(mb))
			}
			var manifest struct {
				Config descriptor   `json:"config"`
				Layers []descriptor `json:"layers"`
			}
			if err := json.Unmarshal(mb, &manifest); err != nil {
				t.Fatal(err)
			}
			if manifest.Config.MediaType != "application/vnd.oci.image.config.v1+json" || len(manifest.Layers) != 1 ||
				manifest.Layers[0].MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
				t.Fatalf("manifest %+v", manifest)
			}
			var config struct {
				OS, Architecture string
				Config           struct{ Env, Cmd []string }
				RootFS           struct {
					DiffIDs []string `json:"diff_ids"`
				} `json:"rootfs"`
			}
			if err := json.Unmarshal(blobOf(t, files, manifest.Config.Digest), &config); err != nil {
				t.Fatal(err)
			}
			if config.OS != "linux" || config.Architecture != "amd64" {
				t.Errorf("platform %s/%s", config.OS, config.Architecture)
			}
			if diff := cmp.Diff(s.Env, config.Config.Env); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(s.Cmd, config.Config.Cmd); diff != "" {
				t.Errorf("cmd (-want +got):\n%s", diff)
			}
			zr, err := gzip.NewReader(bytes.NewReader(blobOf(t, files, manifest.Layers[0].Digest)))
			if err != nil {
				t.Fatal(err)
			}
			layer, err := io.ReadAll(zr)
			if err != nil {
				t.Fatal(err)
			}
			if len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != sha(layer) {
				t.Errorf("diff_ids %v, the layer is %s", config.RootFS.DiffIDs, sha(layer))
			}
			// The layer: each file with its content and mode, and the
			// directories above them, nothing else.
			contents, hdrs := readTar(t, bytes.NewReader(layer))
			var got []string
			for _, h := range hdrs {
				got = append(got, fmt.Sprintf("%s %v %d:%d", h.Name, fs.FileMode(h.Mode), h.Uid, h.Gid))
			}
			var want []string
			wantContents := map[string][]byte{}
			for _, e := range Entries(s) {
				name := strings.TrimPrefix(e.Path, "/")
				if e.Dir {
					name += "/"
				} else {
					wantContents[name] = []byte("binary " + e.Src)
				}
				want = append(want, fmt.Sprintf("%s %v 0:0", name, fs.FileMode(e.Mode)))
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("layer entries (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantContents, contents); diff != "" {
				t.Errorf("layer contents (-want +got):\n%s", diff)
			}

			// Reproducible: the same inputs give the same archive.
			again := filepath.Join(t.TempDir(), "again.tar")
			if err := Write(again, s, bins); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(again); err != nil || !bytes.Equal(b, raw) {
				t.Errorf("a second build differs (err %v)", err)
			}
		})
	}
}

func TestEntries(t *testing.T) {
	got := Entries(Tabby("dev"))
	want := []Entry{
		{Path: "/opt", Dir: true, Mode: 0o755},
		{Path: "/opt/tabby", Dir: true, Mode: 0o755},
		{Path: "/opt/tabby/cni-plugins", Dir: true, Mode: 0o755},
		{Path: "/opt/tabby/cni-plugins/portmap", Mode: 0o755, Src: "portmap"},
		{Path: "/usr", Dir: true, Mode: 0o755},
		{Path: "/usr/local", Dir: true, Mode: 0o755},
		{Path: "/usr/local/bin", Dir: true, Mode: 0o755},
		{Path: "/usr/local/bin/tabby", Mode: 0o755, Src: "tabby"},
		{Path: "/usr/local/bin/tabby-agent", Mode: 0o755, Src: "tabby-agent"},
		{Path: "/usr/local/bin/tabby-kube-controllers", Mode: 0o755, Src: "tabby-kube-controllers"},
		{Path: "/usr/local/bin/tabby-relay", Mode: 0o755, Src: "tabby-relay"},
		{Path: "/usr/local/bin/tabbyctl", Mode: 0o755, Src: "tabbyctl"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
}

// TestWriteMissingBinary: a binary that was not built fails the build,
// naming it, and leaves no archive behind.
func TestWriteMissingBinary(t *testing.T) {
	s := Tabby("dev")
	bins := fakeBins(t, s)
	if err := os.Remove(filepath.Join(bins, "portmap")); err != nil {
		t.Fatal(err)
	}
	outDir := t.TempDir()
	err := Write(filepath.Join(outDir, "tabby.tar"), s, bins)
	if err == nil || !strings.Contains(err.Error(), "portmap") {
		t.Fatalf("err %v, want one naming portmap", err)
	}
	if left, _ := os.ReadDir(outDir); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}
