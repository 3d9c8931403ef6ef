package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/cni"
	"github.com/tabbynet/tabby/datastore"
)

// Status reports the agent's current state.
func (a *Agent) Status() api.AgentStatus {
	ready, _ := a.readiness()
	st := api.AgentStatus{Node: a.cfg.NodeName, Address: a.primaryAddress(), Ready: ready,
		Peers: []api.PeerStatus{}, Blocks: []string{}, Advertised: []string{}}
	if a.view != nil {
		st.Workloads = len(a.view.EndpointsOn(a.cfg.NodeName))
	}
	if a.policy != nil {
		st.HostEndpoints = a.policy.hostEndpoints()
	}
	if a.tunnel != nil {
		st.Tunnels = a.tunnel.status()
	}
	if a.bgp == nil {
		return st
	}
	b := a.bgp
	b.mu.Lock()
	defer b.mu.Unlock()
	st.ASN = b.speakerCfg.ASN
	types := map[string]string{}
	for _, p := range b.desiredPeers {
		types[p.Address.String()] = string(p.Type)
	}
	for _, p := range b.peerStatus {
		t := string(p.Type)
		if t == "" {
			t = types[p.Address.String()]
		}
		st.Peers = append(st.Peers, api.PeerStatus{Address: p.Address.String(), Type: t, State: p.State.String(), Since: p.Since, Info: p.Info,
			PrefixLimitExceeded: p.PrefixLimitExceeded, Received: p.Received, MaxPrefixes: p.MaxPrefixes, BFD: p.BFD, Families: p.Families})
	}
	for _, p := range b.localBlocks {
		st.Blocks = append(st.Blocks, p.String())
	}
	for _, p := range b.advertised {
		st.Advertised = append(st.Advertised, p.String())
	}
	st.Services = b.serviceStatus()
	b.problemStatus(&st)
	for _, r := range b.refused {
		rs := api.RefusedPeerStatus{Name: r.Name, Reason: r.Reason}
		if r.Address.IsValid() {
			rs.Address = r.Address.String()
		}
		st.RefusedPeers = append(st.RefusedPeers, rs)
	}
	if a.view != nil {
		self, _ := a.view.Node(a.cfg.NodeName)
		st.Reflectors = a.reflectors.status(a.view.BGPConfiguration(), self)
	}
	return st
}

func marshalStatus(st api.AgentStatus) ([]byte, error) {
	st.Ready = false // not part of the published record: it flaps with time
	return json.Marshal(st)
}

// statusLoop publishes this node's status to the datastore under the
// liveness lease, so that any node can show the whole cluster, and keeps
// the workload route gauge.
func (a *Agent) statusLoop(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	var last []byte
	var lastLease datastore.LeaseID
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, _, _ := a.routes.stats()
		a.metrics.routes.WithLabelValues("workload").Set(float64(n))
		b, err := marshalStatus(a.Status())
		lease := a.lease.current()
		// A new lease means the old one expired and took the record with it.
		if err != nil || (slices.Equal(b, last) && lease == lastLease) {
			continue
		}
		if _, err := a.store.PutKV(ctx, datastore.NodeStatusKey(a.cfg.NodeName), b, lease); err != nil {
			if !errors.Is(err, context.Canceled) {
				a.log.Debug("publishing status failed", "err", err)
			}
			continue
		}
		last, lastLease = b, lease
	}
}

// liveness: every owner's loop has run recently (each runs at least once
// per resync interval).
func (a *Agent) liveness() error {
	if p := a.panicked.Load(); p != nil {
		return fmt.Errorf("%s: a restart re-reads what it may have left half-changed", *p)
	}
	limit := 3*a.cfg.ResyncInterval + 30*time.Second
	if time.Since(a.started) < limit || a.routes == nil || a.bgp == nil {
		return nil
	}
	if _, last, _ := a.routes.stats(); time.Since(last) > limit {
		return fmt.Errorf("routing loop has not completed a pass for %s", time.Since(last).Round(time.Second))
	}
	a.bgp.mu.Lock()
	last := a.bgp.lastPass
	a.bgp.mu.Unlock()
	if time.Since(last) > limit {
		return fmt.Errorf("bgp loop has not completed a pass for %s", time.Since(last).Round(time.Second))
	}
	return nil
}

