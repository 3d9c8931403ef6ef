package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
)

// PodOptions describe a pod beyond its node and name.
type PodOptions struct {
	Namespace string            // Kubernetes namespace; default "default"
	Labels    map[string]string // passed to the plugin as args.cni.labels
	// IPv6Only gives the pod an IPv6 address and no IPv4 one (a lab with
	// an IPv6 underlay only: DualStack or IPv6Only); it is the default in
	// an IPv6Only lab.
	IPv6Only bool
}

// podIfName is the pod's interface, as Kubernetes runtimes name it.
const podIfName = "eth0"

// AddPod creates a pod namespace <lab>-pod-<name> on node and runs the
// node's CNI chain ADD for it, the way a runtime does: inside the node's
// network namespace, through libcni (a `tabby-lab cni add` helper process).
// On failure it runs DEL and deletes the namespace.
func (l *Lab) AddPod(ctx context.Context, node, name string, o PodOptions) (_ *PodState, err error) {
	if !podNameRE.MatchString(name) {
		return nil, fmt.Errorf("pod name %q: want 1-31 characters [a-z0-9-]", name)
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	var id [32]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	var pod PodState
	err = l.Update(func(s *State) error {
		if s.NoAgents {
			return errors.New("the lab runs no agents: pods cannot be added")
		}
		if s.Node(node) == nil {
			return fmt.Errorf("no node %q", node)
		}
		if s.pod(name) != nil {
			return fmt.Errorf("pod %q exists", name)
		}
		v6only := o.IPv6Only || s.IPv6Only
		if v6only && !s.DualStack {
			return fmt.Errorf("pod %q: an IPv6-only pod needs a lab with an IPv6 underlay (--dual-stack or --ipv6)", name)
		}
		pod = PodState{
			Name: name, Namespace: o.Namespace, Node: node, NetNS: s.Name + "-pod-" + name,
			ContainerID: hex.EncodeToString(id[:]), IfName: podIfName, Labels: maps.Clone(o.Labels),
			IPv6Only: v6only,
		}
		s.Pods = append(s.Pods, pod)
		return nil
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.DelPod(context.WithoutCancel(ctx), name))
		}
	}()
	if err := l.newNamespace(ctx, pod.NetNS); err != nil {
		return nil, err
	}
	progress(l.log, "CNI ADD %s/%s on %s", pod.Namespace, name, node)
	out, err := l.cni(ctx, "add", &pod)
	if err != nil {
		return nil, err
	}
	ips, err := resultIPs(out)
	if err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("CNI ADD for %s returned no address: %s", name, out)
	}
	pod.IPs = ips
	err = l.Update(func(s *State) error {
		p := s.pod(name)
		if p == nil {
			return fmt.Errorf("pod %q vanished while being added", name)
		}
		*p = pod
		return nil
	})
	if err != nil {
		return nil, err
	}
	progress(l.log, "pod %s on %s has %s", name, node, ips[0])
	return &pod, nil
}

// DelPod runs CNI DEL for the pod and deletes its namespace. A pod the lab
// does not know is an error; a pod whose namespace is already gone is not.
func (l *Lab) DelPod(ctx context.Context, name string) error {
	p := l.State().pod(name)
	if p == nil {
		return fmt.Errorf("no pod %q", name)
	}
	var errs []error
	if l.State().Node(p.Node) != nil {
		progress(l.log, "CNI DEL %s/%s on %s", p.Namespace, name, p.Node)
		if _, err := l.cni(ctx, "del", p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := l.deleteNamespace(ctx, p.NetNS); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return l.Update(func(s *State) error {
		s.Pods = slices.DeleteFunc(s.Pods, func(q PodState) bool { return q.Name == name })
		return nil
	})
}

// cni runs `tabby-lab cni <cmd>` for the pod inside its node's namespace.
func (l *Lab) cni(ctx context.Context, cmd string, p *PodState) ([]byte, error) {
	st := l.State()
	n := st.Node(p.Node)
	if n == nil {
		return nil, fmt.Errorf("no node %q", p.Node)
	}
	paths := []string{st.BinDir}
	if d := PluginDir("portmap"); d != "" {
		paths = append(paths, d)
	}
	argv := []string{st.LabBinary, "cni", cmd,
		"--conflist", l.podConflistPath(n.Name, p),
		"--netns", NetNSPath(p.NetNS),
		"--container-id", p.ContainerID,
		"--ifname", p.IfName,
		"--cni-path", strings.Join(paths, ":"),
		"--cache-dir", filepath.Join(l.NodeDir(n.Name), "cni-cache"),
		"--args", cniArgs(p),
	}
	if len(p.Labels) > 0 {
		argv = append(argv, "--labels", formatLabels(p.Labels))
	}
	out, err := nsExec(ctx, n.NetNS, argv...)
	if err != nil {
		return nil, fmt.Errorf("CNI %s for pod %s: %w", strings.ToUpper(cmd), p.Name, err)
	}
	return out, nil
}

// cniArgs is the CNI_ARGS a Kubernetes runtime passes.
func cniArgs(p *PodState) string {
	return strings.Join([]string{
		"IgnoreUnknown=1",
		"K8S_POD_NAMESPACE=" + p.Namespace,
		"K8S_POD_NAME=" + p.Name,
		"K8S_POD_INFRA_CONTAINER_ID=" + p.ContainerID,
	}, ";")
}

// formatLabels writes labels as k=v,k=v in key order.
func formatLabels(m map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

// ParseLabels reads k=v,k=v.
func ParseLabels(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("label %q: want key=value", kv)
		}
		m[k] = v
	}
	return m, nil
}

// resultIPs reads the addresses of a CNI result.
func resultIPs(out []byte) ([]netip.Prefix, error) {
	var r struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("decoding CNI result %q: %w", out, err)
	}
	var ips []netip.Prefix
	for _, a := range r.IPs {
		p, err := netip.ParsePrefix(a.Address)
		if err != nil {
			return nil, fmt.Errorf("CNI result address %q: %w", a.Address, err)
		}
		ips = append(ips, p)
	}
	return ips, nil
}

// ResolveNetNS maps a node name, a pod name, "fabric", "tor", "etcd" or one
// of the lab's namespace names to a namespace name.
func (l *Lab) ResolveNetNS(target string) (string, error) {
	st := l.State()
	switch target {
	case "fabric":
		return st.fabricNS(), nil
	case "tor":
		return st.torNS(), nil
	case "etcd":
		return st.EtcdNS(), nil
	}
	if n := st.Node(target); n != nil {
		return n.NetNS, nil
	}
	if p := st.pod(target); p != nil {
		return p.NetNS, nil
	}
	if slices.Contains(st.Namespaces, target) {
		return target, nil
	}
	return "", fmt.Errorf("no node, pod or namespace %q in lab %q", target, st.Name)
}

// Exec runs argv inside the network namespace of target (see ResolveNetNS)
// and returns its combined output.
func (l *Lab) Exec(ctx context.Context, target string, argv ...string) ([]byte, error) {
	ns, err := l.ResolveNetNS(target)
	if err != nil {
		return nil, err
	}
	return nsExec(ctx, ns, argv...)
}

// Ping sends one ping from the pod to addr and waits a second for the reply.
func (l *Lab) Ping(ctx context.Context, fromPod string, to netip.Addr) error {
	if l.State().pod(fromPod) == nil {
		return fmt.Errorf("no pod %q", fromPod)
	}
	_, err := l.Exec(ctx, fromPod, "ping", "-c1", "-W1", "-n", to.String())
	return err
}
