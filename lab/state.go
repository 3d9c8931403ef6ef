package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// stateFile is the name of the lab's state file inside its directory. It is
// rewritten (atomically) after every change, before the change is made
// where that matters, so that Teardown can undo a lab whose process died
// half way.
const stateFile = "state.json"

// lockFile serialises changes from several processes (tabby-lab pod add in
// two shells, a test and the CLI).
const lockFile = "lock"

// State is what a lab records about itself in its directory.
type State struct {
	Name      string    `json:"name"`
	Dir       string    `json:"dir"`
	BinDir    string    `json:"binDir"`
	LabBinary string    `json:"labBinary"`
	Created   time.Time `json:"created"`
	NoAgents  bool      `json:"noAgents,omitempty"`
	// RouteReflectors is how many of the first nodes are route reflectors.
	RouteReflectors int `json:"routeReflectors,omitempty"`
	// AutoReflectors and Zones: see Options.AutoReflectors.
	AutoReflectors int `json:"autoReflectors,omitempty"`
	Zones          int `json:"zones,omitempty"`
	// ReflectorPeering: see Options.ReflectorPeering.
	ReflectorPeering string `json:"reflectorPeering,omitempty"`
	// ReflectorCandidates: see Options.ReflectorCandidates.
	ReflectorCandidates int `json:"reflectorCandidates,omitempty"`
	// DualStack: see Options.DualStack (also set for IPv6Only).
	DualStack bool `json:"dualStack,omitempty"`
	// TwoSubnets: see Options.TwoSubnets.
	TwoSubnets bool `json:"twoSubnets,omitempty"`
	// IPv6Only: see Options.IPv6Only.
	IPv6Only bool `json:"ipv6Only,omitempty"`
	// NoIPv4: the fabric is IPv6-only (Options.IPv6OnlyFabric).
	NoIPv4 bool `json:"noIPv4,omitempty"`
	// IPv4Pool is the agents' default IPv4 pool (Options.IPv4Pool); see
	// Pool4.
	IPv4Pool netip.Prefix `json:"ipv4Pool,omitzero"`
	// AgentArgs are appended to every agent's command line.
	AgentArgs []string `json:"agentArgs,omitempty"`
	// ClientAgentArgs are appended to the command line of every agent
	// after the reflectors and candidates (Options.ClientAgentArgs).
	ClientAgentArgs []string `json:"clientAgentArgs,omitempty"`
	// RelayWindow is the watch relay's batching window (Options.RelayWindow;
	// 0: the relay's default).
	RelayWindow time.Duration `json:"relayWindow,omitempty"`
	// Namespaces lists every network namespace the lab made (or was about
	// to make), in creation order. Teardown deletes them in reverse.
	Namespaces []string `json:"namespaces"`
	// Etcd lists the members of the lab's etcd cluster, recorded before
	// any is started.
	Etcd []EtcdMember `json:"etcdMembers"`
	// EtcdProxy is the etcd gRPC proxy the agents use (Options.EtcdProxy).
	EtcdProxy *Proc `json:"etcdProxy,omitempty"`
	// Relay is the watch relay the agents' views use (Options.Relay).
	Relay *Proc `json:"relay,omitempty"`
	// FloorWatch is the scale harness's bare etcd watcher (lab/simfloor.go),
	// while it runs: recorded so that teardown stops it whatever became of
	// the sim.
	FloorWatch *Proc `json:"floorWatch,omitempty"`
	// Kube is the Kubernetes control plane, once StartControlPlane ran.
	Kube  *ControlPlane `json:"kube,omitempty"`
	Nodes []NodeState   `json:"nodes"`
	Pods  []PodState    `json:"pods"`
}

// Pool4 is the agents' default IPv4 pool: Options.IPv4Pool, else PodPool.
func (s *State) Pool4() netip.Prefix {
	if s.IPv4Pool.IsValid() {
		return s.IPv4Pool
	}
	return podPool
}

