// Package image assembles Tabby's container images without a container
// engine: a Spec names the files an image holds (taken from a directory of
// built binaries), its environment and command; WriteOCIArchive writes it as
// an OCI image layout in a tar archive, the form `ctr -n k8s.io images
// import` loads into a node's containerd. The archive is reproducible: the
// same binaries give the same bytes, digests and image ID.
//
// The Tabby image has what the agent needs at run time and no more: the
// static binaries (the agent programs its firewall through nf_tables over
// netlink, so no iptables userland; see docs/kubernetes-lab.md) and portmap
// for install-cni. The Dockerfile builds the same files for people with
// Docker; manifests.TestImageMatchesDockerfile checks the two agree.
package image

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one regular file of an image.
type File struct {
	Src  string // file name in the source directory given to WriteOCIArchive
	Dst  string // absolute path in the image
	Mode int64  // permission bits
}

// Spec describes a single-layer image.
type Spec struct {
	// Name is the full reference containerd records, e.g.
	// docker.io/library/tabby:dev (what the manifests' `tabby:dev` means).
	Name  string
	Files []File
	Env   []string
	Cmd   []string
	// Entrypoint, when set, is the image's entrypoint: a container's args
	// replace Cmd and follow it.
	Entrypoint []string
}

// PathEnv is the PATH of both images: the Debian default, so that
// `command: ["tabby-agent"]` resolves as it did in a Debian-based image.
const PathEnv = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// TabbyName is the reference of the manifests' `image: tabby:dev` with tag.
func TabbyName(tag string) string { return "docker.io/library/tabby:" + tag }

// PauseName is the reference of the pause image the lab builds: the name
// containerd's sandbox_image and the uninstall manifest use, so that a lab
// node needs no registry. It is our own program (internal/cmd/pause), not
// the upstream image.
const PauseName = "registry.k8s.io/pause:3.10"

// Tabby is the node image: tabby-agent and install-cni's tabby next to it,
// tabbyctl, tabby-kube-controllers and tabby-relay (their Deployments run
// the same image), and
// portmap where install-cni looks for it (installcni.Default().PluginsDir).
func Tabby(tag string) Spec {
	return Spec{
		Name: TabbyName(tag),
		Files: []File{
			{"tabby-agent", "/usr/local/bin/tabby-agent", 0o755},
			{"tabby", "/usr/local/bin/tabby", 0o755},
			{"tabbyctl", "/usr/local/bin/tabbyctl", 0o755},
			{"tabby-kube-controllers", "/usr/local/bin/tabby-kube-controllers", 0o755},
			{"tabby-relay", "/usr/local/bin/tabby-relay", 0o755},
			{"portmap", "/opt/tabby/cni-plugins/portmap", 0o755},
		},
		Env: []string{PathEnv},
		Cmd: []string{"tabby-agent"},
	}
}

// Pause is the pod sandbox image: one static program that sleeps until
// SIGTERM or SIGINT and reaps orphans.
func Pause() Spec {
	return Spec{
		Name:  PauseName,
		Files: []File{{"pause", "/pause", 0o755}},
		Env:   []string{PathEnv},
		Cmd:   []string{"/pause"},
	}
}

// epoch is every timestamp in the archive: fixed, for reproducible digests.
var epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Annotations on the index's manifest descriptor: containerd names the
// imported image after the first; the second is the OCI layout's own tag.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// Image builds the spec's image (linux/amd64, one layer) from srcDir.
func Image(s Spec, srcDir string) (v1.Image, error) {
	layerTar, err := layerTar(s, srcDir)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer of %s: %w", s.Name, err)
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "tabby internal/cmd/mkimage"},
	})
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", s.Name, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Env = slices.Clone(s.Env)
	cf.Config.Cmd = slices.Clone(s.Cmd)
	cf.Config.Entrypoint = slices.Clone(s.Entrypoint)
	return mutate.ConfigFile(img, cf)
}

// layerTar is the image's only layer: the parent directories (0755) and
// files, in path order, owned by root, at epoch.
func layerTar(s Spec, srcDir string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range Entries(s) {
		h := &tar.Header{Name: strings.TrimPrefix(e.Path, "/"), Mode: e.Mode, ModTime: epoch, Format: tar.FormatPAX}
		if e.Dir {
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
			if err := tw.WriteHeader(h); err != nil {
				return nil, err
			}
			continue
		}
		b, err := os.ReadFile(filepath.Join(srcDir, e.Src))
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", s.Name, err)
		}
		h.Typeflag, h.Size = tar.TypeReg, int64(len(b))
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Entry is one entry of an image's layer.
type Entry struct {
	Path string // absolute
	Dir  bool
	Mode int64
	Src  string // files only
}

// Entries lists what the layer holds, in order: every file of the spec and
// each directory above one, sorted by path.
func Entries(s Spec) []Entry {
	dirs := map[string]bool{}
	var out []Entry
	for _, f := range s.Files {
		for d := path.Dir(f.Dst); d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			out = append(out, Entry{Path: d, Dir: true, Mode: 0o755})
		}
		out = append(out, Entry{Path: f.Dst, Mode: f.Mode, Src: f.Src})
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// WriteOCIArchive writes img as an OCI image layout in a tar archive
// (oci-layout, index.json, blobs/sha256/…) naming it name.
func WriteOCIArchive(w io.Writer, img v1.Image, name string) error {
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	mdigest, err := img.Digest()
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	cdigest, err := img.ConfigName()
	if err != nil {
		return err
	}
	_, tag, ok := strings.Cut(name[strings.LastIndex(name, "/")+1:], ":")
	if !ok {
		return fmt.Errorf("image name %q has no tag", name)
	}
	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType:   types.OCIManifestSchema1,
			Size:        int64(len(manifest)),
			Digest:      mdigest,
			Annotations: map[string]string{annotationContainerdName: name, annotationRefName: tag},
			Platform:    &v1.Platform{OS: "linux", Architecture: "amd64"},
		}},
	})
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	add := func(name string, b []byte) error {
		h := &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b)), ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := add("index.json", index); err != nil {
		return err
	}
	if err := add(blob(mdigest), manifest); err != nil {
		return err
	}
	if err := add(blob(cdigest), config); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		b, err := io.ReadAll(rc)
		if cerr := rc.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if err := add(blob(d), b); err != nil {
			return err
		}
	}
	return tw.Close()
}

// Write builds the spec's image from srcDir and writes its archive to
// path, through a temporary file renamed into place.
func Write(path string, s Spec, srcDir string) error {
	img, err := Image(s, srcDir)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".mkimage-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := WriteOCIArchive(f, img, s.Name); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
