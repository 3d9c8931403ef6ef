// Command mkimage writes Tabby's node image and the lab's pause image as OCI
// archives for `ctr -n k8s.io images import`, without a container engine
// (package internal/image):
//
//	mkimage -bin bin -tag dev -out bin/images
//
// writes bin/images/tabby.oci.tar (docker.io/library/tabby:<tag>, from the
// binaries in -bin) and bin/images/pause.oci.tar (registry.k8s.io/pause:3.10,
// from -bin/pause). `make images` builds the binaries and runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tabbynet/tabby/internal/image"
)

func main() {
	bin := flag.String("bin", "bin", "directory holding the built binaries, portmap and pause")
	tag := flag.String("tag", "dev", "tag of the Tabby image")
	out := flag.String("out", "bin/images", "directory to write the archives into")
	flag.Parse()
	if err := run(*bin, *tag, *out); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(bin, tag, out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for file, spec := range map[string]image.Spec{"tabby.oci.tar": image.Tabby(tag), "pause.oci.tar": image.Pause()} {
		p := filepath.Join(out, file)
		if err := image.Write(p, spec, bin); err != nil {
			return err
		}
		fmt.Printf("%s %s\n", p, spec.Name)
	}
	return nil
}
