package image

// CoreDNSName is the reference of the lab's CoreDNS image: the upstream
// name and release (kubeadm's), so that the lab's DNS Deployment reads as
// a cluster's, though the image is our own build of CoreDNS
// (scripts/coredns-build: only the plugins a cluster's DNS needs).
const CoreDNSName = "registry.k8s.io/coredns/coredns:v1.15.0"

// CoreDNS is the cluster DNS image: the one static coredns binary of
// `make kube-bins` (scripts/coredns-bins.sh), run as upstream's image runs
// it (/coredns -conf <Corefile>, the Corefile given by the Deployment).
func CoreDNS() Spec {
	return Spec{
		Name:  CoreDNSName,
		Files: []File{{"coredns", "/coredns", 0o755}},
		Env:   []string{PathEnv},
		Cmd:   []string{"/coredns"},
	}
}
