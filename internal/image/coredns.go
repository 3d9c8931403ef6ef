package image

// CoreDNSName is the reference of the lab's CoreDNS image: the upstream
// name and release (kubeadm's), so that the lab's DNS Deployment reads as
// a cluster's, though the image is our own build of CoreDNS
// (scripts/coredns-build: only the plugins a cluster's DNS needs).
const CoreDNSName = "registry.k8s.io/coredns/coredns:v1.15.0"

// CoreDNS is the cluster DNS image: the one static coredns binary of
// `make kube-bins` (scripts/coredns-bins.sh), its entrypoint as upstream's
// image has it, so that a Deployment's args (-conf <Corefile>) follow it.
func CoreDNS() Spec {
	return Spec{
		Name:       CoreDNSName,
		Files:      []File{{"coredns", "/coredns", 0o755}},
		Env:        []string{PathEnv},
		Entrypoint: []string{"/coredns"},
	}
}

// EchoName is the reference of the lab's Service backend image
// (internal/cmd/echo), with a tag of its own: the lab's manifests name it
// whatever tag Tabby's image has.
const EchoName = "docker.io/library/tabby-echo:lab"

// Echo is the lab's Service backend: one static program answering each TCP
// connection with the pod's name and the client's address; a container's
// args (-listen) follow its entrypoint.
func Echo() Spec {
	return Spec{
		Name:       EchoName,
		Files:      []File{{"echo", "/echo", 0o755}},
		Env:        []string{PathEnv},
		Entrypoint: []string{"/echo"},
	}
}

// AgnhostName is the reference of the network-policy-api conformance
// suite's pod image: the name and tag its base manifests use, so that a
// lab node needs no registry. It is agnhost built from k8s.io/kubernetes at
// the lab's release with a static bash (scripts/npapi-bins.sh), the two
// files the suite's pods run (`/bin/bash -c "/agnhost ..."`), not the
// upstream image.
const AgnhostName = "registry.k8s.io/e2e-test-images/agnhost:2.45"

// Agnhost is that image: entrypoint /agnhost and command pause, as
// upstream's, so that a container with no command pauses and one with a
// command runs it.
func Agnhost() Spec {
	return Spec{
		Name:       AgnhostName,
		Files:      []File{{"agnhost", "/agnhost", 0o755}, {"bash", "/bin/bash", 0o755}},
		Env:        []string{PathEnv},
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
	}
}
