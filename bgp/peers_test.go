package bgp

import (
	"testing"
	"time"
)

// Sessions between a reflector and its clients default to a 90 s hold
// time (DefaultReflectorHold); the others keep 9 s; a set value wins.
func TestSessionTimers(t *testing.T) {
	for _, tc := range []struct {
		name            string
		peer            Peer
		hold, keepalive time.Duration
	}{
		{"mesh", Peer{Type: PeerMesh}, 9 * time.Second, 3 * time.Second},
		{"node-to-node BGPPeer", Peer{Type: PeerNode}, 9 * time.Second, 3 * time.Second},
		{"external router", Peer{Type: PeerGlobal}, 9 * time.Second, 3 * time.Second},
		{"client towards its reflector", Peer{Type: PeerRR}, 90 * time.Second, 30 * time.Second},
		{"reflector towards its client", Peer{Type: PeerRRClient, RRClient: true}, 90 * time.Second, 30 * time.Second},
		{"reflector session with a hold time set", Peer{Type: PeerRRClient, Hold: 15 * time.Second}, 15 * time.Second, 5 * time.Second},
		{"reflector session with both set", Peer{Type: PeerRR, Hold: 20 * time.Second, Keepalive: 2 * time.Second}, 20 * time.Second, 2 * time.Second},
		{"mesh with a long hold time", Peer{Type: PeerMesh, Hold: 240 * time.Second}, 240 * time.Second, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hold, keepalive := timers(tc.peer)
			if hold != tc.hold || keepalive != tc.keepalive {
				t.Errorf("timers = hold %v, keepalive %v; want %v, %v", hold, keepalive, tc.hold, tc.keepalive)
			}
		})
	}
}
