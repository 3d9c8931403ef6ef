package relay

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// metrics count what a relay does. Every Relay has them; Handler serves
// them with its health.
type metrics struct {
	reg      *prometheus.Registry
	streams  prometheus.Gauge
	watches  prometheus.Counter
	refused  prometheus.Counter
	received prometheus.Counter
	sends    prometheus.Counter
	events   prometheus.Counter
	upErrs   prometheus.Counter
}

func newMetrics() *metrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "tabby_relay_" + name, Help: help})
	}
	m := &metrics{
		reg: prometheus.NewRegistry(),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tabby_relay_streams",
			Help: "Agents' watch streams the relay serves (one etcd watch stream each)."}),
		watches:  counter("watches_created_total", "Watches the agents asked to create through the relay."),
		refused:  counter("watches_refused_total", "Watches refused because their keys lie outside the relay's prefix."),
		received: counter("responses_received_total", "Watch responses received from etcd."),
		sends:    counter("responses_sent_total", "Watch responses sent to agents (after merging: fewer than received under churn)."),
		events:   counter("events_sent_total", "Watch events sent to agents."),
		upErrs:   counter("upstream_errors_total", "Agents' streams ended because etcd's stream failed."),
	}
	m.reg.MustRegister(m.streams, m.watches, m.refused, m.received, m.sends, m.events, m.upErrs,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// readyTimeout bounds /readyz's read of etcd.
const readyTimeout = 2 * time.Second

// Handler serves the relay's metrics (/metrics, Prometheus), its liveness
// (/livez: the process serves) and its readiness (/readyz: etcd answers a
// read under the prefix; an agent's watch through a relay that cannot
// reach etcd would fail).
func (r *Relay) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, req *http.Request) {
		if err := r.ready(req.Context()); err != nil {
			http.Error(w, "etcd: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// ready reads the count of one key, the prefix's own, from etcd: a
// lookup, not a walk of the prefix (etcd counts every key of a range), and
// linearizable, so a member cut off from its cluster's leader is not ready
// either.
func (r *Relay) ready(ctx context.Context) error {
	if r.kv == nil {
		return errors.New("no etcd client")
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	_, err := r.kv.Get(ctx, r.prefix, clientv3.WithCountOnly())
	return err
}
