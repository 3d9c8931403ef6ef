package lab

import (
	"context"
	"fmt"
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

// RelayArgv is the relay's command line for etcd at endpoints.
func RelayArgv(bin string, endpoints []string, listen string) []string {
	return []string{bin, "--etcd-endpoints", strings.Join(endpoints, ","), "--listen", listen}
}

// startRelay starts the relay in the etcd namespace and waits until it
// accepts connections.
func (l *Lab) startRelay(ctx context.Context) error {
	st := l.State()
	listen := netip.AddrPortFrom(etcdAddr, relayPort).String()
	argv := RelayArgv(filepath.Join(st.BinDir, BinRelay), st.EtcdEndpoints(), listen)
	progress(l.log, "starting the watch relay in %s at %s", st.EtcdNS(), listen)
	p, done, err := startDetached("relay", st.EtcdNS(), argv, filepath.Join(l.dir, "relay.log"), PIDFile(l.dir, "relay"))
	if err != nil {
		return err
	}
	l.trackExit(p.PID, done)
	if err := l.Update(func(s *State) error { s.Relay = p; return nil }); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = Poll(wctx, 100*time.Millisecond, func() (bool, error) {
		if !p.Alive() {
			return false, fmt.Errorf("tabby-relay exited; see %s", p.Log)
		}
		c, err := DialIn(wctx, st.EtcdNS(), "tcp", listen)
		if err != nil {
			return false, nil
		}
		return true, c.Close()
	})
	if err != nil {
		return fmt.Errorf("waiting for the watch relay: %w", err)
	}
	return nil
}
