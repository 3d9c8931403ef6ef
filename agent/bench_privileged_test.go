package agent

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/internal/testkit"
)

// BenchmarkPrivilegedCNIAddDel measures CNI ADD and DEL latency of Tabby and,
// in the same run and the same kind of node namespace, of the reference
// ptp + host-local plugins from Debian's containernetworking-plugins. Both
// are executed through libcni from a thread inside the node namespace, as a
// runtime on that node would. Run with -benchtime=50x or more; it reports
// medians and p99s.
//
// Tabby runs in four configurations: without a firewall ("tabby"), with
// the nftables firewall of its node namespace enforcing policy as deployed
// but no policy selecting the pods ("nft"), with a GlobalNetworkPolicy
// and a NetworkPolicy selecting every pod, so that each ADD also writes the
// pod's policy chains and set members ("nft-policy"), and like "nft" on a
// dual-stack network, each pod getting an IPv4 and an IPv6 address
// ("nft-dual", to compare with "nft"), and like "nft" against an etcd that
// fsyncs as the lab's and production's do, the tests' etcd skipping it
// ("nft-fsync"; "nft-fsync-apart" the same with the endpoint written in a
// transaction of its own after the address, as before it rode on IPAM's);
// TABBY_BENCH_CASES=nft,nft-fsync,… picks some. The reference is "ref". Every iteration adds and deletes one pod with each configuration
// in turn (the order rotating), so that all meet the same load. Metrics
// are prefixed with the configuration; add-p50/ref and add-p99/ref are the
// ratios to the reference, reap-p99-ms the 99th percentile of the time
// between the plugin process closing its stdout (exiting) and being
// reaped. For Tabby it also reports where an ADD's time goes
// (medians): before-ms from the call until the agent starts the request
// (libcni, exec of the plugin, its connection), ipam-ms, prep-ms (the veth
// pair made meanwhile, from the same start), wire-ms from the
// address until the agent answers (the longer of the veth work and the
// endpoint write plus its policy pass; veth-ms, put-ms and pol-ms are the
// three alone), after-ms until libcni returns.
//
//	go test -run '^$' -bench PrivilegedCNIAddDel -benchtime 100x ./agent
func BenchmarkPrivilegedCNIAddDel(b *testing.B) {
	testkit.RequirePrivileged(b)
	if _, err := os.Stat("/usr/lib/cni/ptp"); err != nil {
		b.Skip("reference plugins not installed (Debian package containernetworking-plugins)")
	}
	var cases []*addDelCase
	for _, c := range []struct {
		name                    string
		firewall, policy        bool
		dualStack, fsync, apart bool
	}{
		{name: "tabby"}, {name: "nft", firewall: true}, {name: "nft-policy", firewall: true, policy: true},
		{name: "nft-dual", firewall: true, dualStack: true},
		{name: "nft-fsync", firewall: true, fsync: true}, {name: "nft-fsync-apart", firewall: true, fsync: true, apart: true},
	} {
		if !benchCase(c.name) {
			continue
		}
		steps := &stepLog{}
		e := newNodeEnvWith(b, nodeEnvOptions{firewall: c.firewall, log: slog.New(steps), resync: Default().ResyncInterval, dualStack: c.dualStack,
			fsync: c.fsync, endpointApart: c.apart})
		e.setFault(steps.fault)
		if c.policy {
			createPolicies(b, e)
		}
		cases = append(cases, newAddDelCase(b, c.name, e.nodePath, newTimedExec(e.binDir), e.conflistChain(b, "1.0.0", false), steps))
	}
	requireStatic(b, filepath.Join(cases[0].x.path[0], "tabby"))
	nodePath := testkit.NewNetNS(b, "tabby-bref").Path
	conf, err := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": "ref",
		"plugins": []map[string]any{{
			"type": "ptp", "mtu": 1500,
			"ipam": map[string]any{"type": "host-local", "subnet": "10.244.200.0/24", "dataDir": b.TempDir(),
				"routes": []map[string]string{{"dst": "0.0.0.0/0"}}},
		}},
	})
	if err != nil {
		b.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(conf)
	if err != nil {
		b.Fatal(err)
	}
	ref := newAddDelCase(b, "ref", nodePath, newTimedExec("/usr/lib/cni"), list, nil)
	cases = append(cases, ref)

	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		for k := range cases {
			// Each configuration in turn, the order rotating, so that
			// they meet the machine's changing load alike.
			if err := cases[(i+k)%len(cases)].addDel(ctx, b, i); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	for _, c := range cases {
		c.report(b, ref)
	}
}

// benchCase says whether TABBY_BENCH_CASES (a comma-separated list of
// configurations; unset: all) names the configuration.
func benchCase(name string) bool {
	list := os.Getenv("TABBY_BENCH_CASES")
	return list == "" || slices.Contains(strings.Split(list, ","), name)
}

// requireStatic fails the benchmark when the plugin at path is linked
// dynamically (a build with cgo, e.g. a plain go build): the shipped one is
// static (CGO_ENABLED=0 in the Makefile and the image), and the dynamic
// loader would add about a millisecond to every exec that it does not pay.
func requireStatic(b *testing.B, path string) {
	b.Helper()
	f, err := elf.Open(path)
	if err != nil {
		b.Fatalf("reading the plugin: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b.Fatalf("%s is linked dynamically; build it as shipped (make build, or CGO_ENABLED=0 go build) and point TABBY_BIN at it", path)
		}
	}
}

// createPolicies makes every benchmark pod (namespace default) selected by
// a GlobalNetworkPolicy and a NetworkPolicy in both directions, with a
// selector set that each new pod joins.
func createPolicies(b *testing.B, e *nodeEnv) {
	b.Helper()
	ctx := context.Background()
	all := &api.LabelSelector{}
	objs := []api.Object{
		&api.GlobalNetworkPolicy{Metadata: api.ObjectMeta{Name: "bench"}, Spec: api.GlobalNetworkPolicySpec{
			Selector: all, Types: []api.PolicyType{api.PolicyTypeIngress, api.PolicyTypeEgress},
			Ingress: []api.Rule{{Action: "Allow", Source: api.EntityRule{Nets: []string{"198.18.0.0/15"}}}},
			Egress:  []api.Rule{{Action: "Allow", Destination: api.EntityRule{Nets: []string{"198.18.0.0/15"}}}},
		}},
		&api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: "default", Name: "bench"}, Spec: api.NetworkPolicySpec{
			PodSelector: api.LabelSelector{},
			Ingress:     []api.NetworkPolicyIngressRule{{From: []api.NetworkPolicyPeer{{PodSelector: all}}}},
		}},
	}
	for _, o := range objs {
		if _, err := e.store.Create(ctx, o); err != nil {
			b.Fatalf("creating %T: %v", o, err)
		}
	}
}

