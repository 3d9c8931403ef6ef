package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tabbynet/tabby/agent/installcni"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp/session"
	"github.com/tabbynet/tabby/datastore"
)

// Files of a node in its directory.
func (l *Lab) cniSocket(node string) string    { return filepath.Join(l.NodeDir(node), "cni.sock") }
func (l *Lab) statusSocket(node string) string { return filepath.Join(l.NodeDir(node), "status.sock") }

// ConflistPath is the node's CNI network configuration, in the directory a
// runtime on the node (lab/kube's containerd) reads.
func (l *Lab) ConflistPath(node string) string {
	return filepath.Join(l.NodeDir(node), "net.d", "10-tabby.conflist")
}

// conflistPath6 is the node's IPv6-only network configuration (labs with
// an IPv6 underlay).
func (l *Lab) conflistPath6(node string) string {
	return filepath.Join(l.NodeDir(node), "net.d", "ipv6-only", "10-tabby.conflist")
}

func (l *Lab) podConflistPath(node string, p *PodState) string {
	if p.IPv6Only {
		return l.conflistPath6(node)
	}
	return l.ConflistPath(node)
}

// portmapDirs are where Debian's CNI plugins live; the lab adds portmap to
// the chain when one of them has it.
var portmapDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// PluginDir is the directory holding the CNI plugin name among
// portmapDirs, or "" when none has it.
func PluginDir(name string) string {
	for _, d := range portmapDirs {
		if fi, err := os.Stat(filepath.Join(d, name)); err == nil && !fi.IsDir() {
			return d
		}
	}
	return ""
}

// writeConflist writes the node's CNI network configuration.
func (l *Lab) writeConflist(node string) error {
	// Rendered the way tabby-agent install-cni renders a node's: the same
	// template, unless this host lacks the portmap plugin it chains.
	tmpl := installcni.DefaultTemplate
	if PluginDir("portmap") == "" {
		tmpl = tabbyOnlyTemplate
	}
	// MTU 0: the agent chooses (the tunnel's while a pool encapsulates).
	b, _, err := installcni.Render(tmpl, 0, l.cniSocket(node))
	if err != nil {
		return fmt.Errorf("writing CNI configuration: %w", err)
	}
	files := map[string][]byte{l.ConflistPath(node): b}
	if st := l.State(); st.DualStack {
		// Without an IPv4 underlay every pod is IPv6-only, also the
		// runtime's (lab/kube) through the node's default network.
		if files[l.ConflistPath(node)], err = withFamilies(b, !st.NoIPv4, true); err != nil {
			return fmt.Errorf("writing CNI configuration: %w", err)
		}
		if files[l.conflistPath6(node)], err = withFamilies(b, false, true); err != nil {
			return fmt.Errorf("writing CNI configuration: %w", err)
		}
	}
	for path, b := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("writing CNI configuration: %w", err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return fmt.Errorf("writing CNI configuration: %w", err)
		}
	}
	return nil
}

// tabbyOnlyTemplate is installcni.DefaultTemplate without portmap.
const tabbyOnlyTemplate = `{
  "name": "k8s-pod-network",
  "cniVersion": "1.0.0",
  "plugins": [{"type": "tabby", "agent_socket": "` + installcni.PlaceholderAgentSocket + `", "mtu": ` + installcni.PlaceholderMTU + `}]
}
`

// agentArgv is the agent's command line for a node.
func (l *Lab) agentArgv(st *State, n *NodeState) []string {
	d := l.NodeDir(n.Name)
	argv := []string{
		filepath.Join(st.BinDir, BinAgent),
		"--node-name", n.Name,
		"--etcd-endpoints", strings.Join(st.agentEtcdEndpoints(), ","),
		"--cni-socket", l.cniSocket(n.Name),
		"--status-socket", l.statusSocket(n.Name),
		"--state-dir", filepath.Join(d, "state"),
		"--http-listen", AgentHTTPListen,
	}
	if st.Relay != nil {
		argv = append(argv, "--watch-endpoints", st.RelayURL())
	}
	if n.IP.IsValid() {
		argv = append(argv, "--node-ip", n.IP.String(), "--default-ipv4-pool", st.Pool4().String())
	} else {
		// An IPv6-only node (Calico's IP=none): no IPv4 autodetection.
		argv = append(argv, "--node-ip", "none")
	}
	if n.IP6.IsValid() {
		argv = append(argv, "--node-ip6", n.IP6.String(), "--default-ipv6-pool", PodPool6)
	}
	argv = append(argv, st.AgentArgs...)
	if st.reflectorCandidate(n.Name) {
		return argv
	}
	return append(argv, st.ClientAgentArgs...)
}

