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
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// PeerInfo is one BGP session in the status API.
type PeerInfo struct {
	Address string    `json:"address"`
	Type    string    `json:"type"`
	State   string    `json:"state"`
	Since   time.Time `json:"since,omitzero"`
	Info    string    `json:"info,omitempty"`
}

// Status is what GET /status returns and what the agent publishes to
// status/bgp/<node>.
type Status struct {
	Node       string     `json:"node"`
	Address    string     `json:"address"`
	ASN        uint32     `json:"asn"`
	Ready      bool       `json:"ready"`
	Peers      []PeerInfo `json:"peers"`
	Blocks     []string   `json:"blocks"`
	Advertised []string   `json:"advertised"`
	Workloads  int        `json:"workloads"`
}

// Status reports the agent's current state.
func (a *Agent) Status() Status {
	ready, _ := a.readiness()
	a.mu.Lock()
	defer a.mu.Unlock()
	st := Status{Node: a.cfg.NodeName, Address: a.nodeAddr.String(), ASN: a.speakerCfg.ASN, Ready: ready, Workloads: a.workloads,
		Peers: []PeerInfo{}, Blocks: []string{}, Advertised: []string{}}
	types := map[string]string{}
	for _, p := range a.desiredPeers {
		types[p.Address.String()] = string(p.Type)
	}
	for _, p := range a.peerStatus {
		t := string(p.Type)
		if t == "" {
			t = types[p.Address.String()]
		}
		st.Peers = append(st.Peers, PeerInfo{Address: p.Address.String(), Type: t, State: p.State, Since: p.Since, Info: p.Info})
	}
	for _, b := range a.localBlocks {
		st.Blocks = append(st.Blocks, b.String())
	}
	for _, p := range a.advertised {
		st.Advertised = append(st.Advertised, p.String())
	}
	return st
}

func marshalStatus(st Status) ([]byte, error) {
	st.Ready = false // not part of the published record: it flaps with time
	return json.Marshal(st)
}

// liveness: every loop has run recently.
func (a *Agent) liveness() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	limit := 3*a.cfg.ResyncInterval + 30*time.Second
	if time.Since(a.started) < limit {
		return nil
	}
	if time.Since(a.lastRouting) > limit {
		return fmt.Errorf("routing loop has not completed a pass for %s", time.Since(a.lastRouting).Round(time.Second))
	}
	if time.Since(a.lastBGP) > limit {
		return fmt.Errorf("bgp loop has not completed a pass for %s", time.Since(a.lastBGP).Round(time.Second))
	}
	return nil
}

// readiness: datastore reachable recently, CNI server listening, every
// desired BGP session established.
func (a *Agent) readiness() (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var errs []error
	if !a.cniListening {
		errs = append(errs, errors.New("cni server not listening"))
	}
	if time.Since(a.lastStoreOK) > 2*a.cfg.ResyncInterval+10*time.Second {
		errs = append(errs, errors.New("datastore not reached recently"))
	}
	est := map[string]bool{}
	for _, p := range a.peerStatus {
		if p.State == "Established" {
			est[p.Address.String()] = true
		}
	}
	for _, p := range a.desiredPeers {
		if !est[p.Address.String()] {
			errs = append(errs, fmt.Errorf("bgp session to %s not established", p.Address))
		}
	}
	err := errors.Join(errs...)
	return err == nil, err
}

func (a *Agent) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
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
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{}))
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
		ln, err := net.Listen("unix", a.cfg.StatusSocket)
		if err != nil {
			return fmt.Errorf("status socket: %w", err)
		}
		if err := os.Chmod(a.cfg.StatusSocket, 0o600); err != nil {
			ln.Close()
			return fmt.Errorf("status socket: %w", err)
		}
		lns = append(lns, ln)
	}
	if a.cfg.HTTPListen != "" {
		ln, err := net.Listen("tcp", a.cfg.HTTPListen)
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
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	for range lns {
		if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
	}
	return err
}
