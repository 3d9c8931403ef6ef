package api

import (
	"errors"
	"fmt"
	"net/netip"
)

// RemoteEndpoint is what a node reads of a WorkloadEndpoint of another
// node: what selects it (namespace, labels, namespace labels), where it is
// (node, addresses), its named ports, its pod's name and the revision it
// was stored at. The container, interface, MAC, IPAM handle, UID,
// creation time, annotations and profiles concern the node running the
// pod and are not kept. Every agent holds every endpoint of the cluster:
// this form is 144 bytes where the whole type is 352 (docs/scale.md,
// "Compact remote endpoints").
type RemoteEndpoint struct {
	Namespace, Name string
	Node            string
	Pod             string
	Labels          map[string]string
	NamespaceLabels map[string]string
	// IPNetworks are spec.ipNetworks as stored.
	IPNetworks []string
	Ports      []EndpointPort
	// Revision is the datastore revision the endpoint was stored at (its
	// resourceVersion).
	Revision int64
}

// Remote returns the endpoint's compact form, sharing its strings, maps
// and slices; rev is its revision.
func (w *WorkloadEndpoint) Remote(rev int64) *RemoteEndpoint {
	return &RemoteEndpoint{
		Namespace: w.Metadata.Namespace, Name: w.Metadata.Name, Node: w.Spec.Node, Pod: w.Spec.Pod,
		Labels: w.Metadata.Labels, NamespaceLabels: w.Spec.NamespaceLabels,
		IPNetworks: w.Spec.IPNetworks, Ports: w.Spec.Ports, Revision: rev,
	}
}

// Addrs returns the endpoint's addresses as WorkloadEndpoint.Addrs does.
func (r *RemoteEndpoint) Addrs() ([]netip.Addr, error) { return parseIPNetworks(r.IPNetworks) }

// parseIPNetworks parses spec.ipNetworks: each entry is a CIDR or, from a
// lenient writer, a bare address. Entries that parse as neither are left
// out and reported, joined, in the error.
func parseIPNetworks(nets []string) ([]netip.Addr, error) {
	var out []netip.Addr
	var errs []error
	for i, n := range nets {
		if p, err := netip.ParsePrefix(n); err == nil {
			out = append(out, p.Addr())
		} else if a, err2 := netip.ParseAddr(n); err2 == nil {
			out = append(out, a)
		} else {
			errs = append(errs, fmt.Errorf("spec.ipNetworks[%d]: %w", i, err))
		}
	}
	return out, errors.Join(errs...)
}
