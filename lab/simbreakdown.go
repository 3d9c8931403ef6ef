package lab

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Where a block's route spends its time (docs/scale.md, "Where block →
// route goes"): the IPAM claim; from the simulated node's advertisement,
// each reflector's GoBGP taking the path and sending it on to its clients
// (seen by the observer, one simulated client whose session parses what the
// reflectors send); each reflector's own kernel (its agent reading its
// RIB and installing the route); each client's kernel.

// reflectLog records when the observer first received each prefix from
// each reflector. Safe for concurrent use.
type reflectLog struct {
	mu   sync.Mutex
	seen map[netip.Prefix]map[netip.Addr]time.Time
	wake chan struct{}
}

func newReflectLog() *reflectLog {
	return &reflectLog{seen: map[netip.Prefix]map[netip.Addr]time.Time{}, wake: make(chan struct{})}
}

// add records prefixes announced by reflector rr now.
func (l *reflectLog) add(rr netip.Addr, prefixes []netip.Prefix) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range prefixes {
		m := l.seen[p]
		if m == nil {
			m = map[netip.Addr]time.Time{}
			l.seen[p] = m
		}
		if _, ok := m[rr]; !ok {
			m[rr] = now
		}
	}
	close(l.wake)
	l.wake = make(chan struct{})
}

// wait returns when each of rrs first sent p (zero for one that did not
// within ctx).
func (l *reflectLog) wait(ctx context.Context, p netip.Prefix, rrs []netip.Addr) []time.Time {
	for {
		l.mu.Lock()
		out, missing := make([]time.Time, len(rrs)), false
		for i, rr := range rrs {
			out[i] = l.seen[p][rr]
			missing = missing || out[i].IsZero()
		}
		wake := l.wake
		l.mu.Unlock()
		if !missing {
			return out
		}
		select {
		case <-ctx.Done():
			return out
		case <-wake:
		}
	}
}

// routeLatencies are the block → route samples of one size: the whole
// (from before the ADD that claims the block), the part from the block's
// advertisement on (BGP, the reflectors and the agents), and its stages.
type routeLatencies struct {
	total, fromAdvert []time.Duration
	// claim is the IPAM claim (start → advertisement); reflected is
	// advertisement → a reflector's UPDATE at the observer, one per
	// reflector; rrKernel and clientKernel are advertisement → a
	// reflector's and a client's kernel, one per node.
	claim, reflected, rrKernel, clientKernel []time.Duration
	// quiet is how long the reflectors took to send the fill's UPDATEs
	// before the samples, and missing the blocks the simulated nodes'
	// sessions still lacked then (waitQuiet).
	quiet   time.Duration
	missing int
}

func (l *routeLatencies) add(start, advertised, inKernel time.Time) {
	l.total = append(l.total, inKernel.Sub(start))
	if !advertised.IsZero() {
		l.fromAdvert = append(l.fromAdvert, inKernel.Sub(advertised))
	}
}

// addStages records one sample's stages: when each reflector sent the
// block (reflected, zero if the observer did not see it), and when each
// real node's kernel had it (each, the reflectors first: lab node order).
func (l *routeLatencies) addStages(start, advertised time.Time, reflected, each []time.Time, nRRs int) {
	if advertised.IsZero() {
		return
	}
	l.claim = append(l.claim, advertised.Sub(start))
	for _, t := range reflected {
		if !t.IsZero() {
			l.reflected = append(l.reflected, t.Sub(advertised))
		}
	}
	for i, t := range each {
		if i < nRRs {
			l.rrKernel = append(l.rrKernel, t.Sub(advertised))
		} else {
			l.clientKernel = append(l.clientKernel, t.Sub(advertised))
		}
	}
}

// fill sets res's latency figures.
func (l *routeLatencies) fill(res *SimResult) {
	res.RouteP50Ms, res.RouteP99Ms = quantileMs(l.total)
	res.AdvertP50Ms, res.AdvertP99Ms = quantileMs(l.fromAdvert)
	res.Stages = &RouteStages{}
	st := res.Stages
	st.ClaimP50Ms, st.ClaimMaxMs = quantileMaxMs(l.claim)
	st.ReflectedP50Ms, st.ReflectedMaxMs = quantileMaxMs(l.reflected)
	st.RRKernelP50Ms, st.RRKernelMaxMs = quantileMaxMs(l.rrKernel)
	st.ClientKernelP50Ms, st.ClientKernelMaxMs = quantileMaxMs(l.clientKernel)
	st.QuietS = l.quiet.Seconds()
	st.MissingAtSamples = l.missing
}

func quantileMaxMs(d []time.Duration) (p50, maxMs float64) {
	p50, _ = quantileMs(d)
	for _, x := range d {
		maxMs = max(maxMs, float64(x)/float64(time.Millisecond))
	}
	return p50, maxMs
}

