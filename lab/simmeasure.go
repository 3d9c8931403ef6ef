package lab

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tabbynet/tabby/bgp/session"
	"github.com/tabbynet/tabby/datastore/relay"
	"github.com/tabbynet/tabby/internal/procstat"
	"github.com/tabbynet/tabby/internal/stats"
)

// step grows the lab to size simulated nodes and measures.
func (r *simRun) step(ctx context.Context, size int) (res SimResult, err error) {
	res = SimResult{Nodes: size, Endpoints: size * r.o.EndpointsPerNode, Policies: r.o.Policies, EtcdProxy: r.o.EtcdProxy, Relay: r.o.Relay, Zones: r.o.Zones, ReflectorPeering: r.o.ReflectorPeering}
	lat, err := r.grow(ctx, size)
	defer func() { res.SessionDrops, res.SessionOpensFailed = r.drops.take() }()
	if err != nil {
		return res, err
	}
	lat.fill(&res)
	if r.o.Watch {
		rev, err := r.l.Store().PutKV(ctx, "sim/marker", []byte(time.Now().String()), 0)
		if err != nil {
			return res, err
		}
		for _, n := range r.nodes {
			n.watch(ctx, rev+1)
		}
	}
	err = r.measureLoad(ctx, &res)
	for _, n := range r.nodes {
		n.stopWatch()
	}
	if err != nil {
		return res, err
	}
	r.drops.enter(phasePolicy)
	if err := r.measurePolicy(ctx, &res); err != nil {
		return res, err
	}
	r.drops.enter(phaseRestart)
	err = r.measureRestart(ctx, &res)
	r.drops.enter("")
	return res, errors.Join(err, r.checkChoice(ctx))
}

// usage is a process's CPU time so far (s, clock ticks), resident memory
// (MiB) and its threads' CPU time (ns: what window.cpu takes when it can).
type usage struct {
	cpu, rss float64
	threads  procstat.Process
}

// snapshot reads the real agents', etcd's, the relay's and the proxy's usage.
func (r *simRun) snapshot() (map[string]usage, error) {
	st := r.l.State()
	out := map[string]usage{}
	add := func(key string, p *Proc) error {
		if p == nil {
			return nil
		}
		c, m, err := procUsage(p.PID)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		th, err := procstat.Read(p.PID)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		out[key] = usage{c, m, th}
		return nil
	}
	for _, n := range st.Nodes {
		if err := add(n.Name, n.Agent); err != nil {
			return nil, err
		}
	}
	if err := add("etcd", st.Etcd[0].Proc); err != nil {
		return nil, err
	}
	if err := add(floorKey, r.floor); err != nil {
		return nil, err
	}
	if err := add("relay", st.Relay); err != nil {
		return nil, err
	}
	return out, add("proxy", st.EtcdProxy)
}

// settleTimeout bounds waitSettled.
const settleTimeout = 5 * time.Minute