// reflectorCandidate reports whether node is one of the first nodes that
// reflect (RouteReflectors) or may be elected to (ReflectorCandidates).
func (st *State) reflectorCandidate(node string) bool {
	var i int
	if _, err := fmt.Sscanf(node, "node%d", &i); err != nil {
		return false
	}
	return i <= max(st.RouteReflectors, st.ReflectorCandidates)
}

// StartAgent starts the node's tabby-agent in the node's namespace (again,
// after StopAgent). It does not wait for the agent to serve.
func (l *Lab) StartAgent(ctx context.Context, node string) error {
	st := l.State()
	n, err := st.NodeToStart(node, "agent", func(n *NodeState) *Proc { return n.Agent })
	if err != nil {
		return err
	}
	d := l.NodeDir(node)
	if err := os.MkdirAll(filepath.Join(d, "state"), 0o755); err != nil {
		return fmt.Errorf("creating agent state directory: %w", err)
	}
	progress(l.log, "starting tabby-agent on %s (%s)", node, n.Underlay())
	p, done, err := startDetached("agent "+node, n.NetNS, l.agentArgv(st, n), filepath.Join(d, "agent.log"), PIDFile(d, "agent"))
	if err != nil {
		return err
	}
	l.trackExit(p.PID, done)
	return l.Update(func(s *State) error {
		if n := s.Node(node); n != nil {
			n.Agent = p
			return nil
		}
		return fmt.Errorf("node %q vanished while starting its agent", node)
	})
}

// StopAgent sends sig to the node's agent and waits until it exited
// (SIGKILL after 10 s). SIGTERM is the agent's graceful exit.
func (l *Lab) StopAgent(ctx context.Context, node string, sig syscall.Signal) error {
	n := l.State().Node(node)
	if n == nil {
		return fmt.Errorf("no node %q", node)
	}
	if n.Agent == nil {
		return nil
	}
	progress(l.log, "stopping tabby-agent on %s (pid %d, %v)", node, n.Agent.PID, sig)
	return n.Agent.Stop(ctx, sig, 10*time.Second, l.exitChan(n.Agent.PID))
}

// waitAgentServing waits until the node's agent answers on its status
// socket and has its CNI socket.
func (l *Lab) waitAgentServing(ctx context.Context, node string) error {
	n := l.State().Node(node)
	if n == nil {
		return fmt.Errorf("no node %q", node)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err := Poll(ctx, 100*time.Millisecond, func() (bool, error) {
		if !n.Agent.Alive() {
			return false, fmt.Errorf("the agent of %s exited; see %s", node, n.Agent.Log)
		}
		if _, err := os.Stat(l.cniSocket(node)); err != nil {
			return false, nil
		}
		_, err := l.NodeStatus(ctx, node)
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the agent of %s: %w", node, err)
	}
	return nil
}

// AgentGet fetches path from the node's agent over its status socket
// (HTTP on a unix socket) and returns the HTTP status and the body.
func (l *Lab) AgentGet(ctx context.Context, node, path string) (int, []byte, error) {
	sock := l.statusSocket(node)
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	defer c.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent"+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s on %s: %w", path, node, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s on %s: %w", path, node, err)
	}
	return resp.StatusCode, body, nil
}

// NodeStatus asks the node's agent for its status (GET /status).
func (l *Lab) NodeStatus(ctx context.Context, node string) (*api.AgentStatus, error) {
	code, body, err := l.AgentGet(ctx, node, "/status")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("status of %s: %s: %s", node, http.StatusText(code), body)
	}
	var s api.AgentStatus
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, fmt.Errorf("status of %s: decoding: %w", node, err)
	}
	return &s, nil
}