// stepLog is the agent's log handler in the benchmark: it keeps the
// per-step timings of each "workload added" record and, through the
// agent's CNIFault hook, when the address was assigned.
type stepLog struct {
	mu       sync.Mutex
	assigned time.Time
	added    addedRecord
}

type addedRecord struct {
	assigned, at, done                         time.Time
	ipam, prepare, dataplane, endpoint, policy time.Duration
}

func (s *stepLog) fault(step string) error {
	if step == "assign" {
		s.mu.Lock()
		s.assigned = time.Now()
		s.mu.Unlock()
	}
	return nil
}

// began is when the agent started the request: the address took ipam
// before the hook noted it.
func (r addedRecord) began() time.Time { return r.assigned.Add(-r.ipam) }

// explain splits one slow ADD from start to end.
func (r addedRecord) explain(i int, start, end time.Time, x *timedExec) string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return fmt.Sprintf("slow ADD %d: %v: libcni %v, exec %v, plugin until the agent starts %v; agent: ipam %v, wire %v (veth %v, endpoint %v); "+
		"answer written %v later, plugin's stdout closed %v after that, reaped %v after that, libcni %v",
		i, end.Sub(start), x.called.Sub(start), x.started.Sub(x.called), r.began().Sub(x.started), r.ipam, r.at.Sub(r.assigned),
		r.dataplane, r.endpoint, r.done.Sub(r.at), x.eof.Sub(r.done), x.reaped.Sub(x.eof), end.Sub(x.reaped))
}

// take returns the record of the last ADD and forgets it.
func (s *stepLog) take() (addedRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.added
	s.added = addedRecord{}
	return r, !r.at.IsZero()
}

func (s *stepLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (s *stepLog) WithAttrs([]slog.Attr) slog.Handler           { return s }
func (s *stepLog) WithGroup(string) slog.Handler                { return s }

func (s *stepLog) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && os.Getenv("TABBY_TEST_LOG") != "" {
		fmt.Fprintln(os.Stderr, r.Level, r.Message)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Message == "CNI request done" && !s.added.at.IsZero() {
		s.added.done = r.Time
	}
	if r.Message != "workload added" {
		return nil
	}
	s.added = addedRecord{assigned: s.assigned, at: r.Time}
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "ipam":
			s.added.ipam = a.Value.Duration()
		case "prepare":
			s.added.prepare = a.Value.Duration()
		case "dataplane":
			s.added.dataplane = a.Value.Duration()
		case "endpoint":
			s.added.endpoint = a.Value.Duration()
		case "policy":
			s.added.policy = a.Value.Duration()
		}
		return true
	})
	return nil
}

// addDelCase is one plugin configuration of BenchmarkPrivilegedCNIAddDel
// and what its ADDs and DELs took.
type addDelCase struct {
	name     string
	nodePath string
	x        *timedExec
	cfg      *libcni.CNIConfig
	list     *libcni.NetworkConfigList
	steps    *stepLog // nil for the reference
	pods     []string

	adds, dels, reaps                                 []time.Duration
	before, ipam, prep, wire, after, veth, write, pol []time.Duration
}

