package lab

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"time"
)

// The watch relay (cmd/tabby-relay, Options.Relay, docs/scale.md "Watch
// relay") in the etcd namespace, in front of etcd itself (not the etcd
// proxy, which does not answer progress requests): the agents'
// --watch-endpoints name it; everything else they still ask etcd (or the
// proxy). Plain text, as the lab's etcd.
const relayPort = 23792

// BinRelay is the relay's binary.
const BinRelay = "tabby-relay"

// RelayURL is where the lab's watch relay serves the agents.
func (s *State) RelayURL() string {
	return "http://" + netip.AddrPortFrom(etcdAddr, relayPort).String()
}

// RelayArgv is the relay's command line for etcd at endpoints, batching
// by window (0: the relay's default).
func RelayArgv(bin string, endpoints []string, listen string, window time.Duration) []string {
	argv := []string{bin, "--etcd-endpoints", strings.Join(endpoints, ","), "--listen", listen}
	if window > 0 {
		argv = append(argv, "--batch-window", window.String())
	}
	return argv
}

// startRelay starts the relay in the etcd namespace and waits until it
// accepts connections.
func (l *Lab) startRelay(ctx context.Context) error {
	st := l.State()
	listen := netip.AddrPortFrom(etcdAddr, relayPort).String()
	argv := RelayArgv(filepath.Join(st.BinDir, BinRelay), st.EtcdEndpoints(), listen, st.RelayWindow)
	return l.startInEtcdNS(ctx, "relay", "the watch relay", argv, listen, func(s *State, p *Proc) { s.Relay = p })
}