// configureRouteReflectors turns the node-to-node mesh off and makes the
// first k nodes route reflectors: their Node resources are created with the
// label route-reflector=true and a cluster ID before their agents start (an
// agent keeps labels and cluster ID and fills in its addresses), and two
// BGPPeers peer the reflectors with each other and every other node with
// the reflectors.
func (l *Lab) configureRouteReflectors(ctx context.Context, k int) error {
	s, err := l.connect(ctx)
	if err != nil {
		return err
	}
	progress(l.log, "configuring route reflectors: node1-node%d, node-to-node mesh off", k)
	off := false
	objs := []api.Object{&api.BGPConfiguration{
		Metadata: api.ObjectMeta{Name: api.SingletonName},
		Spec:     api.BGPConfigurationSpec{NodeToNodeMeshEnabled: &off},
	}}
	st := l.State()
	for i := 1; i <= k; i++ {
		n := st.Node(NodeName(i))
		if n == nil {
			return fmt.Errorf("no node %q", NodeName(i))
		}
		objs = append(objs, &api.Node{
			Metadata: api.ObjectMeta{Name: n.Name, Labels: map[string]string{"route-reflector": "true"}},
			Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{
				IPv4Address:             prefixOrEmpty(n.IP),
				IPv6Address:             prefixOrEmpty(n.IP6),
				RouteReflectorClusterID: rrClusterID,
			}},
		})
	}
	reflectors := &api.LabelSelector{MatchLabels: map[string]string{"route-reflector": "true"}}
	objs = append(objs,
		&api.BGPPeer{
			Metadata: api.ObjectMeta{Name: "rr-mesh"},
			Spec:     api.BGPPeerSpec{NodeSelector: reflectors, PeerSelector: reflectors},
		},
		&api.BGPPeer{
			Metadata: api.ObjectMeta{Name: "rr-clients"},
			Spec: api.BGPPeerSpec{
				NodeSelector: &api.LabelSelector{MatchExpressions: []api.LabelSelectorRequirement{{Key: "route-reflector", Operator: api.OpDoesNotExist}}},
				PeerSelector: reflectors,
			},
		})
	for _, o := range objs {
		if _, err := s.Apply(ctx, o); err != nil {
			return fmt.Errorf("writing %s %s: %w", o.GetTypeMeta().Kind, o.GetMeta().Name, err)
		}
	}
	return nil
}

// expectedPeers is how many BGP sessions each node should have.
func expectedPeers(st *State) map[string]int {
	want := map[string]int{}
	k := st.RouteReflectors
	for i, n := range st.Nodes {
		switch {
		case k == 0:
			want[n.Name] = len(st.Nodes) - 1
		case i < k: // a reflector peers with every other node
			want[n.Name] = len(st.Nodes) - 1
		default: // a client peers with the reflectors
			want[n.Name] = k
		}
	}
	return want
}

