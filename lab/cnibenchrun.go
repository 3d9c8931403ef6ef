package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/cni"
	"github.com/tabbynet/tabby/ipam"
)

// cniBenchRun is run r of BenchCNI: o.Pods pods through every plugin, then
// the agent's timings from its log and the check for leftovers.
func (l *Lab) cniBenchRun(ctx context.Context, o CNIBenchOptions, n *NodeState, plugins []*cniBenchPlugin, r int) (run CNIBenchRun, err error) {
	run.LoadStart, _ = loadAverage1m()
	defer func() {
		run.LoadEnd, _ = loadAverage1m()
		run.Incomplete = err != nil
	}()
	logStart := fileSize(n.Agent.Log)
	// Whose CPU an ADD costs besides the plugins': the node's agent and
	// every etcd member.
	cpuPIDs := []int{n.Agent.PID}
	for _, m := range l.State().Etcd {
		if m.Proc != nil {
			cpuPIDs = append(cpuPIDs, m.Proc.PID)
		}
	}
	for i := range o.Pods {
		for k := range plugins {
			// Each plugin in turn, the order swapping every pod.
			p := plugins[(i+k)%len(plugins)]
			pod, err := l.cniBenchPod(ctx, n, p, fmt.Sprintf("cb%d-%d-%d", r+1, i+1, (i+k)%len(plugins)), cpuPIDs)
			if err != nil {
				return run, fmt.Errorf("%s: %w", p.name, err)
			}
			run.Pods = append(run.Pods, pod)
		}
	}
	if err := agentTimings(n.Agent.Log, logStart, run.Pods); err != nil {
		return run, err
	}
	var left []string
	for _, p := range plugins {
		pods := slices.DeleteFunc(slices.Clone(run.Pods), func(q CNIBenchPod) bool { return q.Plugin != p.name })
		ls, err := p.leftovers(ctx, pods)
		if err != nil {
			return run, fmt.Errorf("%s: checking for leftovers: %w", p.name, err)
		}
		left = append(left, ls...)
		if ls, err = kernelLeftovers(ctx, n.NetNS, pods); err != nil {
			return run, fmt.Errorf("%s: checking for leftovers: %w", p.name, err)
		}
		left = append(left, ls...)
	}
	if len(left) > 0 {
		return run, fmt.Errorf("deleted pods left %s", strings.Join(left, "; "))
	}
	return run, nil
}

// cniBenchPod makes a pod namespace, adds the pod through plugin p and
// deletes it, timing both calls; it removes the namespace, also on failure
// (and then deletes the pod first).
func (l *Lab) cniBenchPod(ctx context.Context, n *NodeState, p *cniBenchPlugin, name string, cpuPIDs []int) (pod CNIBenchPod, err error) {
	id, err := newContainerID()
	if err != nil {
		return pod, err
	}
	pod = CNIBenchPod{Plugin: p.name, ContainerID: id}
	nsName := l.Name() + "-" + name
	if err := l.newNamespace(ctx, nsName); err != nil {
		return pod, err
	}
	cleanup := context.WithoutCancel(ctx)
	defer func() { err = errors.Join(err, l.deleteNamespace(cleanup, nsName)) }()
	args, err := ParseCNIArgs(cniArgs(&PodState{Namespace: "default", Name: name, ContainerID: id}))
	if err != nil {
		return pod, err
	}
	rt := &libcni.RuntimeConf{ContainerID: id, NetNS: NetNSPath(nsName), IfName: podIfName, Args: args}
	added := false
	defer func() {
		if err != nil && added {
			err = errors.Join(err, inNetNS(n.NetNS, func() error { return p.cfg.DelNetworkList(cleanup, p.list, rt) }))
		}
	}()
	err = inNetNS(n.NetNS, func() error {
		p.x.take()
		before := procsCPU(cpuPIDs)
		start := time.Now()
		res, err := p.cfg.AddNetworkList(ctx, p.list, rt)
		pod.Add = time.Since(start)
		pod.Exec, pod.PluginCPU = p.x.take()
		pod.CPU = pod.PluginCPU + procsCPU(cpuPIDs) - before
		if err != nil {
			return fmt.Errorf("ADD: %w", err)
		}
		added = true
		if pod.Addr, pod.HostIf, err = checkResult(res, rt.NetNS, p.within); err != nil {
			return fmt.Errorf("ADD: %w", err)
		}
		start = time.Now()
		if err := p.cfg.DelNetworkList(ctx, p.list, rt); err != nil {
			return fmt.Errorf("DEL: %w", err)
		}
		pod.Del, added = time.Since(start), false
		return nil
	})
	return pod, err
}

