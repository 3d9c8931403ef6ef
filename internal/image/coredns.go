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
