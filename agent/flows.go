package agent

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/flowlog"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/syncer"
)

// FlowSources read the kernel for flow logs (dataplane.ListenNFLOG and
// dataplane.ListenConntrack in production; tests pass fakes).
type FlowSources struct {
	NFLOG     func(ctx context.Context, group uint16, out func(dataplane.PacketLog), lost func()) error
	Conntrack func(ctx context.Context, out func(dataplane.ConnEvent)) error
	// Accounting turns conntrack accounting on (nil: nothing to do).
	Accounting func() error
}

// flowOwner runs the flow logs (docs/flows.md): it feeds the aggregator
// from the kernel, keeps the origin and endpoint indexes it reads, and
// flushes it every interval.
type flowOwner struct {
	cfg   flowlog.Config
	agg   *flowlog.Aggregator
	view  *syncer.Syncer
	src   FlowSources
	log   *slog.Logger
	feeds flowFeeds

	origins atomic.Pointer[map[string]*policy.Origin]
	// addrs is the address index Endpoint reads (flowindex.go).
	addrs *addrIndex
}

type endpointInfo struct {
	ep    api.FlowEndpoint
	local bool
}

func newFlowOwner(cfg flowlog.Config, node string, view *syncer.Syncer, src FlowSources, log *slog.Logger) *flowOwner {
	f := &flowOwner{cfg: cfg, view: view, src: src, log: log, addrs: newAddrIndex(node)}
	f.agg = flowlog.New(cfg, node, f, f)
	f.feeds = watchFlowFeeds(view)
	empty := map[string]*policy.Origin{}
	f.origins.Store(&empty)
	return f
}

// Origin implements flowlog.Origins.
func (f *flowOwner) Origin(id string) *policy.Origin { return (*f.origins.Load())[id] }

// Endpoint implements flowlog.Resolver from the address index: safe for
// concurrent use with the owner's loop.
func (f *flowOwner) Endpoint(a netip.Addr) (api.FlowEndpoint, bool) {
	if e, ok := f.addrs.lookup(a.Unmap()); ok {
		return e.ep, e.local
	}
	return api.FlowEndpoint{Kind: api.FlowEndpointExternal}, false
}

// applied indexes the origins of a ruleset the firewall now enforces.
func (f *flowOwner) applied(rs *policy.Ruleset) {
	m := map[string]*policy.Origin{}
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			if r.Origin != nil {
				m[r.Origin.ID()] = r.Origin
			}
		}
	}
	f.origins.Store(&m)
}

// run feeds and flushes the aggregator until ctx ends. Each source runs
// in one goroutine, restarted after a failure.
func (f *flowOwner) run(ctx context.Context) {
	f.addrs.start(f.view, f.feeds)
	var wg sync.WaitGroup
	keep := func(name string, run func() error) {
		wg.Go(func() {
			for attempt := 0; ctx.Err() == nil; attempt++ {
				if err := run(); err != nil && ctx.Err() == nil {
					f.log.Warn("flow log source failed, restarting", "source", name, "err", err)
					f.agg.Lost()
				}
				select {
				case <-ctx.Done():
				case <-time.After(backoff(attempt)):
				}
			}
		})
	}
	if f.cfg.Mode.Denies() && f.src.NFLOG != nil {
		keep("nflog", func() error { return f.src.NFLOG(ctx, f.cfg.Group, f.agg.Packet, f.agg.Lost) })
	}
	if f.cfg.Mode.Allows() && f.src.Conntrack != nil {
		if f.src.Accounting != nil {
			if err := f.src.Accounting(); err != nil {
				f.log.Warn("flow logs: allowed flows will have no packet counts", "err", err)
			}
		}
		keep("conntrack", func() error { return f.src.Conntrack(ctx, f.agg.Conn) })
	}
	t := time.NewTicker(f.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-f.feeds.nodes.C():
			f.addrs.follow(f.view, f.feeds)
		case <-f.feeds.eps.C():
			f.addrs.follow(f.view, f.feeds)
		case <-f.feeds.remote.C():
			f.addrs.follow(f.view, f.feeds)
		case now := <-t.C:
			f.agg.Flush(now)
		}
	}
}

// serveFlows answers GET /flows: the records the query's filter keeps, as
// JSON lines, oldest first.
func (a *Agent) serveFlows(w http.ResponseWriter, r *http.Request) {
	if a.flows == nil {
		http.Error(w, "flow logs are off on node "+a.cfg.NodeName+" (tabby-agent --flow-logs deny|all)", http.StatusNotFound)
		return
	}
	f, err := api.ParseFlowFilter(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/jsonl")
	enc := json.NewEncoder(w)
	for _, rec := range a.flows.agg.Query(f) {
		if err := enc.Encode(rec); err != nil {
			if !errors.Is(err, context.Canceled) {
				a.log.Debug("writing flows", "err", err)
			}
			return
		}
	}
}