// WaitEstablished waits until every node's agent reports the expected
// number of BGP sessions (full mesh, or reflectors and their clients), all
// Established.
func (l *Lab) WaitEstablished(ctx context.Context) error {
	st := l.State()
	want := expectedPeers(st)
	var problem error
	err := Poll(ctx, 200*time.Millisecond, func() (bool, error) {
		if st.AutoReflectors > 0 {
			problem = l.autoEstablished(ctx, st)
			return problem == nil, nil
		}
		var errs []error
		for _, n := range st.Nodes {
			s, err := l.NodeStatus(ctx, n.Name)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			est := 0
			for _, p := range s.Peers {
				if p.State == session.Established.String() {
					est++
				}
			}
			if est != want[n.Name] || len(s.Peers) != want[n.Name] {
				errs = append(errs, fmt.Errorf("%s: %d of %d sessions established (%d peers)", n.Name, est, want[n.Name], len(s.Peers)))
			}
		}
		if ctx.Err() != nil && problem != nil {
			return false, nil // keep the problem of the last complete round
		}
		problem = errors.Join(errs...)
		return problem == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for BGP sessions: %w: %w", err, orNoRound(problem))
	}
	return nil
}

// WaitRoutes waits until every node has a BGP route (proto 81) to each
// block the other nodes report, via that node's address.
func (l *Lab) WaitRoutes(ctx context.Context) error {
	st := l.State()
	var problem error
	err := Poll(ctx, 200*time.Millisecond, func() (bool, error) {
		var errs []error
		blocks := map[string][]string{}
		for _, n := range st.Nodes {
			s, err := l.NodeStatus(ctx, n.Name)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			blocks[n.Name] = s.Blocks
		}
		for _, n := range st.Nodes {
			have, err := learnedRoutes(ctx, n)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, o := range st.Nodes {
				if o.Name == n.Name {
					continue
				}
				for _, b := range blocks[o.Name] {
					via := o.IP.Addr()
					if !strings.Contains(b, ".") {
						if !n.IP6.IsValid() || !o.IP6.IsValid() {
							continue
						}
						via = o.IP6.Addr()
					}
					if !slices.Contains(have[b], via.String()) {
						errs = append(errs, fmt.Errorf("%s has no route to %s via %s (%s)", n.Name, b, via, o.Name))
					}
				}
			}
		}
		if ctx.Err() != nil && problem != nil {
			return false, nil // keep the problem of the last complete round
		}
		problem = errors.Join(errs...)
		return problem == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for routes: %w: %w", err, orNoRound(problem))
	}
	return nil
}

// parseRoutes maps each destination of `ip route` output to its gateways
// ("via X", or "nexthop via X" lines of a multipath route).
// LearnedRoutes reads the routes node's agent learned over BGP (proto
// 81) from its kernel: destination → next hops. A node with an IPv6
// address has its IPv6 routes in it too.
func (l *Lab) LearnedRoutes(ctx context.Context, node string) (map[string][]string, error) {
	n := l.State().Node(node)
	if n == nil {
		return nil, fmt.Errorf("no node %s in lab %s", node, l.State().Name)
	}
	return learnedRoutes(ctx, *n)
}

func learnedRoutes(ctx context.Context, n NodeState) (map[string][]string, error) {
	out, err := run(ctx, "ip", "-n", n.NetNS, "-4", "route", "show", "proto", "81")
	if err != nil {
		return nil, err
	}
	have := parseRoutes(string(out))
	if n.IP6.IsValid() {
		// IPv6 blocks (BGP carries them between nodes with an IPv6
		// address), via the owner's IPv6 address.
		out6, err := run(ctx, "ip", "-n", n.NetNS, "-6", "route", "show", "proto", "81")
		if err != nil {
			return nil, err
		}
		maps.Copy(have, parseRoutes(string(out6)))
	}
	return have, nil
}

func parseRoutes(out string) map[string][]string {
	routes := map[string][]string{}
	dst := ""
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if f[0] != "nexthop" {
			dst = f[0]
			if _, ok := routes[dst]; !ok {
				routes[dst] = nil
			}
		}
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "via" {
				routes[dst] = append(routes[dst], f[i+1])
			}
		}
	}
	return routes
}

// prefixOrEmpty is p as a Node record holds it, "" when invalid.
func prefixOrEmpty(p netip.Prefix) string {
	if !p.IsValid() {
		return ""
	}
	return p.String()
}

// removeNodeResource deletes the node's Node resource (missing is fine).
func removeNodeResource(ctx context.Context, s *datastore.Store, node string) error {
	err := s.Delete(ctx, api.KindNode, "", node, "")
	if err != nil && !errors.Is(err, datastore.ErrNotFound) {
		return fmt.Errorf("deleting Node %s: %w", node, err)
	}
	return nil
}

// orNoRound is problem, or an error saying no round finished in time.
func orNoRound(problem error) error {
	if problem == nil {
		return errors.New("the deadline passed before one round of checks finished")
	}
	return problem
}

// withFamilies sets "ipam": {"assign_ipv4": …, "assign_ipv6": …}
// (Calico's spelling) on the conflist's Tabby plugin.
func withFamilies(conflist []byte, v4, v6 bool) ([]byte, error) {
	var cl map[string]any
	if err := json.Unmarshal(conflist, &cl); err != nil {
		return nil, err
	}
	plugins, _ := cl["plugins"].([]any)
	for _, p := range plugins {
		if m, ok := p.(map[string]any); ok && m["type"] == "tabby" {
			m["ipam"] = map[string]any{"assign_ipv4": strconv.FormatBool(v4), "assign_ipv6": strconv.FormatBool(v6)}
		}
	}
	out, err := json.MarshalIndent(cl, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
