package lab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/tabbynet/tabby/api"
)

// `tabby-lab bench cni` (docs/benchmarks.md): CNI ADD and DEL through the
// real tabby plugin against Debian's ptp + host-local, interleaved, on one
// node of a lab whose etcd fsyncs, each call made as a runtime on the node
// makes it.

var (
	// CNIBenchPool is the agents' IPv4 pool in a lab the benchmark brings
	// up: the lower half of PodPool, leaving the upper half to others.
	CNIBenchPool = netip.MustParsePrefix("10.244.0.0/17")
	// CNIBenchRefSubnet is host-local's range for the reference plugins,
	// outside CNIBenchPool.
	CNIBenchRefSubnet = netip.MustParsePrefix("10.244.255.0/24")
)

// Names of the two plugin configurations in a report.
const (
	CNIBenchTabby = "tabby"
	CNIBenchRef   = "ptp+host-local"
)

// CNIBenchOptions configure (*Lab).BenchCNI.
type CNIBenchOptions struct {
	// Node is where the pods are added; default node1.
	Node string
	// Pods is how many pods each plugin adds and deletes per run; default 60.
	Pods int
	// Runs is how many runs; default 3.
	Runs int
	// RefDir holds ptp and host-local; default where Debian installs them.
	RefDir string
	// RefSubnet is host-local's range; default CNIBenchRefSubnet. It must
	// not overlap any IPPool of the lab.
	RefSubnet netip.Prefix
	// Log receives a line per run; nil = silent.
	Log io.Writer
}

// Default fills unset fields.
func (o *CNIBenchOptions) Default() {
	if o.Node == "" {
		o.Node = NodeName(1)
	}
	if o.Pods == 0 {
		o.Pods = 60
	}
	if o.Runs == 0 {
		o.Runs = 3
	}
	if o.RefDir == "" {
		o.RefDir = PluginDir("ptp")
	}
	if !o.RefSubnet.IsValid() {
		o.RefSubnet = CNIBenchRefSubnet
	}
}

// Validate reports every problem of the options.
func (o *CNIBenchOptions) Validate() error {
	var errs []error
	if o.Pods < 1 || o.Pods > 10000 {
		errs = append(errs, fmt.Errorf("pods: %d out of range 1-10000", o.Pods))
	}
	if o.Runs < 1 || o.Runs > 100 {
		errs = append(errs, fmt.Errorf("runs: %d out of range 1-100", o.Runs))
	}
	if o.RefDir == "" {
		errs = append(errs, errors.New("ref dir: no ptp in /usr/lib/cni or /opt/cni/bin (Debian package containernetworking-plugins)"))
	}
	for _, p := range []string{"ptp", "host-local"} {
		if o.RefDir != "" && !fileExists(filepath.Join(o.RefDir, p)) {
			errs = append(errs, fmt.Errorf("ref dir: no %s in %s", p, o.RefDir))
		}
	}
	if o.RefSubnet.IsValid() && (!o.RefSubnet.Addr().Is4() || !podPool.Contains(o.RefSubnet.Addr()) || o.RefSubnet.Bits() > 28) {
		errs = append(errs, fmt.Errorf("ref subnet %s: want an IPv4 prefix of %s, /28 or wider", o.RefSubnet, PodPool))
	}
	return errors.Join(errs...)
}

// CNIBenchPod is one pod's ADD and DEL through one plugin configuration.
type CNIBenchPod struct {
	Plugin      string       `json:"plugin"`
	ContainerID string       `json:"containerID"`
	Addr        netip.Prefix `json:"addr"`   // the result's first address
	HostIf      string       `json:"hostIf"` // the result's interface outside the pod
	// Add and Del are the libcni calls as the runtime sees them.
	Add time.Duration `json:"add"`
	Del time.Duration `json:"del"`
	// Exec is how long the plugin processes libcni started for the ADD
	// ran (from fork to reaped; ptp's includes host-local's).
	Exec time.Duration `json:"exec"`
	// Agent is the agent's own time for the ADD request, from its log
	// (tabby only); AgentIPAM the part until the address was assigned
	// (the pod's records written).
	Agent     time.Duration `json:"agent,omitempty"`
	AgentIPAM time.Duration `json:"agentIPAM,omitempty"`
	// AgentSteps are the ADD's steps as the agent timed them ("workload
	// added": request, assign, prepare, … policy), each from its start to
	// its end; steps run concurrently (docs/agent.md).
	AgentSteps map[string]time.Duration `json:"agentSteps,omitempty"`
	// CPU is the CPU time the ADD cost: the plugin processes' (with the
	// processes they ran) plus what the node's agent and the lab's etcd
	// used meanwhile (for the reference that is their background, the
	// floor under tabby's figure). Unlike the latencies it hardly depends
	// on the machine's load.
	CPU       time.Duration `json:"cpu"`
	PluginCPU time.Duration `json:"pluginCPU"`
}

