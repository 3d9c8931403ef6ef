// Package lab builds a Tabby cluster on one machine out of network
// namespaces: a fabric namespace with a bridge that every other namespace
// attaches to by a veth pair, a top-of-rack router namespace that is the
// nodes' default gateway and routes nowhere else, a control-plane namespace
// running an embedded etcd, one namespace per node running tabby-agent, and
// pod namespaces wired up by the real CNI plugins invoked through libcni the
// way a container runtime invokes them.
//
// Nothing is attached to the root namespace: veth ends live in the fabric
// namespace, underlay addresses come from 198.18.0.0/24 and pod addresses
// from 10.244.0.0/16, all inside the lab's namespaces. The lab process
// reaches etcd through a unix socket that the etcd process forwards.
//
// A lab records everything it creates in <RunDir>/<Name>/state.json before
// creating it, so Teardown removes a lab also after the process that made it
// died. The command tabby-lab is a thin shell around this package; the
// end-to-end tests (package e2e) use it directly. Package lab/kube adds
// Kubernetes to a lab; what it starts is recorded in the same State, and
// this package's Down and Teardown remove it (kubeparts.go).
//
// Sizes: all namespaces share the host's IPv4 neighbour table (gc_thresh3,
// 1024 entries by default) and a full mesh holds one entry per ordered pair
// of nodes, so a full-mesh lab fits 30 nodes at the default limit; with two
// route reflectors, 85 nodes of 2 pods. Up refuses what does not fit (see
// limits.go) and fails when BGP does not converge within
// Options.ConvergeTimeout. Labs of different names coexist.
package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tabbynet/tabby/datastore"
)

// ErrNameTaken is returned by Up when a lab of that name is already up.
var ErrNameTaken = errors.New("a lab of that name is already up")

// Lab is a running lab. Its methods are safe for concurrent use.
type Lab struct {
	dir string
	log io.Writer

	mu    sync.Mutex
	st    *State
	store *datastore.Store
	// exited holds, per pid this process started, a channel closed when
	// that process exits.
	exited map[int]<-chan struct{}
	// converged is how long Up took from starting the first agent until
	// every expected BGP session was established.
	converged time.Duration
}

// ConvergedIn is how long Up took from starting the first agent until every
// expected BGP session was established (in an AutoReflectors lab: the
// reflectors elected and every node peering by the choice); 0 for a lab
// from Open.
func (l *Lab) ConvergedIn() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.converged
}

// Up creates a lab. On failure it removes whatever it had created.
func Up(ctx context.Context, o Options) (_ *Lab, err error) {
	o.Default()
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("invalid lab options: %w", err)
	}
	if err := checkHost(); err != nil {
		return nil, err
	}
	if !o.NoAgents {
		if err := checkHostFits(o.Log, o.Nodes, o.RouteReflectors+o.AutoReflectors*o.Zones, o.PodsPerNode); err != nil {
			return nil, err
		}
	}
	dir := filepath.Join(o.RunDir, o.Name)
	if netnsExists(o.Name + "-fabric") {
		return nil, fmt.Errorf("lab %q: %w (namespace %s exists)", o.Name, ErrNameTaken, o.Name+"-fabric")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating lab directory: %w", err)
	}
	st := &State{Name: o.Name, Dir: dir, Created: time.Now().UTC(), NoAgents: o.NoAgents, RouteReflectors: o.RouteReflectors, AutoReflectors: o.AutoReflectors, Zones: o.Zones, ReflectorPeering: o.ReflectorPeering, ReflectorCandidates: o.ReflectorCandidates, AgentArgs: o.AgentArgs, ClientAgentArgs: o.ClientAgentArgs, RelayWindow: o.RelayWindow, IPv4Pool: o.IPv4Pool.Masked(), DualStack: o.DualStack || o.IPv6Only || o.IPv6OnlyFabric, IPv6Only: o.IPv6Only || o.IPv6OnlyFabric, NoIPv4: o.IPv6OnlyFabric, TwoSubnets: o.TwoSubnets,
		Etcd: etcdMembers(o.EtcdMembers, o.IPv6OnlyFabric)}
	if err := claim(st, o.RunDir); err != nil {
		return nil, err
	}
	progress(o.Log, "bringing up lab %q in %s", o.Name, dir)
	l := &Lab{dir: dir, log: o.Log, st: st, exited: map[int]<-chan struct{}{}}
	keep := false
	defer func() {
		if err != nil && !keep {
			progress(o.Log, "up failed, removing what was made: %v", err)
			err = errors.Join(err, l.Down())
		}
	}()

	if err := resolveBinaries(ctx, &o, filepath.Join(dir, "bin")); err != nil {
		return nil, err
	}
	if err := l.Update(func(s *State) error {
		s.BinDir, s.LabBinary = o.BinDir, o.LabBinary
		return nil
	}); err != nil {
		return nil, err
	}
	if err := l.makeInfra(ctx, o); err != nil {
		return nil, err
	}
	if o.NoAgents {
		progress(o.Log, "lab %q is up (no agents)", o.Name)
		return l, nil
	}
	if keep, err = l.startAgents(ctx, o); err != nil {
		if keep {
			return l, err
		}
		return nil, err
	}
	progress(o.Log, "lab %q is up: %d nodes, every BGP session established", o.Name, o.Nodes)
	return l, nil
}