// waitSettled waits until every real client's kernel holds a route to every
// block the simulated nodes advertise, and the reflectors have sent the
// simulated nodes all they had queued (waitQuiet).
func (r *simRun) waitSettled(ctx context.Context) error {
	want := map[string]bool{}
	for _, n := range r.nodes {
		n.mu.Lock()
		for b := range n.blocks {
			want[b.String()] = true
		}
		n.mu.Unlock()
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	for _, c := range r.clients {
		for {
			have, err := r.l.LearnedRoutes(wctx, c)
			missing := 0
			for b := range want {
				if _, ok := have[b]; !ok {
					missing++
				}
			}
			if err == nil && missing == 0 {
				break
			}
			if wctx.Err() != nil {
				return fmt.Errorf("settling: %s still lacks %d of %d simulated blocks' routes after %s (last error: %v)", c, missing, len(want), settleTimeout, err)
			}
			sleepCtx(wctx, time.Second)
		}
	}
	r.l.Progress("settled in %s: every real client holds the %d simulated blocks' routes", time.Since(start).Round(time.Second), len(want))
	_, _ = r.waitQuiet(ctx)
	return ctx.Err()
}

// window is what the real agents, etcd and the proxy used over one
// interval of secs seconds.
type window struct {
	from, to map[string]usage
	secs     float64
}

// cpu is the CPU seconds key used in the window, from its threads'
// nanosecond counts (procstat) unless one of them exited in the window,
// then from the process's 10 ms clock ticks; rate is per second.
func (w window) cpu(key string) float64 {
	from, to := w.from[key], w.to[key]
	if from.threads != nil && to.threads != nil {
		if d, exact := to.threads.Since(from.threads); exact {
			return d.CPU.Seconds()
		}
	}
	return to.cpu - from.cpu
}

func (w window) rate(key string) float64 { return w.cpu(key) / w.secs }

// measure runs fn between two snapshots.
func (r *simRun) measure(fn func() error) (window, error) {
	s0, err := r.snapshot()
	if err != nil {
		return window{}, err
	}
	t0 := time.Now()
	if err := fn(); err != nil {
		return window{}, err
	}
	s1, err := r.snapshot()
	if err != nil {
		return window{}, err
	}
	return window{from: s0, to: s1, secs: time.Since(t0).Seconds()}, nil
}

// perEvent is what one event cost process key, in µs of CPU: the churn
// window's CPU minus what the mean of the rates of the rests before and
// after it (restA, restB) would have used in as long, divided by the
// events. noise is what half the difference between the two rests' rates
// makes over the churn window, per event: a figure within it is not told
// apart from the rest's own variation. Either may be negative.
func perEvent(key string, restA, churn, restB window, events int) (us, noise float64) {
	us, noise = beyondRests(restA.rate(key), churn.cpu(key), restB.rate(key), churn.secs, events)
	return 1e6 * us, 1e6 * noise
}

// beyondRests is how much more than the rests' mean rate (ra, rb per
// second) the churn's amount x over secs seconds is, per event, and half
// the rests' difference over the churn, per event (perEvent's noise).
func beyondRests(ra, x, rb, secs float64, events int) (per, noise float64) {
	n := float64(max(events, 1))
	return (x - (ra+rb)/2*secs) / n, math.Abs(ra-rb) / 2 * secs / n
}

// clientCounterNames are the client agents' counters read around each
// window of measureLoad.
var clientCounterNames = []string{"tabby_view_events_total", "go_gc_duration_seconds_count"}

// wakesPerEvent is process key's voluntary context switches per event:
// the churn's beyond the mean rate of the rests (perEvent's arithmetic);
// ok is false when a window's threads were not all read at both ends.
func wakesPerEvent(key string, restA, churn, restB window, events int) (float64, bool) {
	va, okA := restA.voluntary(key)
	vc, okC := churn.voluntary(key)
	vb, okB := restB.voluntary(key)
	if !okA || !okC || !okB {
		return 0, false
	}
	per, _ := beyondRests(va/restA.secs, vc, vb/restB.secs, churn.secs, events)
	return per, true
}

// voluntary is key's threads' voluntary context switches in the window;
// ok is false when its threads were not all read at both ends.
func (w window) voluntary(key string) (float64, bool) {
	from, to := w.from[key].threads, w.to[key].threads
	d, exact := to.Since(from)
	if from == nil || to == nil || !exact {
		return 0, false
	}
	return float64(d.Voluntary), true
}

// clientCounters reads the named counters of each client agent's metrics
// (tabby_view_events_total, go_gc_duration_seconds_count); an agent that
// does not answer is left out.
func (r *simRun) clientCounters(ctx context.Context, names ...string) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	for _, c := range r.clients {
		code, body, err := r.l.AgentGet(ctx, c, "/metrics")
		if err != nil || code != http.StatusOK {
			continue
		}
		if g, err := parseGauges(bytes.NewReader(body), names...); err == nil {
			out[c] = g
		}
	}
	return out
}

