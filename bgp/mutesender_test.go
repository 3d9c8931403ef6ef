package bgp

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tabbynet/tabby/internal/testkit"
)

func TestSenderStopped(t *testing.T) {
	up := time.Date(2026, 12, 6, 17, 0, 0, 0, time.UTC)
	s := func(isUp bool, since time.Time, sent uint64) senderSample {
		return senderSample{up: isUp, since: since, sent: sent, keepalive: 30 * time.Second}
	}
	tests := []struct {
		name          string
		before, after senderSample
		want          bool
	}{
		{"nothing sent by the same session", s(true, up, 40), s(true, up, 40), true},
		{"a keepalive sent", s(true, up, 40), s(true, up, 41), false},
		{"a new session since", s(true, up, 40), s(true, up.Add(time.Minute), 40), false},
		{"down at the second look", s(true, up, 40), s(false, time.Time{}, 40), false},
		{"down at the first look", s(false, time.Time{}, 40), s(true, up, 40), false},
		{"no keepalives negotiated", senderSample{up: true, since: up, sent: 3}, senderSample{up: true, since: up, sent: 3}, false},
	}
	for _, tt := range tests {
		if got := senderStopped(tt.before, tt.after); got != tt.want {
			t.Errorf("%s: senderStopped = %v, want %v", tt.name, got, tt.want)
		}
	}
	if w := senderWindow(30 * time.Second); w != time.Minute {
		t.Errorf("senderWindow(30s) = %v, want 1m", w)
	}
	if w := senderWindow(3 * time.Second); w != 8*time.Second {
		t.Errorf("senderWindow(3s) = %v, want 8s", w)
	}
}

// TestLiveSenderNotRecreated: the sender check reads a live session's
// sent messages growing and leaves it alone (no false alarm re-creating
// healthy sessions): a simulated node's session with a real speaker, 3 s
// keepalives, stays up past the check.
func TestLiveSenderNotRecreated(t *testing.T) {
	simAddr := netip.MustParseAddr("127.77.93.2")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n, _, runErr := simSessionUp(ctx, t, netip.MustParseAddr("127.77.93.1"), simAddr, Peer{Type: PeerRRClient, RRClient: true})
	var first senderSample
	testkit.Eventually(t, 20*time.Second, "the speaker's side established", testkit.Cond(func() bool {
		var ok bool
		first, ok = n.sp.sampleSender(simAddr)
		return ok && first.up
	}))
	if first.keepalive != 3*time.Second {
		t.Fatalf("sampleSender = %+v; want 3s keepalives", first)
	}
	testkit.Eventually(t, 20*time.Second, "the speaker's sent count grows", testkit.Cond(func() bool {
		now, ok := n.sp.sampleSender(simAddr)
		return ok && now.sent > first.sent
	}))
	// Once the check has taken its second look (senderSlack +
	// senderWindow(3s) = 13 s after the session came up, later on a loaded
	// host) the same session is up.
	testkit.Eventually(t, 60*time.Second, "the sender check's second look", testkit.Cond(func() bool {
		return n.sp.senders.compared.Load() > 0
	}))
	select {
	case err := <-runErr:
		t.Fatalf("session ended: %v", err)
	default:
	}
	if now, ok := n.sp.sampleSender(simAddr); !ok || !now.up || !now.since.Equal(first.since) {
		t.Errorf("after the check: %+v, %v; want the same session up since %v", now, ok, first.since)
	}
}

