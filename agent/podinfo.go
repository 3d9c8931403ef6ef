package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/cni"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// What a Kubernetes pod's ADD takes from the records tabby-kube-controllers
// write (the agent has no Kubernetes API rights): the pod's labels and
// service account for its endpoint, and the address-selection annotations
// of the pod and its namespace for its address.

const (
	// kubePodWait bounds how long ADD waits for a pod's record that the
	// controllers have not written yet; then ADD fails and the kubelet
	// retries, rather than run the pod under the wrong policy.
	kubePodWait = 2 * time.Second
	kubePodPoll = 50 * time.Millisecond
)

// podInfo is what ADD takes from a Kubernetes pod's records besides its
// address request.
type podInfo struct {
	// kube: the pod's record was found and used.
	kube bool
	// labels are the endpoint's: the pod's (Kubernetes), else the CNI
	// arguments'.
	labels map[string]string
	// nsLabels are the labels of the pod's namespace, for the endpoint.
	nsLabels map[string]string
	// noIPAM, when valid, is the address the pod gets without IPAM
	// (ipAddrsNoIpam, allowed by the network configuration).
	noIPAM netip.Addr
	// ports are the pod's named container ports: the endpoint's first
	// write, whose policy is programmed before ADD returns, must already
	// match named ports (the controllers keep them up to date later).
	ports []api.EndpointPort
	// readRev is the etcd revision the records were read at (0: no read,
	// not a Kubernetes pod): every write before the ADD began is at or
	// below it. The policy gate waits for the view to reach it.
	readRev int64
}

// readRecords reads a Kubernetes pod's records (readPodRecords) and
// returns them with the revision of the read; nil records outside
// Kubernetes (no pod name in the arguments: nothing is read) or in a
// cluster the controllers do not manage.
func (h *cniHandler) readRecords(ctx context.Context, w workloadID) (*api.KubePod, *api.KubeNamespace, int64, error) {
	if w.Orchestrator != "k8s" {
		return nil, nil, 0, nil
	}
	if h.readHook != nil {
		h.readHook()
	}
	ctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()
	return h.readPodRecords(ctx, w.Namespace, w.Pod)
}

// applyPodInfo fills in a Kubernetes pod's address request (v4, v6) from
// its records and returns the rest of what ADD takes from them. Outside
// Kubernetes (pod nil) the endpoint's labels are the CNI arguments'.
func (h *cniHandler) applyPodInfo(w workloadID, pod *api.KubePod, ns *api.KubeNamespace, conf *cni.NetConf, args *cni.Args, v4, v6 *ipam.AssignRequest) (podInfo, error) {
	if pod == nil {
		return podInfo{labels: args.Labels}, nil
	}
	info := podInfo{kube: true, labels: api.EndpointLabels(pod), nsLabels: ns.Labels, ports: pod.Ports}
	var err error
	if info.noIPAM, err = h.addressRequest(pod, ns, conf, v4, v6); err != nil {
		return podInfo{}, cniErr(codeIPAM, fmt.Sprintf("address annotations of pod %s/%s", w.Namespace, w.Pod), err)
	}
	return info, nil
}

// readPodRecords reads the pod's record, its namespace's and the marker
// that says whether the controllers manage the cluster in one round trip
// (one read-only transaction), and returns the first two and the
// revision of the read; nil records when there is no pod record and no
// marker (not a cluster the controllers manage).
// A managed cluster's pod record that is not written yet is waited for,
// up to kubePodWait. A namespace without a record reads as one without
// labels or annotations.
func (h *cniHandler) readPodRecords(ctx context.Context, ns, name string) (*api.KubePod, *api.KubeNamespace, int64, error) {
	podKey, nsKey := datastore.KubePodKey(ns, name), datastore.KubeNamespaceKey(ns)
	deadline := time.Now().Add(kubePodWait)
	for {
		kvs, rev, err := h.store.GetKVs(ctx, podKey, nsKey, datastore.KubeMarkerKey)
		if err != nil {
			return nil, nil, 0, cniErr(codeDatastore, "reading the records of pod "+ns+"/"+name, err)
		}
		switch podKV := kvAt(kvs, podKey); podRecordsSay(podKV, kvAt(kvs, datastore.KubeMarkerKey)) {
		case recordedPod:
			p, n, err := decodePodRecords(ns, name, podKV, kvAt(kvs, nsKey))
			return p, n, rev, err
		case notManaged:
			return nil, nil, rev, nil
		}
		if time.Now().After(deadline) {
			return nil, nil, 0, &types.Error{Code: types.ErrTryAgainLater,
				Msg: fmt.Sprintf("pod %s/%s: tabby-kube-controllers has not recorded it (waited %s); is tabby-kube-controllers running?", ns, name, kubePodWait)}
		}
		select {
		case <-ctx.Done():
			return nil, nil, 0, cniErr(codeDatastore, "waiting for the record of pod "+ns+"/"+name, ctx.Err())
		case <-time.After(kubePodPoll):
		}
	}
}

// kvAt is the record a read (or the agent's copy) holds at key, nil when
// it holds none.
func kvAt(kvs map[string]datastore.KV, key string) *datastore.KV {
	if kv, ok := kvs[key]; ok {
		return &kv
	}
	return nil
}

