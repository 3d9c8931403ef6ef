package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/cni"
	"github.com/tabbynet/tabby/dataplane"
)

// workloadID identifies one pod interface on a node, the way Calico does:
// a Kubernetes pod by namespace and name (so that a new sandbox of the same
// pod reuses its host veth name), anything else by container ID.
type workloadID struct {
	Orchestrator string
	Namespace    string
	Pod          string
	Endpoint     string // the container-side interface name
	ContainerID  string
}

func newWorkloadID(req *cni.Request, args *cni.Args) workloadID {
	w := workloadID{Endpoint: req.IfName, ContainerID: req.ContainerID}
	if args != nil && args.PodName != "" {
		w.Orchestrator = "k8s"
		w.Namespace = args.PodNamespace
		if w.Namespace == "" {
			w.Namespace = "default"
		}
		w.Pod = args.PodName
		return w
	}
	w.Orchestrator = "cni"
	w.Namespace = "default"
	// The whole ID: two containers whose IDs share a prefix are two
	// workloads.
	w.Pod = safeName(req.ContainerID, maxPodName)
	return w
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// key is hashed into the host interface name.
func (w workloadID) key() string {
	k := w.Namespace + "." + w.Pod
	if w.Orchestrator != "k8s" {
		k = w.ContainerID
	}
	if w.Endpoint != "eth0" {
		k += "." + w.Endpoint
	}
	return k
}

func (w workloadID) hostIfName() string { return dataplane.HostIfName(w.key()) }

var nameUnsafe = regexp.MustCompile(`[^a-z0-9.-]+`)

// maxPodName leaves room for node, orchestrator and interface name in an
// endpoint name of at most maxEndpointName characters.
const (
	maxEndpointName = 253
	maxPodName      = 160
)

// safeName makes s a DNS-1123 subdomain of at most max characters. When
// that loses anything (case, other characters, length) it appends a hash
// of s, so that two different inputs never give the same name.
func safeName(s string, max int) string {
	n := strings.ToLower(s)
	n = nameUnsafe.ReplaceAllString(n, "-")
	n = strings.Trim(n, "-.")
	if n == s && len(n) <= max && n != "" {
		return n
	}
	sum := sha256.Sum256([]byte(s))
	suffix := hex.EncodeToString(sum[:6])
	if keep := max - len(suffix) - 1; len(n) > keep {
		n = strings.TrimRight(n[:keep], "-.")
	}
	if n == "" {
		return suffix
	}
	return n + "-" + suffix
}

// endpointName is the WorkloadEndpoint's name: <node>-<orchestrator>-<pod>-<endpoint>,
// made a valid DNS subdomain without merging two workloads into one name.
func (w workloadID) endpointName(node string) string {
	return safeName(fmt.Sprintf("%s-%s-%s-%s", node, w.Orchestrator, w.Pod, w.Endpoint), maxEndpointName)
}

// legacyEndpointName is the name agents before the full-ID names gave a
// non-Kubernetes workload (12 characters of its container ID), so that a
// DEL after an upgrade still finds its endpoint.
func (w workloadID) legacyEndpointName(node string) (string, bool) {
	if w.Orchestrator == "k8s" || len(w.ContainerID) <= 12 {
		return "", false
	}
	n := strings.ToLower(fmt.Sprintf("%s-%s-%s-%s", node, w.Orchestrator, w.ContainerID[:12], w.Endpoint))
	n = nameUnsafe.ReplaceAllString(n, "-")
	n = strings.Trim(n, "-.")
	if len(n) > maxEndpointName {
		n = n[:maxEndpointName]
	}
	return n, true
}

// sameWorkload reports whether wep is an endpoint of this workload (for
// a Kubernetes pod, of any of its sandboxes).
func (w workloadID) sameWorkload(wep *api.WorkloadEndpoint) bool {
	if wep.Spec.Orchestrator != w.Orchestrator || wep.Spec.Endpoint != w.Endpoint {
		return false
	}
	if w.Orchestrator == "k8s" {
		return wep.Metadata.Namespace == w.Namespace && wep.Spec.Pod == w.Pod
	}
	return wep.Spec.ContainerID == w.ContainerID
}

// ipamHandle is the IPAM handle of a CNI attachment: network name + container ID.
func ipamHandle(network, containerID string) string {
	return network + "." + containerID
}
