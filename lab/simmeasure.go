package lab

import (
	"bufio"
	"context"
	"fmt"
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

	"github.com/tabbynet/tabby/internal/stats"
)

// step grows the lab to size simulated nodes and measures.
func (r *simRun) step(ctx context.Context, size int) (SimResult, error) {
	res := SimResult{Nodes: size, Endpoints: size * r.o.EndpointsPerNode, Policies: r.o.Policies, EtcdProxy: r.o.EtcdProxy}
	lat, err := r.grow(ctx, size)
	if err != nil {
		return res, err
	}
	res.RouteP50Ms, res.RouteP99Ms = quantileMs(lat.total)
	res.AdvertP50Ms, res.AdvertP99Ms = quantileMs(lat.fromAdvert)
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
	if err := r.measurePolicy(ctx, &res); err != nil {
		return res, err
	}
	return res, r.measureRestart(ctx, &res)
}

type usage struct{ cpu, rss float64 }

// snapshot reads the real agents', etcd's and the proxy's usage.
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
		out[key] = usage{c, m}
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
	return out, add("proxy", st.EtcdProxy)
}

// settleTimeout bounds waitSettled.
const settleTimeout = 5 * time.Minute

// waitSettled waits until every real client's kernel holds a route to every
// block the simulated nodes advertise.
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
	return nil
}

// measureLoad measures rest, then churn. The rest starts once the cluster
// has settled (waitSettled): measured straight after the fill, it held the
// agents and reflectors still taking in a thousand new routes.
func (r *simRun) measureLoad(ctx context.Context, res *SimResult) error {
	if err := r.waitSettled(ctx); err != nil {
		return err
	}
	r.l.Progress("measuring %s at rest", r.o.IdleWindow)
	s0, err := r.snapshot()
	if err != nil {
		return err
	}
	t0 := time.Now()
	sleepCtx(ctx, r.o.IdleWindow)
	s1, err := r.snapshot()
	if err != nil {
		return err
	}
	idle := time.Since(t0).Seconds()
	r.l.Progress("measuring %s of churn at %g pod events/s", r.o.ChurnWindow, r.o.ChurnRate)
	t2 := time.Now()
	events, err := r.churn(ctx)
	if err != nil {
		return err
	}
	s3, err := r.snapshot()
	if err != nil {
		return err
	}
	busy := time.Since(t2).Seconds()
	res.Events, res.ChurnFailures = events, r.churnFailures
	var perEvent, idlePct, rss []float64
	for _, c := range r.clients {
		rate := (s1[c].cpu - s0[c].cpu) / idle
		idlePct = append(idlePct, 100*rate)
		perEvent = append(perEvent, 1e6*max(s3[c].cpu-s1[c].cpu-rate*busy, 0)/float64(max(events, 1)))
		rss = append(rss, s3[c].rss)
	}
	res.AgentUsPerEvent, res.AgentIdlePct, res.AgentRSSMiB = median(perEvent), median(idlePct), median(rss)
	clients := float64(len(r.nodes) + len(r.clients) + len(r.rrs) - 1)
	var rrPct, rrRSS []float64
	for _, c := range r.rrs {
		rrPct = append(rrPct, 100*(s1[c].cpu-s0[c].cpu)/idle)
		rrRSS = append(rrRSS, s3[c].rss)
	}
	res.RRIdlePct, res.RRRSSMiB = median(rrPct), median(rrRSS)
	res.RRIdleUsPerClientPerS = 1e6 * res.RRIdlePct / 100 / clients
	res.RRKiBPerClient = 1024 * res.RRRSSMiB / clients
	res.EtcdIdlePct = 100 * (s1["etcd"].cpu - s0["etcd"].cpu) / idle
	res.EtcdChurnPct = 100 * (s3["etcd"].cpu - s1["etcd"].cpu) / busy
	res.EtcdRSSMiB = s3["etcd"].rss
	if p, ok := s3["proxy"]; ok {
		res.ProxyChurnPct = 100 * (p.cpu - s1["proxy"].cpu) / busy
	}
	g, err := r.l.EtcdGauges(ctx, "etcd_debugging_mvcc_watcher_total", "etcd_debugging_mvcc_watch_stream_total")
	if err != nil {
		return err
	}
	res.EtcdWatchers, res.EtcdWatchStreams = int(g["etcd_debugging_mvcc_watcher_total"]), int(g["etcd_debugging_mvcc_watch_stream_total"])
	res.Load, err = loadAverage1m()
	return err
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
// two events) at o.ChurnRate for o.ChurnWindow, plus the time the
// reactions need (2 s), and returns how many events completed. The watches
// stay open meanwhile: its window includes etcd's watcher count.
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
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			break loop
		case <-end:
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
	sleepCtx(ctx, 2*time.Second)
	// A few failed operations (etcd's own request timeout on a loaded
	// host at 1,000 nodes) are reported, not fatal: the events that
	// completed are what the CPU is divided by.
	r.churnFailures = len(errs)
	if n := int(done.Load()); len(errs) > 0 && (n == 0 || len(errs) > n/2) {
		return 0, fmt.Errorf("churn: %d failures, first: %w", len(errs), errs[0])
	} else if len(errs) > 0 {
		r.l.Progress("churn: %d of %d operations failed, first: %v", len(errs), len(errs)+n/2, errs[0])
	}
	return int(done.Load()), ctx.Err()
}

// measurePolicy times one-label changes of a simulated endpoint that the
// sim-target policy's rule selects (role=probe) until every client
// node's nftables set has, then has lost, its address.
func (r *simRun) measurePolicy(ctx context.Context, res *SimResult) error {
	r.l.Progress("timing %d policy changes (one label) at %d endpoints, %d policies", 2*r.o.Samples, res.Endpoints, r.o.Policies)
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
			t0 := time.Now()
			if _, err := n.relabel(ctx, "role", step.value); err != nil {
				return err
			}
			wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			_, t1, err := waitAll(wctx, r.sets, tok)
			cancel()
			if err != nil {
				return err
			}
			lat = append(lat, t1.Sub(t0))
		}
	}
	res.PolicyP50Ms, res.PolicyP99Ms = quantileMs(lat)
	return nil
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
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
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
