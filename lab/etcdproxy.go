package lab

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"time"
)

// The etcd project's gRPC proxy (`etcd grpc-proxy start`) in front of the
// lab's etcd (Options.EtcdProxy, docs/scale.md): it coalesces identical
// watches, so etcd serves one watch per proxy instead of one per agent.
// `tabby-lab etcd-proxy` runs etcd's own command (go.etcd.io/etcd/server's
// etcdmain, the release go.mod names) in the etcd namespace, like a
// per-node-group proxy; the agents' --etcd-endpoints name it.
const (
	etcdProxyPort        = 23790
	etcdProxyMetricsPort = 23791
)

// EtcdProxyURL is where the lab's gRPC proxy serves clients.
func (s *State) EtcdProxyURL() string {
	return "http://" + netip.AddrPortFrom(etcdAddr, etcdProxyPort).String()
}

// agentEtcdEndpoints are the endpoints agents get: the proxy's when the
// lab has one, else every member's.
func (s *State) agentEtcdEndpoints() []string {
	if s.EtcdProxy != nil {
		return []string{s.EtcdProxyURL()}
	}
	return s.EtcdEndpoints()
}

// EtcdProxyArgs is the `etcd grpc-proxy start` command line (after the
// program name) for a proxy of endpoints listening on listen.
func EtcdProxyArgs(endpoints []string, listen, metrics string) []string {
	var eps []string
	for _, e := range endpoints {
		eps = append(eps, strings.TrimPrefix(e, "http://"))
	}
	return []string{"grpc-proxy", "start", "--endpoints=" + strings.Join(eps, ","), "--listen-addr=" + listen, "--metrics-addr=" + metrics}
}

// startEtcdProxy starts the proxy in the etcd namespace and waits until it
// accepts connections.
func (l *Lab) startEtcdProxy(ctx context.Context) error {
	st := l.State()
	listen := netip.AddrPortFrom(etcdAddr, etcdProxyPort).String()
	metrics := "http://" + netip.AddrPortFrom(etcdAddr, etcdProxyMetricsPort).String()
	argv := append([]string{st.LabBinary, "etcd-proxy", "--"}, EtcdProxyArgs(st.EtcdEndpoints(), listen, metrics)...)
	return l.startInEtcdNS(ctx, "etcd-proxy", "etcd grpc-proxy", argv, listen, func(s *State, p *Proc) { s.EtcdProxy = p })
}

// startInEtcdNS starts a service of the lab's (name: its log, PID file and
// process role) in the etcd namespace, records it with set and waits until
// it accepts connections on listen (30 s at most).
func (l *Lab) startInEtcdNS(ctx context.Context, name, what string, argv []string, listen string, set func(*State, *Proc)) error {
	st := l.State()
	progress(l.log, "starting %s in %s at %s", what, st.EtcdNS(), listen)
	p, _, err := l.StartDetached(name, st.EtcdNS(), argv, filepath.Join(l.dir, name+".log"), PIDFile(l.dir, name))
	if err != nil {
		return err
	}
	if err := l.Update(func(s *State) error { set(s, p); return nil }); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = Poll(wctx, 100*time.Millisecond, func() (bool, error) {
		if !p.Alive() {
			return false, fmt.Errorf("%s exited; see %s", what, p.Log)
		}
		c, err := DialIn(wctx, st.EtcdNS(), "tcp", listen)
		if err != nil {
			return false, nil
		}
		return true, c.Close()
	})
	if err != nil {
		return fmt.Errorf("waiting for %s: %w", what, err)
	}
	return nil
}