// counterSteps is, for each client read at every point of at, how much
// counter name grew between consecutive points.
func counterSteps(name string, at ...map[string]map[string]float64) map[string][]float64 {
	out := map[string][]float64{}
	for c := range at[0] {
		var steps []float64
		for i := 1; i < len(at); i++ {
			a, okA := at[i-1][c][name]
			b, okB := at[i][c][name]
			if !okA || !okB {
				steps = nil
				break
			}
			steps = append(steps, b-a)
		}
		if steps != nil {
			out[c] = steps
		}
	}
	return out
}

// measureLoad measures a rest, a churn of a fixed number of pod events, and
// a second rest. The first rest starts once the cluster has settled
// (waitSettled): measured straight after the fill, it held the agents and
// reflectors still taking in a thousand new routes. The churn's cost is
// taken against both rests (perEvent), whose difference is its noise.
func (r *simRun) measureLoad(ctx context.Context, res *SimResult) error {
	r.drops.enter(phaseSettle)
	if err := r.waitSettled(ctx); err != nil {
		return err
	}
	if err := r.waitStable(ctx, "the rest"); err != nil {
		return err
	}
	rest := func() error { sleepCtx(ctx, r.o.IdleWindow); return ctx.Err() }
	r.drops.enter(phaseRest)
	r.l.Progress("measuring %s at rest", r.o.IdleWindow)
	at0 := r.clientCounters(ctx, clientCounterNames...)
	restA, err := r.measure(rest)
	if err != nil {
		return err
	}
	at1 := r.clientCounters(ctx, clientCounterNames...)
	if err := r.waitStable(ctx, "the churn"); err != nil {
		return err
	}
	r.drops.enter(phaseChurn)
	r.l.Progress("churning %d pod events at %g/s", r.o.ChurnEvents, r.o.ChurnRate)
	var events int
	at2 := r.clientCounters(ctx, clientCounterNames...)
	churn, err := r.measure(func() (err error) { events, err = r.churn(ctx); return err })
	if err != nil {
		return err
	}
	at3 := r.clientCounters(ctx, clientCounterNames...)
	if err := r.waitStable(ctx, "the second rest"); err != nil {
		return err
	}
	r.drops.enter(phaseRestB)
	r.l.Progress("%d pod events in %.1f s; measuring %s at rest again", events, churn.secs, r.o.IdleWindow)
	restB, err := r.measure(rest)
	if err != nil {
		return err
	}
	at4 := r.clientCounters(ctx, clientCounterNames...)
	res.Events, res.ChurnFailures, res.ChurnSeconds = events, r.churnFailures, churn.secs
	sessions, err := r.reflectorSessions(ctx)
	if err != nil {
		return err
	}
	r.agentLoad(res, restA, churn, restB, events, sessions)
	var viewPer []float64
	for _, steps := range counterSteps("tabby_view_events_total", at2, at3) {
		viewPer = append(viewPer, steps[0]/float64(max(events, 1)))
	}
	res.AgentViewEventsPerEvent = median(viewPer)
	res.AgentGCCycles = map[string][]int{}
	for c, steps := range counterSteps("go_gc_duration_seconds_count", at0, at1, at2, at3, at4) {
		// the steps: rest, the wait for stable sessions, churn, the wait
		// and the second rest
		res.AgentGCCycles[c] = []int{int(steps[0]), int(steps[2]), int(steps[3])}
	}
	r.l.Progress("client agents per pod event: %.0f µs of CPU, %.2f view events, %.2f voluntary context switches; their collections in the first rest, the churn and the second rest: %v",
		res.AgentUsPerEvent, res.AgentViewEventsPerEvent, res.AgentWakesPerEvent, res.AgentGCCycles)
	r.etcdLoad(res, restA, churn, restB)
	g, err := r.l.EtcdGauges(ctx, "etcd_debugging_mvcc_watcher_total", "etcd_debugging_mvcc_watch_stream_total")
	if err != nil {
		return err
	}
	res.EtcdWatchers, res.EtcdWatchStreams = int(g["etcd_debugging_mvcc_watcher_total"]), int(g["etcd_debugging_mvcc_watch_stream_total"])
	res.Load, err = loadAverage1m()
	return err
}

