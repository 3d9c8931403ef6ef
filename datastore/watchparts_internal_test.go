package datastore

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestWatchParts(t *testing.T) {
	s := &Store{base: "/t/"}
	for _, tc := range []struct {
		name string
		spec WatchSpec
		want []absRange
	}{
		{"middle", WatchSpec{End: "status/", Skip: []KeyRange{{"ipam/blocks/", "resources/"}}},
			[]absRange{{"/t/", "/t/ipam/blocks/"}, {"/t/resources/", "/t/status/"}}},
		{"two, unsorted", WatchSpec{Prefix: "a/", Skip: []KeyRange{{"a/m", "a/n"}, {"a/c", "a/d"}}},
			[]absRange{{"/t/a/", "/t/a/c"}, {"/t/a/d", "/t/a/m"}, {"/t/a/n", "/t/a0"}}},
		{"at the start", WatchSpec{Prefix: "a/", Skip: []KeyRange{{"a/", "a/x"}}},
			[]absRange{{"/t/a/x", "/t/a0"}}},
		{"past the end", WatchSpec{End: "m", Skip: []KeyRange{{"k", "z"}}},
			[]absRange{{"/t/", "/t/k"}}},
		{"overlapping", WatchSpec{End: "z", Skip: []KeyRange{{"b", "d"}, {"c", "e"}}},
			[]absRange{{"/t/", "/t/b"}, {"/t/e", "/t/z"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, s.watchParts(tc.spec), cmp.AllowUnexported(absRange{})); diff != "" {
				t.Errorf("watchParts (-want +got):\n%s", diff)
			}
		})
	}
}

// Without progress reports (etcd's gRPC proxy) a watch with Skip is one
// watch of the whole range whose Keep drops the skipped keys and what the
// spec's own Keep refuses.
func TestWithoutSkip(t *testing.T) {
	spec := withoutSkip(WatchSpec{End: "status/", Skip: []KeyRange{{From: "ipam/blocks/", To: "resources/"}},
		Keep: func(key []byte) bool { return string(key) != "resources/secret" }})
	if spec.Skip != nil {
		t.Fatalf("Skip %v, want none", spec.Skip)
	}
	for key, want := range map[string]bool{
		"config/bgp-mesh-key":                true,
		"ipam/block-summaries/10.244.0.0-26": true,
		"ipam/blocks/10.244.0.0-26":          false,
		"ipam/handles/x":                     false,
		"kube/pods/x":                        false,
		"resources/secret":                   false,
		"resources/workloadendpoints/x":      true,
	} {
		if got := spec.Keep([]byte(key)); got != want {
			t.Errorf("Keep(%q) = %v, want %v", key, got, want)
		}
	}
}

// A lagging watch asks for progress once its stream is quiet for
// progressEvery, and under a steady stream of writes no later than
// progressMaxLag after the lag began.
func TestNudgeDelay(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name string
		now  time.Duration // since the lag began
		want time.Duration
	}{
		{"lag begins", 0, progressEvery},
		{"writes keep coming", time.Second, progressEvery},
		{"near the bound", progressMaxLag - 50*time.Millisecond, 50 * time.Millisecond},
		{"past the bound", progressMaxLag + time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := nudgeAfter(progressEvery, progressMaxLag, t0, t0.Add(tc.now)); got != tc.want {
				t.Errorf("nudgeAfter after %v = %v, want %v", tc.now, got, tc.want)
			}
		})
	}
}

// The nudger asks as nudgeAfter says although its timer is not reset per
// response: under a steady stream progressMaxLag after the lag began, on a
// quiet stream progressEvery after the last response, not at all once the
// parts are in step again.
func TestNudger(t *testing.T) {
	for _, tc := range []struct {
		name string
		// responses every 50 ms (or every) for this long, lagging, then
		// (inStep) one in step
		steady time.Duration
		inStep bool
		want   []time.Duration // sends, since the first response
		every  time.Duration
		quiet  time.Duration // progressEvery unless set
		maxLag time.Duration // progressMaxLag unless set
	}{
		{"quiet", 0, false, []time.Duration{progressEvery}, 0, 0, 0},
		{"quiet after a while", time.Second, false, []time.Duration{time.Second + progressEvery}, 0, 0, 0},
		{"steady", 3 * time.Second, false, []time.Duration{progressMaxLag, 3*time.Second + progressEvery}, 0, 0, 0},
		{"in step again", time.Second, true, nil, 0, 0, 0},
		// A relay's batches every 250 ms: asking 200 ms after each
		// (13 times in 3 s) would make the relay send every 200 ms
		// instead.
		{"relay batches", 3 * time.Second, false, everyFrom(200*time.Millisecond, 250*time.Millisecond, 13), 250 * time.Millisecond, 0, 0},
		// Relayed: under 12 s of batches (the relay's default window, 1 s)
		// once at the relayed bound, then once quiet; never in a gap
		// between batches.
		{"relay batches, relayed", 12 * time.Second, false, []time.Duration{progressMaxLagRelayed, 12*time.Second + progressEveryRelayed}, time.Second, progressEveryRelayed, progressMaxLagRelayed},
	} {
		if tc.every == 0 {
			tc.every = 50 * time.Millisecond
		}
		if tc.quiet == 0 {
			tc.quiet = progressEvery
		}
		if tc.maxLag == 0 {
			tc.maxLag = progressMaxLag
		}
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				t0 := time.Now()
				var sent []time.Duration
				var n *nudger
				n = newNudger(tc.quiet, tc.maxLag, func() {
					sent = append(sent, time.Since(t0))
					n.seen(time.Now(), false) // the progress report
				})
				defer n.stop()
				for time.Since(t0) <= tc.steady {
					n.seen(time.Now(), true)
					time.Sleep(tc.every)
					synctest.Wait()
				}
				if tc.inStep {
					n.seen(time.Now(), false)
				}
				time.Sleep(5 * time.Second)
				synctest.Wait()
				if !slices.Equal(sent, tc.want) {
					t.Errorf("progress asked at %v, want %v", sent, tc.want)
				}
			})
		})
	}
}

// A stopped nudger sends nothing, whether it was armed before the stop or
// told of a lag only after it (a response the receiver handled as the
// watch ended).
func TestNudgerStopped(t *testing.T) {
	for _, armed := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			sends := 0
			n := newNudger(progressEvery, progressMaxLag, func() { sends++ })
			if armed {
				n.seen(time.Now(), true)
			}
			n.stop()
			n.seen(time.Now(), true)
			time.Sleep(2 * progressMaxLag)
			synctest.Wait()
			if sends != 0 {
				t.Errorf("armed before the stop %v: a stopped nudger asked for progress %d times", armed, sends)
			}
		})
	}
}

// everyFrom is n durations from first on, every apart.
func everyFrom(first, every time.Duration, n int) []time.Duration {
	var d []time.Duration
	for i := range n {
		d = append(d, first+time.Duration(i)*every)
	}
	return d
}
