package agent

import (
	"fmt"
	"net/netip"
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
	w.Pod = shortID(req.ContainerID)
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

// endpointName is the WorkloadEndpoint's name: <node>-<orchestrator>-<pod>-<endpoint>,
// made a valid DNS subdomain.
func (w workloadID) endpointName(node string) string {
	n := strings.ToLower(fmt.Sprintf("%s-%s-%s-%s", node, w.Orchestrator, w.Pod, w.Endpoint))
	n = nameUnsafe.ReplaceAllString(n, "-")
	n = strings.Trim(n, "-.")
	if len(n) > 253 {
		n = n[:253]
	}
	return n
}

// ipamHandle is the IPAM handle of a CNI attachment: network name + container ID.
func ipamHandle(network, containerID string) string {
	return network + "." + containerID
}

// buildEndpoint makes the WorkloadEndpoint for a wired pod.
func buildEndpoint(node string, w workloadID, handle string, addrs []netip.Addr, hostIf, mac string, labels map[string]string) *api.WorkloadEndpoint {
	nets := make([]string, 0, len(addrs))
	for _, a := range addrs {
		nets = append(nets, netip.PrefixFrom(a, a.BitLen()).String())
	}
	wep := &api.WorkloadEndpoint{
		Metadata: api.ObjectMeta{
			Name:      w.endpointName(node),
			Namespace: w.Namespace,
			Labels:    labels,
		},
		Spec: api.WorkloadEndpointSpec{
			Node:          node,
			Orchestrator:  w.Orchestrator,
			Pod:           w.Pod,
			ContainerID:   w.ContainerID,
			Endpoint:      w.Endpoint,
			InterfaceName: hostIf,
			MAC:           mac,
			IPNetworks:    nets,
			IPAMHandle:    handle,
		},
	}
	wep.SetDefaults()
	return wep
}
