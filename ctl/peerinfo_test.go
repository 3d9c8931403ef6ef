package ctl

import "testing"

func TestPeerInfoText(t *testing.T) {
	for _, tc := range []struct {
		state, info, want string
	}{
		{"Established", "", ""},
		{"Established", "hold timer expired: hold-timer-expired", ""},
		{"Active", "", "waiting for peer to connect"},
		{"Connect", "", "waiting for peer to connect"},
		{"Idle", "", "not connecting yet (idle)"},
		{"OpenSent", "", "connected, waiting for the peer's OPEN"},
		{"OpenConfirm", "", "connected, waiting for the peer's first keepalive"},
		{"Active", "hold timer expired: hold-timer-expired", "hold timer expired: no keepalive from the peer"},
		{"Active", "notification received: notification-received code 6(cease) subcode 2(administrative shutdown)", "peer sent Cease/administrative shutdown"},
		{"Idle", "notification received: notification-received code 6(cease) subcode 4(administrative reset)", "peer sent Cease/administrative reset"},
		{"Idle", "notification sent: notification-sent code 2(open) subcode 2(bad peer as)", "this node sent OPEN error/bad peer AS to the peer"},
		{"Idle", "notification sent: notification-sent code 4(hold timer expired) subcode 0(undefined)", "this node sent hold timer expired to the peer"},
		{"Idle", "notification received: notification-received code 9(undefined) subcode 3(undefined)", "peer sent error code 9/subcode 3"},
		{"Idle", "notification received: garbled", "peer sent a notification"},
		{"Active", "read failed: read-failed", "connection lost (read failed)"},
		{"Active", "write failed: write-failed", "connection lost (write failed)"},
		{"Idle", "admin down: admin-down", "session shut down on this node"},
		{"Active", "graceful restart: graceful-restart", "peer restarting (graceful restart), its routes kept"},
		{"Idle", "bad peer as: bad-peer-as", "peer's AS number differs from the configured one"},
		{"Active", "connection refused", "connection refused"},
	} {
		if got := PeerInfoText(tc.state, tc.info); got != tc.want {
			t.Errorf("PeerInfoText(%q, %q) = %q, want %q", tc.state, tc.info, got, tc.want)
		}
	}
}