// The sender checks of sessions that come up close together share their
// looks: a hundred sessions up within 4 s are looked at in one sweep, and
// their second looks in one more, each with its own first sample; a
// session that came up again after its first look starts over. Sweeps
// never overlap and start at least senderSweepEvery apart, also when a
// listing takes longer than that and sessions keep coming up meanwhile.
func TestSenderChecksBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c senderChecks
		type sweepRec struct {
			at     time.Time
			first  int
			second map[netip.Addr]secondLook
		}
		var (
			mu            sync.Mutex
			sweeps        []sweepRec
			running, most int
			listing       = time.Duration(0)
			sample        = map[netip.Addr]uint64{} // the sent count the next look reads
			sweep         func()
		)
		sweep = func() {
			start := time.Now()
			first, second := c.take(start)
			mu.Lock()
			running++
			most = max(most, running)
			wait := listing
			mu.Unlock()
			time.Sleep(wait) // the listing
			mu.Lock()
			looked := map[netip.Addr]secondLook{}
			for a, gen := range first {
				looked[a] = secondLook{before: senderSample{up: true, keepalive: 30 * time.Second, sent: sample[a]}, gen: gen}
			}
			running--
			sweeps = append(sweeps, sweepRec{at: start, first: len(first), second: second})
			mu.Unlock()
			c.done(time.Now(), looked, sweep)
		}
		addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, 4, byte(i)}) }
		up := func(i int, sent uint64) {
			mu.Lock()
			sample[addr(i)] = sent
			mu.Unlock()
			c.firstLook(addr(i), time.Now().Add(senderSlack), sweep)
		}
		for i := 1; i <= 100; i++ {
			up(i, uint64(i))
			time.Sleep(40 * time.Millisecond)
		}
		time.Sleep(senderSlack + time.Second)
		synctest.Wait()
		mu.Lock()
		if len(sweeps) != 1 || sweeps[0].first != 100 {
			t.Fatalf("after the first looks: sweeps %+v, want one of 100 first looks", sweeps)
		}
		mu.Unlock()
		// A session whose event came late (its look already due) right
		// after a sweep still waits for the sweeps' spacing.
		up(150, 150)
		time.Sleep(senderSlack + 100*time.Millisecond)
		synctest.Wait()
		mu.Lock()
		sample[addr(200)] = 200
		mu.Unlock()
		c.firstLook(addr(200), time.Now().Add(-10*time.Second), sweep)
		// Session 7 comes up again before its second look, and its new
		// session reads another count.
		up(7, 1007)
		time.Sleep(senderWindow(30*time.Second) + senderSweepEvery + time.Second)
		synctest.Wait()
		mu.Lock()
		firsts, seconds := 0, map[netip.Addr]uint64{}
		for _, s := range sweeps[1:] {
			firsts += s.first
			for a, l := range s.second {
				seconds[a] = l.before.sent
			}
		}
		if firsts != 3 || len(seconds) != 102 || seconds[addr(7)] != 1007 || seconds[addr(8)] != 8 || seconds[addr(200)] != 200 {
			t.Errorf("later sweeps %+v: want the first looks of sessions 150 and 200 and of 7's new session, and 102 second looks with their own samples (7: 1007, 8: 8, 200: 200)", sweeps[1:])
		}
		n := len(sweeps)
		// Slow listings (8 s) while sessions keep coming up every second.
		listing = 8 * time.Second
		mu.Unlock()
		for i := 101; i <= 130; i++ {
			up(i, uint64(i))
			time.Sleep(time.Second)
		}
		time.Sleep(senderWindow(30*time.Second) + 3*(listing+senderSweepEvery))
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if most != 1 {
			t.Errorf("%d sweeps ran at once, want 1", most)
		}
		for i := 1; i < len(sweeps); i++ {
			if gap := sweeps[i].at.Sub(sweeps[i-1].at); gap < senderSweepEvery {
				t.Errorf("sweeps %d and %d began %v apart, want at least %v", i-1, i, gap, senderSweepEvery)
			}
		}
		seen := 0
		for _, s := range sweeps[n:] {
			seen += len(s.second)
		}
		if seen != 30 {
			t.Errorf("%d second looks of the 30 sessions up during slow listings, want 30", seen)
		}
	})
}

// sampleSender reads a's session from GoBGP's peer listing (one peer).
func (s *speaker) sampleSender(a netip.Addr) (senderSample, bool) {
	m, ok := s.listSenders(a)
	out, found := m[a]
	return out, ok && found
}
