package agent

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/datastore"
)

// hostIfLoop puts back, at every resync interval, the settings of the
// workload host interfaces (proxy ARP, forwarding, rp_filter, no redirects,
// no router advertisements or autoconfiguration in either family) that
// something changed behind the agent's back; ADD sets them in the first
// place (dataplane, docs/agent.md "Workload interfaces"). Each setting put
// back is logged as a warning: something on the node is fighting the
// agent.
func hostIfLoop(r dataplane.HostIfRestorer, every time.Duration, m *metrics, log *slog.Logger) loop {
	pass := func(ctx context.Context) error {
		restored, err := r.RestoreHostIfSettings(ctx)
		for _, s := range restored {
			log.Warn("workload interface setting restored", "setting", s)
		}
		return err
	}
	return loop{name: "hostif", every: every, observe: m.observeReconcile, log: log, pass: pass}
}

// ensureMeshKey creates the cluster's BGP mesh key when no agent has yet
// (docs/bgp.md, "Mesh authentication"), before the view is listed, so
// that the first BGP pass already authenticates.
func (a *Agent) ensureMeshKey(ctx context.Context) error {
	_, created, err := a.store.EnsureBGPMeshKey(ctx)
	if err != nil {
		return fmt.Errorf("ensuring the cluster's BGP mesh key: %w", err)
	}
	if created {
		a.log.Info("created the cluster's BGP mesh key", "key", datastore.BGPMeshKeyKey)
	}
	return nil
}