// CNIBenchRun is one run: every pod of both plugins, interleaved.
type CNIBenchRun struct {
	Pods []CNIBenchPod `json:"pods"`
	// Load is /proc/loadavg's 1-minute figure at the start and the end.
	LoadStart float64 `json:"loadStart"`
	LoadEnd   float64 `json:"loadEnd"`
	// Incomplete: the run stopped early (an error, Ctrl-C); its figures
	// are of the pods done and the medians leave it out.
	Incomplete bool `json:"incomplete,omitempty"`
}

// CNIBenchReport is what BenchCNI measured.
type CNIBenchReport struct {
	Lab       string       `json:"lab"`
	Node      string       `json:"node"`
	Pool      netip.Prefix `json:"pool"`      // tabby's addresses come from here
	RefSubnet netip.Prefix `json:"refSubnet"` // host-local's range
	// EtcdFS is the file system of the etcd's data (its fsync is free on
	// tmpfs: such a run says nothing about a durable write).
	EtcdFS string        `json:"etcdFS"`
	Runs   []CNIBenchRun `json:"runs"`
}

// cniBenchPlugin is one plugin configuration under test.
type cniBenchPlugin struct {
	name   string
	cfg    *libcni.CNIConfig
	list   *libcni.NetworkConfigList
	within netip.Prefix // its addresses must come from here
	x      *timedExec
	// leftovers lists what of the deleted pods remains.
	leftovers func(ctx context.Context, pods []CNIBenchPod) ([]string, error)
}

// BenchCNI adds and deletes o.Pods pods per run through the lab's tabby
// plugin and through ptp + host-local on node o.Node, alternating (the
// order swapping every pod, so that both meet the machine's changing load
// alike), each call made through libcni from a thread inside the node's
// namespace as a runtime on the node makes it. After every run it checks
// that the deleted pods left nothing: no host interface, no route, no
// address in IPAM or host-local, no endpoint. It returns what it measured
// so far also with an error.
func (l *Lab) BenchCNI(ctx context.Context, o CNIBenchOptions) (*CNIBenchReport, error) {
	o.Default()
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("invalid benchmark options: %w", err)
	}
	st := l.State()
	n := st.Node(o.Node)
	if n == nil || n.Agent == nil {
		return nil, fmt.Errorf("no node %q with an agent in lab %q", o.Node, st.Name)
	}
	if err := l.checkRefSubnet(ctx, o.RefSubnet); err != nil {
		return nil, err
	}
	plugins, err := l.cniBenchPlugins(o)
	if err != nil {
		return nil, err
	}
	rep := &CNIBenchReport{Lab: st.Name, Node: o.Node, Pool: st.Pool4(), RefSubnet: o.RefSubnet, EtcdFS: fsType(l.dir)}
	for r := range o.Runs {
		run, err := l.cniBenchRun(ctx, o, n, plugins, r)
		rep.Runs = append(rep.Runs, run)
		if err != nil {
			return rep, fmt.Errorf("run %d: %w", r+1, err)
		}
		progress(o.Log, "run %d/%d: %s", r+1, o.Runs, rep.ratioLine(r))
	}
	return rep, nil
}

// checkRefSubnet refuses a reference range that overlaps a pool of the lab.
func (l *Lab) checkRefSubnet(ctx context.Context, ref netip.Prefix) error {
	s, err := l.connect(ctx)
	if err != nil {
		return err
	}
	objs, _, err := s.List(ctx, api.KindIPPool, "")
	if err != nil {
		return fmt.Errorf("listing the lab's pools: %w", err)
	}
	for _, obj := range objs {
		p := obj.(*api.IPPool)
		if c, err := netip.ParsePrefix(p.Spec.CIDR); err == nil && c.Overlaps(ref) {
			return fmt.Errorf("the reference range %s overlaps pool %s (%s): bring the lab up with a narrower pool (tabby-lab bench cni does: %s)", ref, p.Metadata.Name, c, CNIBenchPool)
		}
	}
	return nil
}