func newAddDelCase(b *testing.B, name, nodePath string, x *timedExec, list *libcni.NetworkConfigList, steps *stepLog) *addDelCase {
	c := &addDelCase{name: name, nodePath: nodePath, x: x, list: list, steps: steps,
		cfg: libcni.NewCNIConfigWithCacheDir(x.path, b.TempDir(), x)}
	for range b.N {
		pod := testkit.NewNetNS(b, "tabby-bp").Path
		c.pods = append(c.pods, pod)
	}
	return c
}

// addDel adds and deletes pod i from a thread inside the node namespace.
func (c *addDelCase) addDel(ctx context.Context, b *testing.B, i int) error {
	return ns.WithNetNSPath(c.nodePath, func(ns.NetNS) error {
		rt := podRT(fmt.Sprintf("bench-%d", i), c.pods[i], fmt.Sprintf("bench-%d", i))
		start := time.Now()
		if _, err := c.cfg.AddNetworkList(ctx, c.list, rt); err != nil {
			return fmt.Errorf("%s: ADD %d: %w", c.name, i, err)
		}
		end := time.Now()
		c.adds = append(c.adds, end.Sub(start))
		c.x.mu.Lock()
		c.reaps = append(c.reaps, c.x.reaped.Sub(c.x.eof))
		c.x.mu.Unlock()
		if c.steps != nil {
			if r, ok := c.steps.take(); ok {
				c.before = append(c.before, r.began().Sub(start))
				c.ipam = append(c.ipam, r.ipam)
				c.prep = append(c.prep, r.prepare)
				c.wire = append(c.wire, r.at.Sub(r.assigned))
				c.after = append(c.after, end.Sub(r.at))
				c.veth = append(c.veth, r.dataplane)
				c.write = append(c.write, r.endpoint)
				c.pol = append(c.pol, r.policy)
				if os.Getenv("TABBY_BENCH_SLOW") != "" && end.Sub(start) > 25*time.Millisecond {
					b.Log(c.name, r.explain(i, start, end, c.x))
				}
			}
		}
		start = time.Now()
		if err := c.cfg.DelNetworkList(ctx, c.list, rt); err != nil {
			return fmt.Errorf("%s: DEL %d: %w", c.name, i, err)
		}
		c.dels = append(c.dels, time.Since(start))
		return nil
	})
}

func (c *addDelCase) report(b *testing.B, ref *addDelCase) {
	metric := func(v float64, unit string) { b.ReportMetric(v, c.name+"-"+unit) }
	metric(ms(testkit.Quantile(c.adds, 0.5)), "add-p50-ms")
	metric(ms(testkit.Quantile(c.adds, 0.99)), "add-p99-ms")
	metric(ms(testkit.Quantile(c.dels, 0.5)), "del-p50-ms")
	metric(ms(testkit.Quantile(c.dels, 0.99)), "del-p99-ms")
	metric(ms(testkit.Quantile(c.reaps, 0.99)), "reap-p99-ms")
	if c == ref {
		return
	}
	metric(ms(testkit.Quantile(c.adds, 0.5))/ms(testkit.Quantile(ref.adds, 0.5)), "add-p50/ref")
	metric(ms(testkit.Quantile(c.adds, 0.99))/ms(testkit.Quantile(ref.adds, 0.99)), "add-p99/ref")
	if len(c.before) > 0 {
		metric(ms(testkit.Quantile(c.before, 0.5)), "before-ms")
		metric(ms(testkit.Quantile(c.ipam, 0.5)), "ipam-ms")
		metric(ms(testkit.Quantile(c.prep, 0.5)), "prep-ms")
		metric(ms(testkit.Quantile(c.wire, 0.5)), "wire-ms")
		metric(ms(testkit.Quantile(c.after, 0.5)), "after-ms")
		metric(ms(testkit.Quantile(c.veth, 0.5)), "veth-ms")
		metric(ms(testkit.Quantile(c.write, 0.5)), "put-ms")
		metric(ms(testkit.Quantile(c.pol, 0.5)), "pol-ms")
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// timedExec runs CNI plugins as libcni's default does and notes, for the
// last run, when the process started, when its stdout reached EOF (it
// exited) and when it was reaped.
type timedExec struct {
	invoke.DefaultExec
	path                         []string // where libcni looks for plugins
	mu                           sync.Mutex
	called, started, eof, reaped time.Time
}

func newTimedExec(path ...string) *timedExec {
	return &timedExec{DefaultExec: invoke.DefaultExec{RawExec: &invoke.RawExec{}}, path: path}
}

func (e *timedExec) ExecPlugin(ctx context.Context, path string, stdin []byte, environ []string) ([]byte, error) {
	called := time.Now()
	c := exec.CommandContext(ctx, path)
	c.Env = environ
	c.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.Start(); err != nil {
		return nil, err
	}
	started := time.Now()
	stdout, rerr := io.ReadAll(out)
	eof := time.Now()
	werr := c.Wait()
	e.mu.Lock()
	e.called, e.started, e.eof, e.reaped = called, started, eof, time.Now()
	e.mu.Unlock()
	if err := errors.Join(rerr, werr); err != nil {
		return nil, fmt.Errorf("%s: %w: %s %s", path, err, stdout, stderr.Bytes())
	}
	return stdout, nil
}