// recordsSay is what a pod's record and the controllers' marker say of
// the pod (podRecordsSay).
type recordsSay int

const (
	recordedPod recordsSay = iota // a Kubernetes pod: its record (and its namespace's) give what ADD takes
	notManaged                    // no record and no marker: not a cluster tabby-kube-controllers manage
	notYet                        // the marker without the pod's record: the controllers have not written it yet
)

// podRecordsSay is the one rule for a pod's records, read from etcd
// (readPodRecords) or from the agent's copy (kubeRecords.lookup); nil is a
// record that is not there.
func podRecordsSay(pod, marker *datastore.KV) recordsSay {
	switch {
	case pod != nil:
		return recordedPod
	case marker == nil:
		return notManaged
	default:
		return notYet
	}
}

// decodePodRecords decodes a pod's record and its namespace's (nsKV nil:
// a namespace without a record, which reads as one without labels or
// annotations).
func decodePodRecords(ns, name string, podKV, nsKV *datastore.KV) (*api.KubePod, *api.KubeNamespace, error) {
	var p api.KubePod
	if err := json.Unmarshal(podKV.Value, &p); err != nil {
		return nil, nil, cniErr(codeDatastore, "reading the record of pod "+ns+"/"+name, err)
	}
	var n api.KubeNamespace
	if nsKV != nil {
		if err := json.Unmarshal(nsKV.Value, &n); err != nil {
			return nil, nil, cniErr(codeDatastore, "reading the record of namespace "+ns, err)
		}
	}
	return &p, &n, nil
}

// addressRequest turns the pod's and namespace's address annotations into
// the IPAM request: pools by name or CIDR (unknown → error), a specific
// address. An ipAddrsNoIpam address is returned instead, and only when the
// network configuration allows it (feature_control.ip_addrs_no_ipam, as in
// Calico); it must lie outside every IP pool, where IPAM could hand it to
// another pod.
func (h *cniHandler) addressRequest(pod *api.KubePod, ns *api.KubeNamespace, conf *cni.NetConf, v4, v6 *ipam.AssignRequest) (netip.Addr, error) {
	r, err := api.ParseAddressRequest(pod.Annotations, ns.Annotations)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, f := range []struct {
		annotation string
		pools      []string
		req        *ipam.AssignRequest
	}{{api.AnnotationIPv4Pools, r.IPv4Pools, v4}, {api.AnnotationIPv6Pools, r.IPv6Pools, v6}} {
		for _, want := range f.pools {
			name, err := h.poolNamed(want, f.annotation)
			if err != nil {
				return netip.Addr{}, err
			}
			f.req.Pools = append(f.req.Pools, name)
		}
	}
	what := api.AnnotationIPAddrs
	if r.NoIPAM {
		what = api.AnnotationIPAddrsNoIPAM
	}
	// At most one address per family; without IPAM, one address.
	byFamily := map[bool]netip.Addr{}
	for _, a := range r.Addrs {
		if prev, dup := byFamily[a.Is6()]; dup {
			return netip.Addr{}, fmt.Errorf("%s: %s and %s: a pod gets one address of each family", what, prev, a)
		}
		byFamily[a.Is6()] = a
		req := v4
		if a.Is6() {
			req = v6
		}
		if req.Addr.IsValid() && req.Addr != a {
			return netip.Addr{}, fmt.Errorf("%s asks for %s but the runtime asks for %s", what, a, req.Addr)
		}
	}
	if !r.NoIPAM {
		for is6, a := range byFamily {
			if is6 {
				v6.Addr = a
			} else {
				v4.Addr = a
			}
		}
		return netip.Addr{}, nil
	}
	if !conf.FeatureControl.IPAddrsNoIPAM {
		return netip.Addr{}, fmt.Errorf("%s is not allowed by the network configuration (feature_control.ip_addrs_no_ipam is off)", api.AnnotationIPAddrsNoIPAM)
	}
	var a netip.Addr
	switch len(r.Addrs) {
	case 0:
		return netip.Addr{}, fmt.Errorf("%s: no address", what)
	case 1:
		a = r.Addrs[0]
	default:
		return netip.Addr{}, fmt.Errorf("%s: %d addresses, but a pod without IPAM gets one", what, len(r.Addrs))
	}
	for _, p := range h.view.Pools() {
		if pr, err := p.Prefix(); err == nil && pr.Contains(a) {
			return netip.Addr{}, fmt.Errorf("%s: %s is in IP pool %s (%s), which IPAM assigns from; use %s for it", what, a, p.Metadata.Name, pr, api.AnnotationIPAddrs)
		}
	}
	return a, nil
}

// poolNamed finds a pool by name or CIDR in the view; annotation names
// the annotation that asked, for the error.
func (h *cniHandler) poolNamed(want, annotation string) (string, error) {
	cidr, cidrErr := netip.ParsePrefix(want)
	for _, p := range h.view.Pools() {
		if p.Metadata.Name == want {
			return p.Metadata.Name, nil
		}
		if pr, err := p.Prefix(); cidrErr == nil && err == nil && pr == cidr.Masked() {
			return p.Metadata.Name, nil
		}
	}
	return "", fmt.Errorf("unknown IP pool %q (%s)", want, annotation)
}