// reflectorSessions is each reflector's count of established BGP
// sessions (its agent's status).
func (r *simRun) reflectorSessions(ctx context.Context) (map[string]int, error) {
	out := map[string]int{}
	for _, rr := range r.rrs {
		s, err := r.l.NodeStatus(ctx, rr)
		if err != nil {
			return nil, err
		}
		for _, p := range s.Peers {
			if p.State == session.Established.String() {
				out[rr]++
			}
		}
	}
	return out, nil
}

// agentLoad fills the real agents' figures: medians of the client agents
// and of the reflectors, and each reflector's; idle is the mean of the two
// rests; a reflector's clients are its established sessions (sessions).
func (r *simRun) agentLoad(res *SimResult, restA, churn, restB window, events int, sessions map[string]int) {
	idleRate := func(key string) float64 { return (restA.rate(key) + restB.rate(key)) / 2 }
	var us, noise, idlePct, rss, wakes []float64
	for _, c := range r.clients {
		u, n := perEvent(c, restA, churn, restB, events)
		us, noise = append(us, u), append(noise, n)
		if w, ok := wakesPerEvent(c, restA, churn, restB, events); ok {
			wakes = append(wakes, w)
		}
		idlePct = append(idlePct, 100*idleRate(c))
		rss = append(rss, churn.to[c].rss)
	}
	res.AgentUsPerEvent, res.AgentUsPerEventNoise = median(us), median(noise)
	res.AgentWakesPerEvent = median(wakes)
	res.AgentIdlePct, res.AgentRSSMiB = median(idlePct), median(rss)
	if _, ok := churn.to[floorKey]; ok {
		res.FloorMeasured = true
		res.FloorUsPerEvent, res.FloorUsPerEventNoise = perEvent(floorKey, restA, churn, restB, events)
		res.FloorIdlePct = 100 * idleRate(floorKey)
	}
	var rrPct, rrRSS, rrSessions []float64
	st := r.l.State()
	res.Reflectors = nil
	for _, c := range r.rrs {
		f := ReflectorFigures{Node: c, Zone: st.Node(c).Zone, Sessions: sessions[c], RSSMiB: churn.to[c].rss, IdlePct: 100 * idleRate(c)}
		res.Reflectors = append(res.Reflectors, f)
		rrPct, rrRSS, rrSessions = append(rrPct, f.IdlePct), append(rrRSS, f.RSSMiB), append(rrSessions, float64(f.Sessions))
	}
	res.RRIdlePct, res.RRRSSMiB = median(rrPct), median(rrRSS)
	clients := max(median(rrSessions), 1)
	res.RRIdleUsPerClientPerS = 1e6 * res.RRIdlePct / 100 / clients
	res.RRKiBPerClient = 1024 * res.RRRSSMiB / clients
}

// etcdLoad fills etcd's and the proxy's figures.
func (r *simRun) etcdLoad(res *SimResult, restA, churn, restB window) {
	res.EtcdIdlePct = 100 * (restA.rate("etcd") + restB.rate("etcd")) / 2
	res.EtcdChurnPct = 100 * churn.rate("etcd")
	res.EtcdRSSMiB = churn.to["etcd"].rss
	if _, ok := churn.to["proxy"]; ok {
		res.ProxyChurnPct = 100 * churn.rate("proxy")
	}
	if _, ok := churn.to["relay"]; ok {
		res.RelayChurnPct = 100 * churn.rate("relay")
	}
}

// loadAverage1m is the first field of /proc/loadavg.
func loadAverage1m() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("/proc/loadavg: empty")
	}
	return strconv.ParseFloat(f[0], 64)
}

