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
	// Past the check (senderSlack + senderWindow(3s) = 13 s) the same
	// session is up.
	select {
	case err := <-runErr:
		t.Fatalf("session ended: %v", err)
	case <-time.After(senderSlack + senderWindow(3*time.Second) + 3*time.Second):
	}
	if now, ok := n.sp.sampleSender(simAddr); !ok || !now.up || !now.since.Equal(first.since) {
		t.Errorf("after the check: %+v, %v; want the same session up since %v", now, ok, first.since)
	}
	if n.sp.senders.compared.Load() == 0 {
		t.Error("the sender check took no second look")
	}
}

// The sender checks of sessions that come up close together share their
// looks: a hundred sessions up within 4 s are looked at in one sweep, their
// second looks in one more, each with its first sample; a session that
// came up again after its first look starts over.
func TestSenderChecksBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c senderChecks
		type sweepRec struct {
			first  int
			second map[netip.Addr]senderSample
		}
		var (
			mu     sync.Mutex
			sweeps []sweepRec
			sweep  func()
		)
		sweep = func() {
			mu.Lock()
			defer mu.Unlock()
			start := time.Now()
			first, second := c.take(start)
			looked := map[netip.Addr]senderSample{}
			for _, a := range first {
				looked[a] = senderSample{up: true, keepalive: 30 * time.Second, sent: uint64(a.As4()[3])}
			}
			c.done(start, looked, sweep)
			sweeps = append(sweeps, sweepRec{first: len(first), second: second})
		}
		addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, 4, byte(i)}) }
		for i := 1; i <= 100; i++ {
			c.firstLook(addr(i), time.Now().Add(senderSlack), sweep)
			time.Sleep(40 * time.Millisecond)
		}
		time.Sleep(senderSlack + time.Second)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(sweeps) != 1 || sweeps[0].first != 100 {
			t.Fatalf("after the first looks: sweeps %+v, want one of 100 first looks", sweeps)
		}
		// Session 7 comes up again before its second look.
		mu.Unlock()
		c.firstLook(addr(7), time.Now().Add(senderSlack), sweep)
		time.Sleep(senderWindow(30*time.Second) + senderSweepEvery + time.Second)
		synctest.Wait()
		mu.Lock()
		var firsts, seconds int
		for _, s := range sweeps[1:] {
			firsts += s.first
			seconds += len(s.second)
			for a, before := range s.second {
				if before.sent != uint64(a.As4()[3]) {
					t.Errorf("second look of %v with first sample %+v", a, before)
				}
			}
		}
		if firsts != 1 || seconds < 99 {
			t.Errorf("later sweeps %+v: want session 7's new first look and the other 99 second looks", sweeps[1:])
		}
		if len(sweeps) > 4 {
			t.Errorf("%d sweeps for 101 sessions' looks, want few", len(sweeps))
		}
	})
}