// checkResult checks that an ADD's result is well formed: an address from
// within, a host interface and the pod's interface in the pod's namespace.
func checkResult(res any, netns string, within netip.Prefix) (addr netip.Prefix, hostIf string, err error) {
	r, ok := res.(*current.Result)
	if !ok {
		return addr, "", fmt.Errorf("result of type %T, want a CNI 1.0.0 result", res)
	}
	var sandbox string
	for _, itf := range r.Interfaces {
		switch itf.Sandbox {
		case "":
			hostIf = itf.Name
		case netns:
			sandbox = itf.Name
		}
	}
	if hostIf == "" || sandbox != podIfName {
		return addr, "", fmt.Errorf("result interfaces %v: want a host interface and %s in %s", r.Interfaces, podIfName, netns)
	}
	if len(r.IPs) == 0 {
		return addr, "", errors.New("result without an address")
	}
	a, ok := netip.AddrFromSlice(r.IPs[0].Address.IP)
	if !ok || !within.Contains(a.Unmap()) {
		return addr, "", fmt.Errorf("result address %s: not in %s", r.IPs[0].Address.String(), within)
	}
	ones, _ := r.IPs[0].Address.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), hostIf, nil
}

// kernelLeftovers lists the host interfaces and routes of deleted pods
// still in the node's namespace.
func kernelLeftovers(ctx context.Context, nodeNS string, pods []CNIBenchPod) ([]string, error) {
	b, err := run(ctx, "ip", "-n", nodeNS, "-o", "link", "show")
	if err != nil {
		return nil, err
	}
	links := string(b)
	if b, err = run(ctx, "ip", "-n", nodeNS, "route", "show"); err != nil {
		return nil, err
	}
	routes := string(b)
	var left []string
	for _, p := range pods {
		if strings.Contains(links, ": "+p.HostIf+"@") || strings.Contains(links, ": "+p.HostIf+":") {
			left = append(left, "link "+p.HostIf)
		}
		for line := range strings.Lines(routes) {
			if strings.HasPrefix(line, p.Addr.Addr().String()+" ") {
				left = append(left, "route "+strings.TrimSpace(line))
			}
		}
	}
	return left, nil
}

// tabbyLeftovers lists the endpoints and addresses of deleted pods still
// in etcd.
func (l *Lab) tabbyLeftovers(ctx context.Context, pods []CNIBenchPod) ([]string, error) {
	s, err := l.connect(ctx)
	if err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	addrs := map[netip.Addr]bool{}
	for _, p := range pods {
		ids[p.ContainerID], addrs[p.Addr.Addr()] = true, true
	}
	var left []string
	objs, _, err := s.List(ctx, api.KindWorkloadEndpoint, "")
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		if w := o.(*api.WorkloadEndpoint); ids[w.Spec.ContainerID] {
			left = append(left, "endpoint "+w.Metadata.Name)
		}
	}
	allocs, err := ipam.New(s).Allocations(ctx)
	if err != nil {
		return nil, err
	}
	for _, a := range allocs {
		if addrs[a.Addr] || ids[a.ContainerID] {
			left = append(left, "address "+a.Addr.String()+" (handle "+a.Handle+")")
		}
	}
	return left, nil
}

// hostLocalLeftovers lists the leases host-local still holds in dir (a
// file named after each address).
func hostLocalLeftovers(dir string) func(context.Context, []CNIBenchPod) ([]string, error) {
	return func(_ context.Context, _ []CNIBenchPod) ([]string, error) {
		ents, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		var left []string
		for _, e := range ents {
			if _, err := netip.ParseAddr(e.Name()); err == nil {
				left = append(left, "host-local lease "+e.Name())
			}
		}
		return left, nil
	}
}

// agentTimings fills in Agent, AgentIPAM and AgentSteps of the tabby pods
// from the agent's log, read from offset on: its "CNI request done" record
// of each ADD (dur) and its "workload added" record (ipam, the steps).
func agentTimings(path string, offset int64, pods []CNIBenchPod) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("reading the agent's log: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return fmt.Errorf("reading the agent's log: %w", err)
	}
	byID := map[string]*CNIBenchPod{}
	for i := range pods {
		if pods[i].Plugin == CNIBenchTabby {
			byID[pods[i].ContainerID] = &pods[i]
			byID[pods[i].ContainerID[:12]] = &pods[i] // "workload added" shortens it
		}
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		rec := logRecord(sc.Text())
		p := byID[rec["container"]]
		if p == nil {
			continue
		}
		switch {
		case rec["msg"] == "CNI request done" && rec["cmd"] == "ADD":
			p.Agent, _ = time.ParseDuration(rec["dur"])
		case rec["msg"] == "workload added":
			p.AgentIPAM, _ = time.ParseDuration(rec["ipam"])
			p.AgentSteps = map[string]time.Duration{}
			for _, step := range cni.AddSteps {
				if d, err := time.ParseDuration(rec[step]); err == nil {
					p.AgentSteps[step] = d
				}
			}
		}
	}
	return sc.Err()
}

// logRecord splits a slog text record into its keys and values (quoted
// values unquoted; values with escaped quotes come out approximate).
func logRecord(line string) map[string]string {
	m := map[string]string{}
	for line != "" {
		k, rest, ok := strings.Cut(line, "=")
		if !ok {
			break
		}
		var v string
		if strings.HasPrefix(rest, `"`) {
			end := strings.Index(rest[1:], `"`)
			if end < 0 {
				break
			}
			v, rest = rest[1:end+1], rest[end+2:]
		} else {
			v, rest, _ = strings.Cut(rest, " ")
		}
		m[strings.TrimSpace(k)] = v
		line = strings.TrimLeft(rest, " ")
	}
	return m
}

// fileSize is the size of the file at path, 0 when unknown.
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}