// makeInfra makes what the nodes' agents need: the fabric (and a second
// subnet), etcd (and its proxy), the pools and the node namespaces.
func (l *Lab) makeInfra(ctx context.Context, o Options) error {
	if err := l.makeFabric(ctx); err != nil {
		return err
	}
	if o.TwoSubnets {
		if err := l.makeSecondSubnet(ctx); err != nil {
			return err
		}
	}
	if err := l.StartEtcd(ctx); err != nil {
		return err
	}
	if o.EtcdProxy {
		if err := l.startEtcdProxy(ctx); err != nil {
			return err
		}
	}
	if o.Relay {
		if err := l.startRelay(ctx); err != nil {
			return err
		}
	}
	if o.VXLANMode != "" && !o.NoAgents {
		if err := l.createPools(ctx, o.VXLANMode); err != nil {
			return err
		}
	}
	for i := 1; i <= o.Nodes; i++ {
		if err := l.addNodeNamespace(ctx, NodeName(i)); err != nil {
			return err
		}
	}
	return nil
}

// startAgents configures the reflectors, starts every node's agent, waits
// for the BGP sessions and adds the pods. keep is true when the lab is to
// be kept although its sessions did not converge (Options.KeepUnconverged).
func (l *Lab) startAgents(ctx context.Context, o Options) (keep bool, err error) {
	if o.RouteReflectors > 0 {
		if err := l.configureRouteReflectors(ctx, o.RouteReflectors); err != nil {
			return false, err
		}
	}
	if o.AutoReflectors > 0 {
		if err := l.configureAutoReflectors(ctx, o); err != nil {
			return false, err
		}
	}
	agentsStarted := time.Now()
	for i := 1; i <= o.Nodes; i++ {
		if err := l.StartAgent(ctx, NodeName(i)); err != nil {
			return false, err
		}
	}
	for i := 1; i <= o.Nodes; i++ {
		if err := l.waitAgentServing(ctx, NodeName(i)); err != nil {
			return false, err
		}
	}
	if err := l.waitConverged(ctx, o.ConvergeTimeout); err != nil {
		return o.KeepUnconverged, err
	}
	l.mu.Lock()
	l.converged = time.Since(agentsStarted)
	l.mu.Unlock()
	for i := 1; i <= o.Nodes; i++ {
		for j := 1; j <= o.PodsPerNode; j++ {
			if _, err := l.AddPod(ctx, NodeName(i), podName(i, j), PodOptions{}); err != nil {
				return false, err
			}
		}
	}
	return false, nil
}

// waitConverged waits up to timeout for every expected BGP session. Its
// error says which nodes lack which sessions and where their logs are.
func (l *Lab) waitConverged(ctx context.Context, timeout time.Duration) error {
	if len(l.State().Nodes) < 2 {
		return nil
	}
	progress(l.log, "waiting up to %v for every BGP session", timeout)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := l.WaitEstablished(wctx); err != nil {
		if ctx.Err() != nil {
			return err
		}
		return fmt.Errorf("BGP did not converge within %v (agent logs: %s/<node>/agent.log): %w", timeout, l.dir, err)
	}
	return nil
}

// claim writes the first state of a new lab, under the directory lock so
// that two Ups of the same name cannot both succeed.
func claim(st *State, runDir string) error {
	lk, err := lockDir(st.Dir)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(st.Dir, stateFile)); err == nil {
		hint := "--name " + st.Name
		if runDir != DefaultRunDir {
			hint += " --run-dir " + runDir
		}
		return errors.Join(fmt.Errorf("lab %q: %w (state in %s; run `tabby-lab %s down` first)", st.Name, ErrNameTaken, st.Dir, hint), lk.unlock())
	}
	return errors.Join(st.save(), lk.unlock())
}

// Open returns the lab recorded in runDir/name, for commands that act on a
// lab another process brought up.
func Open(runDir, name string, log io.Writer) (*Lab, error) {
	if runDir == "" {
		runDir = DefaultRunDir
	}
	if name == "" {
		name = DefaultName
	}
	dir := filepath.Join(runDir, name)
	st, err := loadState(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no lab %q is up (no state in %s)", name, dir)
	}
	if err != nil {
		return nil, err
	}
	return &Lab{dir: dir, log: log, st: st, exited: map[int]<-chan struct{}{}}, nil
}

// Name is the lab's name, the prefix of its namespaces.
func (l *Lab) Name() string { return l.State().Name }

// Dir is the lab's directory.
func (l *Lab) Dir() string { return l.dir }

// State returns the lab's state as last written; callers must not modify it.
func (l *Lab) State() *State {
	l.mu.Lock()
	defer l.mu.Unlock()
	if st, err := loadState(l.dir); err == nil {
		l.st = st
	}
	return l.st
}