// EtcdMember is one member of the lab's etcd cluster: a `tabby-lab etcd`
// process in the etcd namespace serving clients and peers on its own
// address, with its own data directory, log and unix socket, all named
// after it.
type EtcdMember struct {
	Name string     `json:"name"` // etcd, etcd2, etcd3, …
	Addr netip.Addr `json:"addr"` // 198.18.0.2, .3, …
	Proc *Proc      `json:"proc,omitempty"`
}

// ClientURL is where the member serves clients on the fabric.
func (m *EtcdMember) ClientURL() string {
	return "http://" + netip.AddrPortFrom(m.Addr, etcdClientPort).String()
}

func (m *EtcdMember) peerURL() string {
	return "http://" + netip.AddrPortFrom(m.Addr, etcdPeerPort).String()
}

// etcdMembers names and addresses the n members of a lab's etcd cluster.
func etcdMembers(n int, v6 bool) []EtcdMember {
	ms := make([]EtcdMember, n)
	a := etcdAddr
	if v6 {
		a = etcdAddr6
	}
	for i := range ms {
		ms[i] = EtcdMember{Name: "etcd", Addr: a}
		if i > 0 {
			ms[i].Name = fmt.Sprintf("etcd%d", i+1)
		}
		a = a.Next()
	}
	return ms
}

func (s *State) etcdMember(name string) *EtcdMember {
	for i := range s.Etcd {
		if s.Etcd[i].Name == name {
			return &s.Etcd[i]
		}
	}
	return nil
}

// stopOrder lists the lab's processes in the order teardown stops them:
// kubelets, then container runtimes (their pods need the agents only to
// be torn down, which the lab does by deleting namespaces), kube-proxies,
// agents (a graceful exit needs nothing from etcd), the sim's floor
// watcher, the Kubernetes control plane, then etcd.
func (s *State) stopOrder() []*Proc {
	var procs []*Proc
	for _, of := range []func(NodeState) *Proc{
		func(n NodeState) *Proc { return n.Kubelet },
		func(n NodeState) *Proc { return n.Containerd },
		func(n NodeState) *Proc { return n.KubeProxy },
		func(n NodeState) *Proc { return n.Agent },
	} {
		for _, n := range s.Nodes {
			if p := of(n); p != nil {
				procs = append(procs, p)
			}
		}
	}
	if s.FloorWatch != nil {
		procs = append(procs, s.FloorWatch)
	}
	procs = append(procs, s.Kube.procs()...)
	return append(procs, s.etcdProcs()...)
}

// etcdProcs are the processes of the etcd members that were started.
func (s *State) etcdProcs() []*Proc {
	var ps []*Proc
	if s.EtcdProxy != nil {
		ps = append(ps, s.EtcdProxy)
	}
	if s.Relay != nil {
		ps = append(ps, s.Relay)
	}
	for _, m := range s.Etcd {
		if m.Proc != nil {
			ps = append(ps, m.Proc)
		}
	}
	return ps
}

// EtcdEndpoints are the client URLs of every etcd member, as the agents
// are given them.
func (s *State) EtcdEndpoints() []string {
	var eps []string
	for _, m := range s.Etcd {
		eps = append(eps, m.ClientURL())
	}
	return eps
}

// Underlay is the node's address on its fabric link: the IPv4 one, or the
// IPv6 one on an IPv6-only fabric.
func (n *NodeState) Underlay() netip.Prefix {
	if n.IP.IsValid() {
		return n.IP
	}
	return n.IP6
}

// host is the last byte of the node's underlay address (unique in a lab).
func (n *NodeState) host() byte {
	b := n.Underlay().Addr().AsSlice()
	if len(b) == 0 {
		return 0
	}
	return b[len(b)-1]
}

