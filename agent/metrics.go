package agent

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tabbynet/tabby/agent/attach"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer"
)

// metrics are the agent's Prometheus metrics, in a registry of its own.
type metrics struct {
	reg          *prometheus.Registry
	cniOps       *prometheus.CounterVec
	cniLatency   *prometheus.HistogramVec
	cniSteps     *prometheus.HistogramVec
	reconcileErr *prometheus.CounterVec
	reconcileDur *prometheus.HistogramVec
	routes       *prometheus.GaugeVec
	peers        *peerMetrics // per peer, built at scrape time
	ipamAssigns  *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		cniOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_cni_operations_total", Help: "CNI operations handled, by operation and result.",
		}, []string{"op", "result"}),
		cniLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tabby_cni_operation_duration_seconds", Help: "Latency of CNI operations in the agent.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"op"}),
		cniSteps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tabby_cni_step_duration_seconds", Help: "Duration of each step of a CNI operation in the agent, by operation, step and result.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5},
		}, []string{"op", "step", "result"}),
		reconcileErr: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_reconcile_errors_total", Help: "Failed reconcile passes, by loop.",
		}, []string{"loop"}),
		reconcileDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tabby_reconcile_duration_seconds", Help: "Duration of reconcile passes, by loop.",
			Buckets: prometheus.DefBuckets,
		}, []string{"loop"}),
		routes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tabby_routes_installed", Help: "Kernel routes the agent owns, by kind (workload, bgp, service).",
		}, []string{"kind"}),
		peers: newPeerMetrics(),
		ipamAssigns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_ipam_assigns_total", Help: "IPAM address assignments for CNI ADD, by result (ok, borrowed, error).",
		}, []string{"result"}),
	}
	m.reg.MustRegister(m.ipamAssigns, m.cniOps, m.cniLatency, m.cniSteps, m.reconcileErr, m.reconcileDur, m.routes, m.peers,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

func (m *metrics) observeCNI(op string, d time.Duration, err error) {
	m.cniOps.WithLabelValues(op, result(err)).Inc()
	m.cniLatency.WithLabelValues(op).Observe(d.Seconds())
}

// observeStep records one step of a CNI operation (attach.Runner.Observe).
func (m *metrics) observeStep(op string, t attach.Timing) {
	m.cniSteps.WithLabelValues(op, t.Name, result(t.Err)).Observe(t.Took().Seconds())
}

func (m *metrics) observeAssign(borrowed bool, err error) {
	switch {
	case err != nil:
		m.ipamAssigns.WithLabelValues("error").Inc()
	case borrowed:
		m.ipamAssigns.WithLabelValues("borrowed").Inc()
	default:
		m.ipamAssigns.WithLabelValues("ok").Inc()
	}
}

func (m *metrics) observeReconcile(loop string, d time.Duration, err error) {
	m.reconcileDur.WithLabelValues(loop).Observe(d.Seconds())
	if err != nil {
		m.reconcileErr.WithLabelValues(loop).Inc()
	}
}

// setPeers makes st the sessions the metrics show; st is handed over
// (read, never changed, afterwards).
func (m *metrics) setPeers(st []bgp.PeerStatus) { m.peers.set(st) }

// watchStore exports the datastore's request counts and the cluster
// view's counters; called once the store and the view exist.
func (m *metrics) watchStore(s *datastore.Store, v *syncer.Syncer) {
	for _, op := range []struct {
		name string
		get  func(datastore.Requests) int64
	}{
		{"get", func(r datastore.Requests) int64 { return r.Get }},
		{"list", func(r datastore.Requests) int64 { return r.List }},
		{"txn", func(r datastore.Requests) int64 { return r.Txn }},
		{"put", func(r datastore.Requests) int64 { return r.Put }},
	} {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tabby_datastore_requests_total", Help: "Requests sent to etcd, by operation (get, list: reads; txn, put: writes).",
			ConstLabels: prometheus.Labels{"op": op.name},
		}, func() float64 { return float64(op.get(s.Requests())) }))
	}
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tabby_view_events_total", Help: "Datastore watch events the cluster view processed.",
		}, func() float64 { return float64(v.Stats().Events) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tabby_view_updates_total", Help: "Changes of the cluster view (events that changed nothing it holds are not counted).",
		}, func() float64 { return float64(v.Stats().Updates) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tabby_view_revision", Help: "The etcd revision the cluster view has reached.",
		}, func() float64 { return float64(v.Revision()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tabby_ipam_unreadable_blocks", Help: "IPAM block records in the cluster that do not decode (kept as last seen; see tabbyctl ipam check).",
		}, func() float64 { return float64(len(v.UnreadableBlocks())) }),
	)
}

// watchIPAM exports how often this node's allocations went around an
// unreadable block.
func (m *metrics) watchIPAM(al *ipam.Allocator) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "tabby_ipam_unreadable_block_skips_total", Help: "Allocations that went around an IPAM block record that does not decode.",
	}, func() float64 { _, n := al.UnreadableBlocks(); return float64(n) }))
}