// churn replaces endpoints of random simulated nodes (a DEL and an ADD,
// two events) at o.ChurnRate until o.ChurnEvents events were started (or
// o.ChurnWindow passed: a bound, for a host too slow for the count), then
// waits until every client agent's view has reached the last endpoint
// write (it observed every event; waitObserved) and 2 s more for the
// owners' reactions. It returns how many events completed. A fixed count
// rather than a fixed window: at 1,000 nodes a 20 s window got 132-382 of
// its 400 events through etcd, too few to tell from the rest's variation.
// The watches stay open meanwhile: its window includes etcd's watcher count.
func (r *simRun) churn(ctx context.Context) (int, error) {
	var (
		done atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, 8)
	)
	tick := time.NewTicker(time.Duration(float64(time.Second) * 2 / r.o.ChurnRate))
	end := time.After(r.o.ChurnWindow)
loop:
	for k := 0; 2*k < r.o.ChurnEvents; k++ {
		select {
		case <-ctx.Done():
			break loop
		case <-end:
			r.l.Progress("churn: %s passed after %d of %d events", r.o.ChurnWindow, 2*k, r.o.ChurnEvents)
			break loop
		case <-tick.C:
		}
		n := r.nodes[rand.IntN(len(r.nodes))]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := n.deleteOldest(ctx)
			if err == nil {
				_, _, err = n.addEndpoint(ctx, simLabels(k))
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			done.Add(2)
		})
	}
	tick.Stop()
	wg.Wait()
	// A few failed operations (etcd's own request timeout on a loaded
	// host at 1,000 nodes) are reported, not fatal: the events that
	// completed are what the CPU is divided by.
	r.churnFailures = len(errs)
	if n := int(done.Load()); len(errs) > 0 && (n == 0 || len(errs) > n/2) {
		return 0, fmt.Errorf("churn: %d failures, first: %w", len(errs), errs[0])
	} else if len(errs) > 0 {
		r.l.Progress("churn: %d of %d operations failed, first: %v", len(errs), len(errs)+n/2, errs[0])
	}
	if err := r.waitObserved(ctx, r.lastEndpointRev()); err != nil {
		return 0, err
	}
	sleepCtx(ctx, 2*time.Second)
	return int(done.Load()), ctx.Err()
}

// lastEndpointRev is the revision of the latest endpoint a simulated node
// wrote.
func (r *simRun) lastEndpointRev() int64 {
	var rev int64
	for _, n := range r.nodes {
		n.mu.Lock()
		rev = max(rev, n.lastRev)
		n.mu.Unlock()
	}
	return rev
}

// observeTimeout bounds waitObserved.
const observeTimeout = 2 * time.Minute

// waitObserved waits until every client agent's view has reached revision
// rev (its tabby_view_revision metric).
func (r *simRun) waitObserved(ctx context.Context, rev int64) error {
	ctx, cancel := context.WithTimeout(ctx, observeTimeout)
	defer cancel()
	for _, c := range r.clients {
		var have float64
		err := Poll(ctx, 100*time.Millisecond, func() (bool, error) {
			code, body, err := r.l.AgentGet(ctx, c, "/metrics")
			if err != nil || code != http.StatusOK {
				return false, nil
			}
			g, err := parseGauges(bytes.NewReader(body), "tabby_view_revision")
			have = g["tabby_view_revision"]
			return err == nil && have >= float64(rev), nil
		})
		if err != nil {
			return fmt.Errorf("the view of %s reached revision %.0f, not the churn's last %d, in %s: %w", c, have, rev, observeTimeout, err)
		}
	}
	return nil
}

