package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"
)

// Namespace names of the lab's infrastructure (EtcdNS also holds the
// Kubernetes control plane that lab/kube starts).
func (s *State) fabricNS() string { return s.Name + "-fabric" }
func (s *State) torNS() string    { return s.Name + "-tor" }
func (s *State) EtcdNS() string   { return s.Name + "-etcd" }

// ControlPlaneAddr is the etcd namespace's first address, where lab/kube
// runs the Kubernetes API server (the first etcd member serves there too).
func ControlPlaneAddr() netip.Addr { return etcdAddr }

// newNamespace records the namespace in the state and then creates it, so
// that a crash in between leaves nothing unrecorded.
// A namespace that exists already is an error and is not recorded: it is
// not ours to delete.
func (l *Lab) newNamespace(ctx context.Context, ns string) error {
	if netnsExists(ns) {
		return fmt.Errorf("namespace %s exists already (not made by this lab)", ns)
	}
	if err := l.Update(func(s *State) error { s.addNamespace(ns); return nil }); err != nil {
		return err
	}
	progress(l.log, "creating namespace %s", ns)
	if err := ip(ctx, "netns", "add", ns); err != nil {
		// `ip netns add` removes what it made when it fails; a namespace
		// there now was made by someone else in between.
		return errors.Join(err, l.Update(func(s *State) error { s.removeNamespace(ns); return nil }))
	}
	return ip(ctx, "-n", ns, "link", "set", "lo", "up")
}

// deleteNamespace deletes the namespace and then forgets it.
func (l *Lab) deleteNamespace(ctx context.Context, ns string) error {
	if netnsExists(ns) {
		progress(l.log, "deleting namespace %s", ns)
		if err := ip(ctx, "netns", "delete", ns); err != nil {
			return err
		}
	}
	return l.Update(func(s *State) error { s.removeNamespace(ns); return nil })
}

// makeFabric creates the fabric (bridge br0), the ToR router and the
// control-plane namespace with an address for each etcd member.
func (l *Lab) makeFabric(ctx context.Context) error {
	st := l.State()
	fab := st.fabricNS()
	if err := l.newNamespace(ctx, fab); err != nil {
		return err
	}
	if err := ip(ctx, "-n", fab, "link", "add", "br0", "type", "bridge"); err != nil {
		return err
	}
	if err := ip(ctx, "-n", fab, "link", "set", "br0", "up"); err != nil {
		return err
	}
	// The ToR forwards between the nodes but has no route out of the
	// sandbox: no default route, so anything not on the fabric is
	// unreachable.
	tor := st.torNS()
	if err := l.newNamespace(ctx, tor); err != nil {
		return err
	}
	if st.NoIPv4 {
		if err := l.attach(ctx, tor, "v-tor", netip.PrefixFrom(torAddr6, fabricNet6.Bits())); err != nil {
			return err
		}
	} else if err := l.attach(ctx, tor, "v-tor", netip.PrefixFrom(torAddr, fabricNet.Bits())); err != nil {
		return err
	}
	if err := setSysctl(tor, "net.ipv4.ip_forward", "1"); err != nil {
		return err
	}
	if st.DualStack && !st.NoIPv4 {
		if err := ip(ctx, "-n", tor, "-6", "addr", "add", netip.PrefixFrom(torAddr6, fabricNet6.Bits()).String(), "dev", "eth0", "nodad"); err != nil {
			return err
		}
		if err := setSysctl(tor, "net.ipv6.conf.all.forwarding", "1"); err != nil {
			return err
		}
	}
	etcd := st.EtcdNS()
	if err := l.newNamespace(ctx, etcd); err != nil {
		return err
	}
	bits := fabricNet.Bits()
	if st.NoIPv4 {
		bits = fabricNet6.Bits()
	}
	if err := l.attach(ctx, etcd, "v-etcd", netip.PrefixFrom(st.Etcd[0].Addr, bits)); err != nil {
		return err
	}
	for _, m := range st.Etcd[1:] {
		if err := ip(ctx, addrAdd(etcd, netip.PrefixFrom(m.Addr, bits))...); err != nil {
			return err
		}
	}
	return nil
}

// addrAdd is the `ip` command line that adds addr to eth0 in ns; an IPv6
// address skips duplicate address detection (the lab hands out the
// addresses), so that it can be bound at once.
func addrAdd(ns string, addr netip.Prefix) []string {
	args := []string{"-n", ns, "addr", "add", addr.String(), "dev", "eth0"}
	if addr.Addr().Is6() {
		args = append(args, "nodad")
	}
	return args
}

