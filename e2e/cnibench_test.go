package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/lab"
)

// TestCNIBench runs `tabby-lab bench cni` small, in a lab of its own pool
// (lab.CNIBenchPool) with --use-lab, and checks what it reports and leaves:
// every pod of both plugins got an address from its range and the
// interfaces a runtime expects, the agent's share is inside the call, and
// afterwards no pod namespace, host interface, endpoint, IPAM address or
// host-local lease remains. It asserts no timing. A reference range inside
// the lab's pool is refused.
func TestCNIBench(t *testing.T) {
	l := upLab(t, lab.Options{Name: "e2ecnib", Nodes: 2, IPv4Pool: lab.CNIBenchPool})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st := l.State()
	bench := func(args ...string) ([]byte, error) {
		argv := append([]string{"--run-dir", runDir, "--name", st.Name, "bench", "cni", "--use-lab"}, args...)
		return exec.CommandContext(ctx, st.LabBinary, argv...).Output()
	}

	out, err := bench("--ref-subnet", "10.244.1.0/24", "--pods", "1", "--runs", "1")
	if err == nil || !strings.Contains(errText(err), "overlaps pool") {
		t.Errorf("a reference range inside the pool: err %v, output %s; want a refusal naming the pool", errText(err), out)
	}

	const pods, runs = 4, 2
	out, err = bench("--pods", "4", "--runs", "2", "--json")
	if err != nil {
		t.Fatalf("bench cni: %s\n%s", errText(err), out)
	}
	var rep lab.CNIBenchReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("decoding the report: %v\n%s", err, out)
	}
	if len(rep.Runs) != runs {
		t.Fatalf("%d runs reported, want %d", len(rep.Runs), runs)
	}
	for r, run := range rep.Runs {
		n := map[string]int{}
		for _, p := range run.Pods {
			n[p.Plugin]++
			checkBenchPod(t, rep, p)
		}
		if n[lab.CNIBenchTabby] != pods || n[lab.CNIBenchRef] != pods || len(n) != 2 {
			t.Errorf("run %d: pods per plugin %v, want %d of %s and of %s", r+1, n, pods, lab.CNIBenchTabby, lab.CNIBenchRef)
		}
	}
	if tab := rep.Table(); !strings.Contains(tab, "median over 2 runs") {
		t.Errorf("table without the medians:\n%s", tab)
	}
	checkBenchClean(ctx, t, l)
}

// errText is the error with what the command wrote to stderr.
func errText(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return err.Error() + ": " + string(ee.Stderr)
	}
	return fmt.Sprint(err)
}

// checkBenchPod checks one pod's record: its address in its plugin's
// range, its host interface named as the plugin names them, and timings
// that nest (the plugin processes inside the call, the agent inside them).
func checkBenchPod(t *testing.T, rep lab.CNIBenchReport, p lab.CNIBenchPod) {
	t.Helper()
	within, ifPrefix := rep.RefSubnet, "veth"
	if p.Plugin == lab.CNIBenchTabby {
		within, ifPrefix = rep.Pool, "cali"
	}
	if !within.Contains(p.Addr.Addr()) || !strings.HasPrefix(p.HostIf, ifPrefix) || len(p.ContainerID) != 64 {
		t.Errorf("%s pod %.12s: address %s (want in %s), host interface %q (want %s…)", p.Plugin, p.ContainerID, p.Addr, within, p.HostIf, ifPrefix)
	}
	if p.Add <= 0 || p.Del <= 0 || p.Exec <= 0 || p.Exec > p.Add || p.PluginCPU <= 0 || p.CPU <= 0 {
		t.Errorf("%s pod %.12s: ADD %v, DEL %v, plugin processes %v (CPU %v), CPU %v: want all > 0, the processes within ADD", p.Plugin, p.ContainerID, p.Add, p.Del, p.Exec, p.PluginCPU, p.CPU)
	}
	if p.Plugin == lab.CNIBenchTabby && (p.Agent <= 0 || p.Agent > p.Exec || p.AgentIPAM <= 0 || p.AgentIPAM > p.Agent) {
		t.Errorf("tabby pod %.12s: agent %v (ipam %v), plugin processes %v: want the agent's time within the plugin's, its ipam within it", p.ContainerID, p.Agent, p.AgentIPAM, p.Exec)
	}
}

// checkBenchClean checks that the benchmark's pods left nothing in the lab.
func checkBenchClean(ctx context.Context, t *testing.T, l *lab.Lab) {
	t.Helper()
	st := l.State()
	for _, ns := range st.Namespaces {
		if strings.HasPrefix(ns, st.Name+"-cb") {
			t.Errorf("pod namespace %s left in the lab's state", ns)
		}
	}
	if out, err := exec.CommandContext(ctx, "ip", "netns", "list").Output(); err != nil || strings.Contains(string(out), st.Name+"-cb") {
		t.Errorf("ip netns list (err %v): a benchmark namespace is left:\n%s", err, out)
	}
	links, err := l.Exec(ctx, "node1", "ip", "-o", "link", "show")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(links)) {
		if f := strings.Fields(line); len(f) > 1 && (strings.HasPrefix(f[1], "cali") || strings.HasPrefix(f[1], "veth")) {
			t.Errorf("node1 keeps a pod's interface: %s", strings.TrimSpace(line))
		}
	}
	eps, _, err := l.Store().List(ctx, api.KindWorkloadEndpoint, "")
	if err != nil || len(eps) > 0 {
		t.Errorf("endpoints left: %d (err %v)", len(eps), err)
	}
	allocs, err := ipam.New(l.Store()).Allocations(ctx)
	if err != nil || len(allocs) > 0 {
		t.Errorf("addresses left in IPAM: %v (err %v)", allocs, err)
	}
	leases, _ := filepath.Glob(filepath.Join(l.NodeDir("node1"), "cnibench", "host-local", "*", "10.*"))
	if len(leases) > 0 {
		t.Errorf("host-local leases left: %v", leases)
	}
}