// sample claims n's first block (its first endpoint), times it to every
// real kernel and through its stages, and fills n.
func (r *simRun) sample(ctx context.Context, n *simNode, lat *routeLatencies) error {
	t0 := time.Now()
	block, advertised, err := n.addEndpoint(ctx, simLabels(0))
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	each, t1, err := waitAll(wctx, r.routes, block.String())
	cancel()
	if err != nil {
		return fmt.Errorf("block %s of %s: %w", block, n.name, err)
	}
	wctx, cancel = context.WithTimeout(ctx, 5*time.Second)
	observer := r.nodes[0].rrs
	reflected := r.reflected.wait(wctx, block, observer)
	cancel()
	lat.add(t0, advertised, t1)
	lat.addStages(t0, advertised, reflected, each, len(r.rrs))
	r.l.Progress("block %s of %s: claimed in %s, then sent on by %s, in each real node's kernel after %s", block, n.name,
		roundMs(advertised.Sub(t0)), r.sentBy(advertised, observer, reflected), r.afterEach(advertised, each))
	return r.fill(ctx, n, 1)
}

func (r *simRun) rrAddrs() []netip.Addr {
	st := r.l.State()
	out := make([]netip.Addr, len(r.rrs))
	for i, rr := range r.rrs {
		out[i] = st.Node(rr).IP.Addr()
	}
	return out
}

// sentBy renders when each of the observer's reflectors rrs sent its
// UPDATE (at).
func (r *simRun) sentBy(start time.Time, rrs []netip.Addr, at []time.Time) string {
	var b strings.Builder
	names := r.rrNames()
	for i, t := range at {
		if i > 0 {
			b.WriteString(", ")
		}
		if t.IsZero() {
			fmt.Fprintf(&b, "%s ?", names[rrs[i]])
		} else {
			fmt.Fprintf(&b, "%s %s", names[rrs[i]], roundMs(t.Sub(start)))
		}
	}
	return b.String()
}

// afterEach renders when each real node's kernel had a route, from start.
func (r *simRun) afterEach(start time.Time, each []time.Time) string {
	var b strings.Builder
	for i, t := range each {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s", r.l.State().Nodes[i].Name, roundMs(t.Sub(start)))
	}
	return b.String()
}

func roundMs(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// quietFor is how long the reflectors must send no UPDATE to any simulated
// node for waitQuiet; quietTimeout bounds the wait.
const (
	quietFor     = 3 * time.Second
	quietTimeout = 10 * time.Minute
)

// waitQuiet waits until the reflectors have sent every simulated node what
// they had queued: every established session holds every simulated block
// but its node's own, and no UPDATE reached any simulated node for
// quietFor. At 1,000 nodes a fill queues a million UPDATEs on each
// reflector (every block to every client), which it was still writing
// when the block samples and the rest began: the samples timed a new
// block behind that queue, and the rest measured the reflectors' sending
// (15-57 % "idle"; queued UPDATEs ≈ 125 MB of a reflector's heap "at
// rest"). Silence alone is not enough: a reflector whose senders stall
// (GoBGP's, on a loaded host; docs/scale.md "Session drops") sends
// nothing for minutes with most of its table unsent. It returns how long
// it waited and the blocks the sessions still lacked; past quietTimeout it
// says so and returns (the measurements then include the sending).
func (r *simRun) waitQuiet(ctx context.Context) (time.Duration, int) {
	start := time.Now()
	st := r.quietState()
	last, since, told := st, time.Now(), time.Now()
	for (time.Since(since) < quietFor || st.missing > 0) && ctx.Err() == nil {
		if time.Since(told) >= time.Minute {
			r.l.Progress("waiting for the reflectors after %s: %s, %d UPDATEs received%s", time.Since(start).Round(time.Second), st, st.updates, r.lackingExamples(st))
			told = time.Now()
		}
		if time.Since(start) > quietTimeout {
			r.l.Progress("the reflectors still send to the simulated nodes after %s (%d UPDATEs received so far; %s): measuring anyway", quietTimeout, st.updates, st)
			return time.Since(start), st.missing
		}
		sleepCtx(ctx, 250*time.Millisecond)
		if st = r.quietState(); st.updates != last.updates {
			last, since = st, time.Now()
		}
	}
	waited := max(time.Since(start)-quietFor, 0)
	r.l.Progress("reflectors quiet after %s (%d UPDATEs received by the simulated nodes so far)", waited.Round(100*time.Millisecond), st.updates)
	return waited, st.missing
}

// lackingExamples names up to three sessions that lack blocks and which,
// for waitQuiet's progress line ("" when none lacks any).
func (r *simRun) lackingExamples(st quietState) string {
	if st.missing == 0 {
		return ""
	}
	all := r.simBlocks.list()
	var ex []string
	for _, n := range r.nodes {
		if len(ex) == 3 {
			break
		}
		ex = append(ex, n.lacking(all, 3-len(ex))...)
	}
	return "; " + strings.Join(ex, "; ")
}

// quietState is what waitQuiet watches: the UPDATEs the simulated nodes
// received, and the blocks their sessions still lack.
type quietState struct {
	updates                  uint64
	missing, sessions, outOf int
}

func (q quietState) String() string {
	return fmt.Sprintf("%d sessions of %d lack %d blocks", q.sessions, q.outOf, q.missing)
}

func (r *simRun) quietState() quietState {
	all := r.simBlocks.len()
	var q quietState
	for _, n := range r.nodes {
		q.updates += n.updates()
		p, s := n.missing(all)
		q.missing += p
		q.sessions += s
		q.outOf += n.established()
	}
	return q
}