// Update applies fn to a fresh copy of the state under the directory lock
// and saves it.
func (l *Lab) Update(fn func(*State) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	lk, err := lockDir(l.dir)
	if err != nil {
		return err
	}
	st, err := loadState(l.dir)
	if err == nil {
		err = fn(st)
	}
	if err == nil {
		err = st.save()
	}
	if err == nil {
		l.st = st
	}
	return errors.Join(err, lk.unlock())
}

// Down stops every process and removes every namespace and file of the lab.
// It keeps going after errors and returns all of them.
func (l *Lab) Down() error {
	l.mu.Lock()
	var errs []error
	if l.store != nil {
		errs = append(errs, l.store.Close())
		l.store = nil
	}
	exited := l.exited
	l.mu.Unlock()
	errs = append(errs, teardown(context.Background(), l.dir, l.log, exited))
	return errors.Join(errs...)
}

// Teardown removes the lab recorded in runDir/name: it kills the processes
// the state records (only those, and only while /proc still shows what the
// lab started), deletes the namespaces it records and removes the lab's
// directory. It works after the lab's process died.
func Teardown(ctx context.Context, runDir, name string, log io.Writer) error {
	if runDir == "" {
		runDir = DefaultRunDir
	}
	if name == "" {
		name = DefaultName
	}
	if err := checkHost(); err != nil {
		return err
	}
	dir := filepath.Join(runDir, name)
	if _, err := os.Stat(filepath.Join(dir, stateFile)); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no lab %q is up (no state in %s)", name, dir)
	}
	return teardown(ctx, dir, log, nil)
}

func teardown(ctx context.Context, dir string, log io.Writer, exited map[int]<-chan struct{}) error {
	lk, err := lockDir(dir)
	if err != nil {
		return err
	}
	st, err := loadState(dir)
	if err != nil {
		return errors.Join(err, lk.unlock())
	}
	progress(log, "tearing down lab %q", st.Name)
	var errs []error
	// Kubelets first, so that nothing starts containers again, then the
	// containers, which outlive containerd.
	for _, n := range st.Nodes {
		if n.Kubelet != nil {
			if err := n.Kubelet.Stop(ctx, syscall.SIGTERM, 10*time.Second, exited[n.Kubelet.PID]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, n := range st.Nodes {
		if n.Containerd.Alive() {
			progress(log, "removing the containers of %s", n.Name)
			errs = append(errs, RemoveContainers(ctx, filepath.Join(dir, n.Name, "containerd", "containerd.sock")))
		}
	}
	for _, p := range st.stopOrder() {
		if p.Alive() {
			progress(log, "stopping %s (pid %d)", p.Role, p.PID)
		}
		if err := p.Stop(ctx, syscall.SIGTERM, 5*time.Second, exited[p.PID]); err != nil {
			errs = append(errs, err)
		}
	}
	for _, n := range st.Nodes {
		if n.CgroupRoot != "" {
			sock := filepath.Join(dir, n.Name, "containerd", "containerd.sock")
			errs = append(errs, sweepNode(ctx, n.CgroupRoot, sock, log), removeCgroupRoot(n.CgroupRoot))
		}
		if n.Containerd != nil {
			removeEmptyContainerdDirs()
		}
	}
	prefix := st.Name + "-"
	for i := len(st.Namespaces) - 1; i >= 0; i-- {
		ns := st.Namespaces[i]
		if !strings.HasPrefix(ns, prefix) {
			errs = append(errs, fmt.Errorf("state lists namespace %q without the lab's prefix %q: left alone", ns, prefix))
			continue
		}
		if !netnsExists(ns) {
			continue
		}
		progress(log, "deleting namespace %s", ns)
		if err := ip(ctx, "netns", "delete", ns); err != nil {
			errs = append(errs, err)
		}
	}
	// Nothing mounted may remain below the directory about to be removed
	// (containerd's snapshots, and later a kubelet's volumes).
	errs = append(errs, unmountUnder(dir))
	errs = append(errs, lk.unlock())
	if err := errors.Join(errs...); err != nil {
		// Keep the state so that another down can retry.
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing lab directory: %w", err)
	}
	progress(log, "lab %q is down", st.Name)
	return nil
}

// Store is the lab's datastore connection to its etcd (through the unix
// socket), or nil before the lab connected (Up connects; a lab from Open
// connects on first use).
func (l *Lab) Store() *datastore.Store {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.store
}

// connect opens the datastore connection unless it is open.
func (l *Lab) connect(ctx context.Context) (*datastore.Store, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.store != nil {
		return l.store, nil
	}
	var eps []string
	for _, m := range l.st.Etcd {
		eps = append(eps, "unix://"+l.EtcdSocket(m.Name))
	}
	s, err := datastore.New(ctx, datastore.Config{Endpoints: eps})
	if err != nil {
		return nil, fmt.Errorf("connecting to the lab's etcd: %w", err)
	}
	l.store = s
	return s, nil
}

// EtcdSocket is where the lab process reaches the etcd member: each member
// forwards its own unix socket to its client URL.
func (l *Lab) EtcdSocket(member string) string { return filepath.Join(l.dir, member+".sock") }
