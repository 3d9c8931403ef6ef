// Command mkimage writes Tabby's node image and the lab's pause image as OCI
// archives for `ctr -n k8s.io images import`, without a container engine
// (package internal/image):
//
//	mkimage -bin bin -tag dev -out bin/images
//
// writes bin/images/tabby.oci.tar (docker.io/library/tabby:<tag>, from the
// binaries in -bin) and bin/images/pause.oci.tar (registry.k8s.io/pause:3.10,
// from -bin/pause) and bin/images/echo.oci.tar
// (docker.io/library/tabby-echo:lab, the lab's Service backend, from
// -bin/echo). With -coredns FILE it also writes
// bin/images/coredns.oci.tar (registry.k8s.io/coredns/coredns:v1.15.0, the
// lab's cluster DNS) from that binary (`make kube-bins` builds it); with
// -agnhost DIR, bin/images/agnhost.oci.tar (image.AgnhostName, for the
// network-policy-api conformance suite) from DIR's agnhost and bash
// (`make npapi-bins`). `make images` builds the binaries and runs it.
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
	coredns := flag.String("coredns", "", "also write coredns.oci.tar from this coredns binary (scripts/coredns-bins.sh)")
	agnhost := flag.String("agnhost", "", "also write agnhost.oci.tar from this directory's agnhost and bash (scripts/npapi-bins.sh)")
	flag.Parse()
	if err := run(*bin, *tag, *out, *coredns); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	if *agnhost == "" {
		return
	}
	p := filepath.Join(*out, "agnhost.oci.tar")
	if err := image.Write(p, image.Agnhost(), *agnhost); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	fmt.Printf("%s %s\n", p, image.AgnhostName)
}

func run(bin, tag, out, coredns string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for file, spec := range map[string]image.Spec{"tabby.oci.tar": image.Tabby(tag), "pause.oci.tar": image.Pause(), "echo.oci.tar": image.Echo()} {
		p := filepath.Join(out, file)
		if err := image.Write(p, spec, bin); err != nil {
			return err
		}
		fmt.Printf("%s %s\n", p, spec.Name)
	}
	if coredns == "" {
		return nil
	}
	// The spec names the file "coredns": its directory is the source.
	if filepath.Base(coredns) != "coredns" {
		return fmt.Errorf("-coredns %s: the binary must be named coredns", coredns)
	}
	p := filepath.Join(out, "coredns.oci.tar")
	if err := image.Write(p, image.CoreDNS(), filepath.Dir(coredns)); err != nil {
		return err
	}
	fmt.Printf("%s %s\n", p, image.CoreDNSName)
	return nil
}