// cniBenchPlugins configures both plugins for node o.Node: the lab's
// network configuration with its tabby plugin alone (no portmap, as the
// reference has none), and ptp with host-local.
func (l *Lab) cniBenchPlugins(o CNIBenchOptions) ([]*cniBenchPlugin, error) {
	st := l.State()
	dir := filepath.Join(l.NodeDir(o.Node), "cnibench")
	raw, err := os.ReadFile(l.ConflistPath(o.Node))
	if err != nil {
		return nil, fmt.Errorf("reading the node's CNI configuration: %w", err)
	}
	tabby, err := onlyPlugin(raw, "tabby")
	if err != nil {
		return nil, err
	}
	ref, err := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": "cnibench-ref",
		"plugins": []map[string]any{{
			"type": "ptp", "mtu": 1500,
			"ipam": map[string]any{"type": "host-local", "subnet": o.RefSubnet.String(), "dataDir": filepath.Join(dir, "host-local"),
				"routes": []map[string]string{{"dst": "0.0.0.0/0"}}},
		}},
	})
	if err != nil {
		return nil, err
	}
	var out []*cniBenchPlugin
	for _, c := range []struct {
		name, binDir string
		conf         []byte
		rng          netip.Prefix
		leftovers    func(context.Context, []CNIBenchPod) ([]string, error)
	}{
		{CNIBenchTabby, st.BinDir, tabby, st.Pool4(), l.tabbyLeftovers},
		{CNIBenchRef, o.RefDir, ref, o.RefSubnet, hostLocalLeftovers(filepath.Join(dir, "host-local", "cnibench-ref"))},
	} {
		list, err := libcni.ConfListFromBytes(c.conf)
		if err != nil {
			return nil, fmt.Errorf("%s configuration: %w", c.name, err)
		}
		x := &timedExec{DefaultExec: invoke.DefaultExec{RawExec: &invoke.RawExec{}}}
		out = append(out, &cniBenchPlugin{name: c.name, list: list, within: c.rng, x: x, leftovers: c.leftovers,
			cfg: libcni.NewCNIConfigWithCacheDir([]string{c.binDir}, filepath.Join(dir, "cache-"+c.name), x)})
	}
	return out, nil
}

// onlyPlugin keeps the plugin of the given type of a configuration list.
func onlyPlugin(raw []byte, typ string) ([]byte, error) {
	var conf map[string]any
	if err := json.Unmarshal(raw, &conf); err != nil {
		return nil, fmt.Errorf("decoding CNI configuration: %w", err)
	}
	plugins, _ := conf["plugins"].([]any)
	for _, p := range plugins {
		if pm, ok := p.(map[string]any); ok && pm["type"] == typ {
			conf["plugins"] = []any{pm}
			return json.Marshal(conf)
		}
	}
	return nil, fmt.Errorf("CNI configuration: no plugin of type %q", typ)
}

// timedExec executes plugins as libcni's RawExec does and adds up how
// long they ran and the CPU they used (with their own waited-for children,
// as wait4 reports it: ptp's includes host-local's).
type timedExec struct {
	invoke.DefaultExec
	mu       sync.Mutex
	took     time.Duration
	cpu      time.Duration
	exitCPUs []time.Duration
}

func (e *timedExec) ExecPlugin(ctx context.Context, path string, stdin []byte, environ []string) ([]byte, error) {
	start := time.Now()
	c := exec.CommandContext(ctx, path)
	c.Env, c.Stdin = environ, bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	err := c.Run()
	e.mu.Lock()
	e.took += time.Since(start)
	if c.ProcessState != nil {
		e.cpu += c.ProcessState.UserTime() + c.ProcessState.SystemTime()
	}
	e.mu.Unlock()
	if err != nil {
		// As RawExec: the plugin's CNI error from its stdout, if any.
		var perr types.Error
		if jerr := json.Unmarshal(stdout.Bytes(), &perr); jerr == nil && perr.Code != 0 {
			return nil, &perr
		}
		return nil, fmt.Errorf("%s: %w: %s %s", path, err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// take returns the time and CPU added up since the last take.
func (e *timedExec) take() (took, cpu time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	took, cpu = e.took, e.cpu
	e.took, e.cpu = 0, 0
	return took, cpu
}

// procsCPU is the CPU time the processes have used so far (every thread's
// on-CPU time from /proc/<pid>/task/*/schedstat, in nanoseconds); a
// process gone counts 0.
func procsCPU(pids []int) time.Duration {
	var sum time.Duration
	for _, pid := range pids {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue
			}
			f := strings.Fields(string(b))
			if len(f) > 0 {
				if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					sum += time.Duration(ns)
				}
			}
		}
	}
	return sum
}

// newContainerID is a random 64-hex-digit ID, as runtimes make.
func newContainerID() (string, error) {
	var id [32]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(id[:]), nil
}

// fsType names the file system holding path, by its magic number.
func fsType(path string) string {
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(path, &sfs); err != nil {
		return "unknown"
	}
	switch sfs.Type {
	case 0xEF53:
		return "ext4"
	case 0x01021994:
		return "tmpfs"
	case 0x58465342:
		return "xfs"
	case 0x9123683E:
		return "btrfs"
	case 0x794c7630:
		return "overlayfs"
	}
	return fmt.Sprintf("fs 0x%x", sfs.Type)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