// stepPanicked is attach.Runner.Panicked: the panic and its stack go to
// the log, and the first one ends the agent's liveness.
func (a *Agent) stepPanicked(plan, step string, v any, stack []byte) {
	a.log.Error("a CNI step panicked", "plan", plan, "step", step, "panic", fmt.Sprint(v), "stack", string(stack))
	msg := fmt.Sprintf("CNI %s step %s panicked: %v", plan, step, v)
	a.panicked.CompareAndSwap(nil, &msg)
}

// readiness: this node can network its pods. The cluster view is synced,
// the datastore is reachable (etcd answered for the liveness lease within
// leaseHolder.unreachableAfter), the CNI server listens, the routes (and
// policy, when enforced) have been programmed, and BGP is established with
// at least one cluster peer when any is configured. One peer down does not
// make the node unready, so that a rolling update of the agents never turns
// every other node unready; per-peer state is in the status and the
// metrics. Without etcd every agent turns unready, which stops a rolling
// update from restarting agents that could not start again (docs/agent.md,
// "Lifecycle"); nothing else follows from an agent's readiness.
func (a *Agent) readiness() (bool, error) {
	var errs []error
	if a.lease != nil {
		if d, limit := a.lease.sinceRenewed(), a.lease.unreachableAfter(); d > limit {
			errs = append(errs, fmt.Errorf("datastore unreachable: etcd has not answered for %s", d.Round(time.Second)))
		}
	}
	if !a.cniListening.Load() {
		errs = append(errs, errors.New("cni server not listening"))
	}
	if a.view == nil || !a.view.Synced() {
		errs = append(errs, errors.New("cluster view not synced with the datastore"))
	}
	if a.routes == nil {
		errs = append(errs, errors.New("routes not programmed yet"))
	} else if _, _, ok := a.routes.stats(); !ok {
		errs = append(errs, errors.New("routes not programmed yet"))
	}
	if a.policy != nil && !a.policy.programmed() {
		errs = append(errs, errors.New("policy not programmed yet"))
	}
	if a.bgp != nil {
		if err := a.bgp.ready(); err != nil {
			errs = append(errs, err)
		}
	}
	err := errors.Join(errs...)
	return err == nil, err
}

func (a *Agent) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		if a.bgp != nil {
			a.bgp.refreshCounts(r.Context())
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(a.Status())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := a.liveness(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if _, err := a.readiness(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	a.whatifRoutes(mux)
	a.probeRoutes(mux)
	mux.HandleFunc("GET /flows", a.serveFlows)
	metrics := promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if a.bgp != nil {
			a.bgp.refreshCounts(r.Context()) // received prefixes, see countSoon
		}
		metrics.ServeHTTP(w, r)
	})
	return mux
}

// serveStatus serves the HTTP API on the status socket and on HTTPListen.
func (a *Agent) serveStatus(ctx context.Context) error {
	var lns []net.Listener
	if a.cfg.StatusSocket != "" {
		if err := os.MkdirAll(filepath.Dir(a.cfg.StatusSocket), 0o700); err != nil {
			return fmt.Errorf("status socket: %w", err)
		}
		if err := os.Remove(a.cfg.StatusSocket); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("status socket: %w", err)
		}
		ln, err := cni.ListenUnixPrivate(a.cfg.StatusSocket)
		if err != nil {
			return fmt.Errorf("status socket: %w", err)
		}
		lns = append(lns, ln)
	}
	if a.cfg.HTTPListen.IsValid() {
		ln, err := net.Listen("tcp", a.cfg.HTTPListen.String())
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return fmt.Errorf("http listen %s: %w", a.cfg.HTTPListen, err)
		}
		lns = append(lns, ln)
	}
	srv := &http.Server{Handler: a.httpHandler(), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, len(lns))
	for _, ln := range lns {
		go func() { errc <- srv.Serve(ln) }()
	}
	<-ctx.Done()
	// ctx has ended: shut down under a deadline of its own.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	for range lns {
		if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
	}
	return err
}