// NodeState is one node of the lab.
type NodeState struct {
	Name  string       `json:"name"`
	NetNS string       `json:"netns"`
	IP    netip.Prefix `json:"ip"` // 198.18.0.x/24
	// IP6 is the node's IPv6 fabric address in a dual-stack lab.
	IP6   netip.Prefix `json:"ip6,omitzero"`
	Agent *Proc        `json:"agent,omitempty"`
	// Zone is the node's zone label in an AutoReflectors lab.
	Zone string `json:"zone,omitempty"`
	// NotCandidate marks a node that may not be elected reflector
	// (Options.ReflectorCandidates).
	NotCandidate bool `json:"notCandidate,omitempty"`
	// Containerd is the node's containerd, when the lab started one.
	Containerd *Proc `json:"containerd,omitempty"`
	// Kubelet is the node's kubelet, and CgroupRoot its cgroup root
	// (recorded before it is created), when the lab started one.
	Kubelet    *Proc  `json:"kubelet,omitempty"`
	CgroupRoot string `json:"cgroupRoot,omitempty"`
	// KubeProxy is the node's kube-proxy, when the lab started one (its
	// rules live in the node's namespace and go with it).
	KubeProxy *Proc `json:"kubeProxy,omitempty"`
}

// PodState is one pod: a network namespace wired up by the CNI plugins.
type PodState struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	Node        string            `json:"node"`
	NetNS       string            `json:"netns"`
	ContainerID string            `json:"containerID"`
	IfName      string            `json:"ifName"`
	Labels      map[string]string `json:"labels,omitempty"`
	// IPv6Only: added with the node's IPv6-only network configuration.
	IPv6Only bool `json:"ipv6Only,omitempty"`
	// IPs is empty while the pod is being added, and stays empty when its
	// ADD failed and so did the DEL after it (DelPod can be retried).
	IPs []netip.Prefix `json:"ips,omitempty"`
}

// Proc is a background process the lab started.
type Proc struct {
	Role string `json:"role"`
	PID  int    `json:"pid"`
	// Argv is the command line as started (nsenter … prog args); after
	// nsenter has exec'd, /proc/<pid>/cmdline shows the part after the
	// nsenter options.
	Argv      []string `json:"argv"`
	StartTime uint64   `json:"startTime"` // /proc/<pid>/stat field 22, guards against pid reuse
	Log       string   `json:"log"`
}

// Node is the named node's record, or nil.
func (s *State) Node(name string) *NodeState {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i]
		}
	}
	return nil
}

// NodeToStart is the named node's record for starting the process of it
// that proc picks out (role names that process in the error): an error if
// there is no such node or that process is alive.
func (s *State) NodeToStart(name, role string, proc func(*NodeState) *Proc) (*NodeState, error) {
	n := s.Node(name)
	if n == nil {
		return nil, fmt.Errorf("no node %q", name)
	}
	if p := proc(n); p.Alive() {
		return nil, fmt.Errorf("the %s of %s is running (pid %d)", role, name, p.PID)
	}
	return n, nil
}

func (s *State) pod(name string) *PodState {
	for i := range s.Pods {
		if s.Pods[i].Name == name {
			return &s.Pods[i]
		}
	}
	return nil
}

func (s *State) addNamespace(ns string) {
	if !slices.Contains(s.Namespaces, ns) {
		s.Namespaces = append(s.Namespaces, ns)
	}
}

func (s *State) removeNamespace(ns string) {
	s.Namespaces = slices.DeleteFunc(s.Namespaces, func(n string) bool { return n == ns })
}

// loadState reads the state of the lab in dir.
func loadState(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, fmt.Errorf("reading lab state: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("decoding lab state %s: %w", filepath.Join(dir, stateFile), err)
	}
	return &s, nil
}

// save writes the state atomically.
func (s *State) save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding lab state: %w", err)
	}
	path := filepath.Join(s.Dir, stateFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing lab state: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing lab state: %w", err)
	}
	return nil
}

// dirLock is an exclusive flock on the lab directory's lock file.
type dirLock struct{ f *os.File }

func lockDir(dir string) (*dirLock, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("locking lab directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return nil, errors.Join(fmt.Errorf("locking lab directory: %w", err), f.Close())
	}
	return &dirLock{f: f}, nil
}

func (l *dirLock) unlock() error {
	// Closing the file releases the flock.
	return l.f.Close()
}
