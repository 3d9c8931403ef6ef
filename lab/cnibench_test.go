package lab

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tabbynet/tabby/internal/testkit"
)

func TestCNIBenchOptionsValidate(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{"ptp", "host-local"} {
		if err := os.WriteFile(filepath.Join(dir, p), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		o    CNIBenchOptions
		want []string // substrings of the error; none = valid
	}{
		{"defaults", CNIBenchOptions{RefDir: dir}, nil},
		{"every problem", CNIBenchOptions{RefDir: t.TempDir(), Pods: -1, Runs: 101, RefSubnet: netip.MustParsePrefix("10.1.0.0/24")},
			[]string{"pods: -1", "runs: 101", "no ptp in", "no host-local in", "ref subnet 10.1.0.0/24"}},
		{"narrow ref subnet", CNIBenchOptions{RefDir: dir, RefSubnet: netip.MustParsePrefix("10.244.255.0/30")}, []string{"ref subnet 10.244.255.0/30"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.o.Default()
			err := tt.o.Validate()
			testkit.ErrMentions(t, "Validate()", err, tt.want)
		})
	}
}

func TestLogRecord(t *testing.T) {
	line := `time=2026-12-06T10:00:00.000Z level=INFO msg="CNI request done" cmd=ADD container=abc dur=7.25ms`
	want := map[string]string{"time": "2026-12-06T10:00:00.000Z", "level": "INFO", "msg": "CNI request done", "cmd": "ADD", "container": "abc", "dur": "7.25ms"}
	if diff := cmp.Diff(want, logRecord(line)); diff != "" {
		t.Errorf("logRecord (-want +got):\n%s", diff)
	}
}

func TestAgentTimings(t *testing.T) {
	id := strings.Repeat("ab", 32)
	other := strings.Repeat("cd", 32)
	log := `time=t level=INFO msg="CNI request done" cmd=ADD container=` + other + ` dur=99ms
time=t level=INFO msg="workload added" container=` + id[:12] + ` pod="default/p" request=1.2ms assign=1.8ms ipam=3.5ms prepare=1.5ms endpoint=0s view=650µs policy=700µs
time=t level=INFO msg="CNI request done" cmd=ADD container=` + id + ` dur=7.25ms
time=t level=INFO msg="CNI request done" cmd=DEL container=` + id + ` dur=5ms
`
	path := filepath.Join(t.TempDir(), "agent.log")
	if err := os.WriteFile(path, []byte("skipped line before the offset\n"+log), 0o644); err != nil {
		t.Fatal(err)
	}
	pods := []CNIBenchPod{{Plugin: CNIBenchTabby, ContainerID: id}, {Plugin: CNIBenchRef, ContainerID: other}}
	if err := agentTimings(path, int64(len("skipped line before the offset\n")), pods); err != nil {
		t.Fatal(err)
	}
	steps := map[string]time.Duration{"request": 1200 * time.Microsecond, "assign": 1800 * time.Microsecond, "prepare": 1500 * time.Microsecond,
		"endpoint": 0, "view": 650 * time.Microsecond, "policy": 700 * time.Microsecond}
	want := []CNIBenchPod{{Plugin: CNIBenchTabby, ContainerID: id, Agent: 7250 * time.Microsecond, AgentIPAM: 3500 * time.Microsecond, AgentSteps: steps},
		{Plugin: CNIBenchRef, ContainerID: other}}
	if diff := cmp.Diff(want, pods, cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
		t.Errorf("agentTimings (-want +got):\n%s", diff)
	}
}

func TestOnlyPlugin(t *testing.T) {
	got, err := onlyPlugin([]byte(`{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"tabby","mtu":0},{"type":"portmap"}]}`), "tabby")
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"cniVersion":"1.0.0","name":"n","plugins":[{"mtu":0,"type":"tabby"}]}`; string(got) != want {
		t.Errorf("onlyPlugin = %s, want %s", got, want)
	}
	if _, err := onlyPlugin([]byte(`{"plugins":[{"type":"ptp"}]}`), "tabby"); err == nil {
		t.Error("onlyPlugin without a tabby plugin: nil error")
	}
}

func TestCheckResult(t *testing.T) {
	ipn := func(s string) net.IPNet {
		ip, n, _ := net.ParseCIDR(s)
		return net.IPNet{IP: ip, Mask: n.Mask}
	}
	good := func() *current.Result {
		return &current.Result{
			Interfaces: []*current.Interface{{Name: "cali0123456789a"}, {Name: "eth0", Sandbox: "/run/netns/p"}},
			IPs:        []*current.IPConfig{{Address: ipn("10.244.0.5/32")}},
		}
	}
	within := netip.MustParsePrefix("10.244.0.0/17")
	addr, hostIf, err := checkResult(good(), "/run/netns/p", within)
	if err != nil || addr != netip.MustParsePrefix("10.244.0.5/32") || hostIf != "cali0123456789a" {
		t.Errorf("checkResult(good) = %v, %q, %v", addr, hostIf, err)
	}
	for name, bad := range map[string]func(*current.Result){
		"no address":        func(r *current.Result) { r.IPs = nil },
		"address outside":   func(r *current.Result) { r.IPs[0].Address = ipn("10.244.255.5/24") },
		"no host side":      func(r *current.Result) { r.Interfaces = r.Interfaces[1:] },
		"pod side misnamed": func(r *current.Result) { r.Interfaces[1].Name = "eth1" },
	} {
		r := good()
		bad(r)
		if _, _, err := checkResult(r, "/run/netns/p", within); err == nil {
			t.Errorf("checkResult(%s): nil error", name)
		}
	}
}

func TestCNIBenchTable(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	run := func(tabby, ref float64) CNIBenchRun {
		return CNIBenchRun{Pods: []CNIBenchPod{
			{Plugin: CNIBenchTabby, Add: ms(tabby), Del: ms(tabby), Exec: ms(tabby - 1), Agent: ms(tabby / 2), AgentIPAM: ms(1), CPU: ms(tabby),
				AgentSteps: map[string]time.Duration{"policy": ms(tabby / 10), "request": ms(1.25)}},
			{Plugin: CNIBenchRef, Add: ms(ref), Del: ms(ref), Exec: ms(ref - 1), CPU: ms(ref)},
		}}
	}
	rep := &CNIBenchReport{Lab: "l", Node: "node1", Runs: []CNIBenchRun{run(8, 10), run(6, 10), run(9, 10)}}
	if diff := cmp.Diff(CNIBenchRatios{AddP50: 0.8, AddP90: 0.8, AddP99: 0.8, DelP50: 0.8, CPU: 0.8}, rep.MedianRatios()); diff != "" {
		t.Errorf("MedianRatios (-want +got):\n%s", diff)
	}
	stopped := run(1, 10)
	stopped.Incomplete = true
	rep.Runs = append(rep.Runs, stopped) // left out of the medians
	tab := rep.Table()
	if diff := cmp.Diff(CNIBenchRatios{AddP50: 0.8, AddP90: 0.8, AddP99: 0.8, DelP50: 0.8, CPU: 0.8}, rep.MedianRatios()); diff != "" {
		t.Errorf("MedianRatios with a run stopped early (-want +got):\n%s", diff)
	}
	for _, w := range []string{"(stopped early)", "median over 3 runs of tabby / ptp+host-local: ADD p50 0.80×", "CPU per ADD (plugins, agent, etcd) p50 0.80×", "0.60", "ptp+host-local",
		"run 2: request 1.25, policy 0.60"} {
		if !strings.Contains(tab, w) {
			t.Errorf("table lacks %q:\n%s", w, tab)
		}
	}
}
