package image

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestEntrypointImages: the CoreDNS and echo images start their program
// as entrypoint, so that a Deployment's args (-conf, -listen) are its
// arguments, not a command of their own.
func TestEntrypointImages(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"coredns", "echo"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("#!/bin/true\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []Spec{CoreDNS(), Echo()} {
		img, err := Image(s, dir)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		want := []string{s.Files[0].Dst}
		if !slices.Equal(cf.Config.Entrypoint, want) || len(cf.Config.Cmd) != 0 {
			t.Errorf("%s: entrypoint %v cmd %v, want entrypoint %v and no cmd", s.Name, cf.Config.Entrypoint, cf.Config.Cmd, want)
		}
	}
}