// attach connects namespace ns to the fabric bridge: a veth pair made inside
// the fabric namespace, whose end fabricIf stays there on br0 and whose other
// end moves into ns as eth0 with address addr.
func (l *Lab) attach(ctx context.Context, ns, fabricIf string, addr netip.Prefix) error {
	fab := l.State().fabricNS()
	bridge, _, _ := bridgeAndGateways(addr.Addr())
	progress(l.log, "attaching %s to the fabric (%s) as %s", ns, bridge, addr)
	steps := [][]string{
		{"-n", fab, "link", "add", fabricIf, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"-n", fab, "link", "set", fabricIf, "master", bridge, "up"},
		addrAdd(ns, addr),
		{"-n", ns, "link", "set", "eth0", "up"},
	}
	for _, s := range steps {
		if err := ip(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

// addNodeNamespace creates a node's namespace and directory: eth0 on the
// fabric, default route via the ToR (which also covers 169.254.1.1, as
// proxy ARP for the pods needs), forwarding on, and the CNI configuration.
func (l *Lab) addNodeNamespace(ctx context.Context, name string) error {
	if !nodeNameRE.MatchString(name) {
		return fmt.Errorf("node name %q: want 1-13 characters [a-z0-9-], starting with a letter", name)
	}
	var node NodeState
	err := l.Update(func(s *State) error {
		if s.Node(name) != nil {
			return fmt.Errorf("node %q exists", name)
		}
		used := map[byte]bool{} // last octets: unique across both subnets
		for _, n := range s.Nodes {
			used[n.host()] = true
		}
		for h := firstNodeHost; h <= maxNodeHost; h++ {
			if !used[byte(h)] {
				node = NodeState{Name: name, NetNS: s.Name + "-" + name, IP: nodePrefix(h)}
				if s.DualStack {
					node.IP6 = nodePrefix6(h)
				}
				if s.NoIPv4 {
					node.IP = netip.Prefix{}
				}
				if s.TwoSubnets && inSecondSubnet(len(s.Nodes)) {
					b4, b6 := secondSubnetPrefixes(h)
					node.IP = b4
					if s.DualStack {
						node.IP6 = b6
					}
				}
				s.Nodes = append(s.Nodes, node)
				return nil
			}
		}
		return errors.New("no free node address left on the fabric")
	})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(l.NodeDir(name), 0o755); err != nil {
		return fmt.Errorf("creating node directory: %w", err)
	}
	if err := l.newNamespace(ctx, node.NetNS); err != nil {
		return err
	}
	if err := l.attachNode(ctx, node); err != nil {
		return err
	}
	if err := setSysctl(node.NetNS, "net.ipv4.ip_forward", "1"); err != nil {
		return err
	}
	_, _, gw6 := bridgeAndGateways(node.Underlay().Addr())
	if node.IP6.IsValid() && node.IP.IsValid() {
		// No duplicate address detection (the lab hands out the
		// addresses), and a default route to the ToR, a dead end like the
		// IPv4 one.
		if err := ip(ctx, "-n", node.NetNS, "-6", "addr", "add", node.IP6.String(), "dev", "eth0", "nodad"); err != nil {
			return err
		}
	}
	if node.IP6.IsValid() {
		if err := ip(ctx, "-n", node.NetNS, "-6", "route", "add", "default", "via", gw6.String(), "dev", "eth0"); err != nil {
			return err
		}
	}
	return l.writeConflist(name)
}

// attachNode connects the node's namespace to the fabric with its
// underlay address (IPv4, or IPv6 on an IPv6-only fabric) and, with IPv4,
// a default route via the ToR (which also covers 169.254.1.1, as proxy
// ARP for IPv4 pods needs).
func (l *Lab) attachNode(ctx context.Context, node NodeState) error {
	if err := l.attach(ctx, node.NetNS, "v-"+node.Name, node.Underlay()); err != nil {
		return err
	}
	if !node.IP.IsValid() {
		return nil
	}
	_, gw4, _ := bridgeAndGateways(node.IP.Addr())
	return ip(ctx, "-n", node.NetNS, "route", "add", "default", "via", gw4.String(), "dev", "eth0")
}

// NodeDir is the directory of the node's files (its agent's sockets, logs,
// configuration, and what lab/kube runs on it).
func (l *Lab) NodeDir(name string) string { return filepath.Join(l.dir, name) }

func (l *Lab) trackExit(pid int, done <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.exited[pid] = done
}

func (l *Lab) exitChan(pid int) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.exited[pid]
}

// Poll calls cond every interval until it reports done or an error, or ctx
// ends; the last condition error is not kept, so cond reports fatal errors
// only.
func Poll(ctx context.Context, interval time.Duration, cond func() (bool, error)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
