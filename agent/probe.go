package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/policy"
)

// The safety rules of POST /policy/probe (docs/explain.md, `--live`).
const (
	// probeRate and probeBurst bound the probes one agent sends: a few a
	// second, whoever asks.
	probeRate  = rate.Limit(5)
	probeBurst = 10
	// maxProbeBody bounds the request; a probe fits in a hundred bytes.
	maxProbeBody = 4096
	// The probe's timeout: default, least and most.
	defaultProbeTimeout = 2 * time.Second
	minProbeTimeout     = 100 * time.Millisecond
	maxProbeTimeout     = 5 * time.Second
)

// probeRoutes adds `explain packet --live`'s endpoints to the status API:
//
//	POST /policy/probe   one probe from a pod on this node (ProbeRequest)
//	GET  /policy/counters the kernel's counters of every policy rule
func (a *Agent) probeRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /policy/probe", a.serveProbe)
	mux.HandleFunc("GET /policy/counters", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, a.ruleCounters(r.Context()))
	})
}

func (a *Agent) serveProbe(w http.ResponseWriter, r *http.Request) {
	var req policy.ProbeRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxProbeBody+1))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		http.Error(w, "malformed probe request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if a.policy == nil || a.deps.Prober == nil {
		http.Error(w, "this agent sends no probes (no policy enforced here)", http.StatusServiceUnavailable)
		return
	}
	spec, code, err := a.probeSpec(req)
	if err != nil {
		http.Error(w, err.Error(), code)
		return
	}
	if !a.probes.Allow() {
		w.Header().Set("Retry-After", "1")
		http.Error(w, fmt.Sprintf("too many probes: at most %v a second (burst %d) from one agent", float64(probeRate), probeBurst), http.StatusTooManyRequests)
		return
	}
	res, err := a.deps.Prober(r.Context(), spec)
	if err != nil {
		a.log.Warn("probe failed", "pod", req.Namespace+"/"+req.Pod, "dst", spec.Dst, "err", err)
		http.Error(w, "probe: "+err.Error(), http.StatusInternalServerError)
		return
	}
	a.log.Info("probe sent", "pod", req.Namespace+"/"+req.Pod, "dst", spec.Dst, "proto", spec.Proto, "outcome", res.Outcome)
	writeJSON(w, policy.ProbeAnswer{Node: a.cfg.NodeName, Src: spec.Src, Dst: spec.Dst, Proto: spec.Proto,
		Outcome: res.Outcome, Passed: res.Passed, NetNS: res.NetNS, Took: res.Took, Detail: res.Detail})
}

// probeSpec checks a probe request against the safety rules: a pod on this
// node, a destination inside the cluster, TCP or UDP to a real port.
func (a *Agent) probeSpec(req policy.ProbeRequest) (dataplane.ProbeSpec, int, error) {
	var errs []error
	dst, err := netip.ParseAddr(req.Dst)
	if err != nil {
		errs = append(errs, fmt.Errorf("dst: %.60q is not an address", req.Dst))
	}
	if req.Proto != "tcp" && req.Proto != "udp" {
		errs = append(errs, fmt.Errorf("proto: %.20q: want tcp or udp", req.Proto))
	}
	if req.Port < 1 || req.Port > 65535 {
		errs = append(errs, fmt.Errorf("port: %d: want 1 to 65535", req.Port))
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if req.TimeoutMS == 0 {
		timeout = defaultProbeTimeout
	} else if timeout < minProbeTimeout || timeout > maxProbeTimeout {
		errs = append(errs, fmt.Errorf("timeoutMs: %d: want %d to %d", req.TimeoutMS, minProbeTimeout.Milliseconds(), maxProbeTimeout.Milliseconds()))
	}
	if req.Namespace == "" || req.Pod == "" {
		errs = append(errs, errors.New("namespace, pod: both required"))
	}
	if len(errs) > 0 {
		return dataplane.ProbeSpec{}, http.StatusBadRequest, errors.Join(errs...)
	}
	dst = dst.WithZone("").Unmap()
	if !a.insideCluster(dst) {
		return dataplane.ProbeSpec{}, http.StatusForbidden,
			fmt.Errorf("dst: %s is in no IP pool and is no node's address: probes never leave the cluster", dst)
	}
	wep := a.localPod(req.Namespace, req.Pod)
	if wep == nil {
		return dataplane.ProbeSpec{}, http.StatusNotFound, fmt.Errorf("pod %s/%s: no workload endpoint on node %s", req.Namespace, req.Pod, a.cfg.NodeName)
	}
	addrs, _ := wep.Addrs()
	i := slices.IndexFunc(addrs, func(s netip.Addr) bool { return s.Is4() == dst.Is4() })
	if i < 0 {
		return dataplane.ProbeSpec{}, http.StatusBadRequest, fmt.Errorf("pod %s/%s has no IPv%d address to probe %s from", req.Namespace, req.Pod, map[bool]int{true: 4, false: 6}[dst.Is4()], dst)
	}
	return dataplane.ProbeSpec{HostIf: wep.Spec.InterfaceName, Src: addrs[i], Dst: netip.AddrPortFrom(dst, uint16(req.Port)),
		Proto: req.Proto, Timeout: timeout}, 0, nil
}

// insideCluster reports whether a is in an IP pool or a node's address.
func (a *Agent) insideCluster(addr netip.Addr) bool {
	view := a.policy.view
	for _, p := range view.Pools() {
		if pfx, err := netip.ParsePrefix(p.Spec.CIDR); err == nil && pfx.Contains(addr) {
			return true
		}
	}
	for _, n := range view.Nodes() {
		p4, _ := n.IPv4()
		p6, _ := n.IPv6()
		if p4.Addr() == addr || p6.Addr() == addr {
			return true
		}
	}
	return false
}

// localPod is the endpoint of pod namespace/name on this node, or nil.
func (a *Agent) localPod(namespace, name string) *api.WorkloadEndpoint {
	for _, wep := range a.policy.view.EndpointsOn(a.cfg.NodeName) {
		if wep.Metadata.Namespace == namespace && wep.Spec.Pod == name {
			return wep
		}
	}
	return nil
}

// ruleCounters reads the firewall's per-rule counters, summed by Origin.
func (a *Agent) ruleCounters(ctx context.Context) policy.RuleCounters {
	out := policy.RuleCounters{Node: a.cfg.NodeName}
	rc, ok := a.deps.Firewall.(ruleCounterReader)
	if !ok {
		out.Reason = "this node's firewall has no per-rule counters"
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	counters, err := rc.RuleCounters(ctx)
	if err != nil {
		out.Reason = "reading the counters: " + err.Error()
		return out
	}
	idx := map[string]int{}
	for _, c := range counters {
		if c.Origin == nil {
			continue
		}
		k := c.Origin.String()
		i, ok := idx[k]
		if !ok {
			i, idx[k] = len(out.Counters), len(out.Counters)
			out.Counters = append(out.Counters, policy.OriginCount{Origin: *c.Origin})
		}
		out.Counters[i].Packets += c.Packets
		out.Counters[i].Bytes += c.Bytes
	}
	slices.SortFunc(out.Counters, func(x, y policy.OriginCount) int { return strings.Compare(x.Origin.String(), y.Origin.String()) })
	out.Available = true
	return out
}