// measurePolicy times one-label changes of a simulated endpoint that the
// sim-target policy's rule selects (role=probe) until every client
// node's nftables set has, then has lost, its address: each change as
// soon as the one before is in every set and, with a relay, again each
// more than its window after the one before (alone, as an operator's
// change usually is: the relay sends it at once).
func (r *simRun) measurePolicy(ctx context.Context, res *SimResult) error {
	r.l.Progress("timing %d policy changes (one label) at %d endpoints, %d policies", 2*r.o.Samples, res.Endpoints, r.o.Policies)
	lat, err := r.policyChanges(ctx, 0)
	if err != nil {
		return err
	}
	res.PolicyP50Ms, res.PolicyP99Ms = quantileMs(lat)
	if !r.o.Relay {
		return nil
	}
	res.RelayWindowMs = float64(r.relayWindow()) / float64(time.Millisecond)
	r.l.Progress("timing %d policy changes again, each %s after the last (the relay's window)", 2*r.o.Samples, r.relayWindow())
	if lat, err = r.policyChanges(ctx, r.relayWindow()+100*time.Millisecond); err != nil {
		return err
	}
	res.PolicyLoneP50Ms, res.PolicyLoneP99Ms = quantileMs(lat)
	return nil
}

// relayWindow is the relay's batching window in this run.
func (r *simRun) relayWindow() time.Duration {
	if r.o.RelayWindow > 0 {
		return r.o.RelayWindow
	}
	return relay.DefaultWindow
}

// policyChanges makes 2×Samples label changes (measurePolicy), each apart
// after the one before reached every set, and times each until every
// client's set has it.
func (r *simRun) policyChanges(ctx context.Context, apart time.Duration) ([]time.Duration, error) {
	var lat []time.Duration
	for k := range r.o.Samples {
		n := r.nodes[(k*7919)%len(r.nodes)]
		for _, step := range []struct{ value, verb string }{{"probe", "add"}, {"r-0", "delete"}} {
			n.mu.Lock()
			addr := n.eps[0].addr
			n.mu.Unlock()
			tok := step.verb + ":" + addr.String()
			for _, m := range r.sets {
				m.forget(tok)
			}
			if apart > 0 {
				select {
				case <-time.After(apart):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			t0 := time.Now()
			if _, err := n.relabel(ctx, "role", step.value); err != nil {
				return nil, err
			}
			wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			_, t1, err := waitAll(wctx, r.sets, tok)
			cancel()
			if err != nil {
				return nil, err
			}
			lat = append(lat, t1.Sub(t0))
		}
	}
	return lat, nil
}

// measureRestart restarts the first client agent (SIGTERM) and times its
// start until /readyz answers 200; also reads etcd's watcher count.
func (r *simRun) measureRestart(ctx context.Context, res *SimResult) error {
	node := r.clients[0]
	if err := r.l.StopAgent(ctx, node, syscall.SIGTERM); err != nil {
		return err
	}
	t0 := time.Now()
	if err := r.l.StartAgent(ctx, node); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err := Poll(wctx, 50*time.Millisecond, func() (bool, error) {
		code, _, err := r.l.AgentGet(wctx, node, "/readyz")
		return err == nil && code == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("agent of %s not ready after restart: %w", node, err)
	}
	res.ReadyS = time.Since(t0).Seconds()
	return nil
}

// EtcdGauges reads gauges (or counters) from the metrics endpoint of
// etcd's first member (on its client URL, reached from inside the etcd
// namespace).
func (l *Lab) EtcdGauges(ctx context.Context, names ...string) (map[string]float64, error) {
	st := l.State()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return DialIn(ctx, st.EtcdNS(), network, addr)
	}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, st.Etcd[0].ClientURL()+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("etcd metrics: %w", err)
	}
	defer resp.Body.Close()
	return parseGauges(resp.Body, names...)
}

// parseGauges reads the unlabelled samples of the named metrics from a
// Prometheus text exposition.
func parseGauges(r io.Reader, names ...string) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && slices.Contains(names, f[0]) {
			out[f[0]], _ = strconv.ParseFloat(f[1], 64)
		}
	}
	return out, sc.Err()
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// quantileMs returns the p50 and p99 (nearest rank) in milliseconds.
func quantileMs(d []time.Duration) (p50, p99 float64) {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return ms(stats.Quantile(d, 0.5)), ms(stats.Quantile(d, 0.99))
}
