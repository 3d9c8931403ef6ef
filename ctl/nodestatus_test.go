package ctl

import (
	"testing"

	"github.com/tabbynet/tabby/api"
)

// The session table is headed by the sessions' family, as calicoctl's:
// IPv6 for an IPv6-only node's, none when the families are mixed.
func TestSessionsHeading(t *testing.T) {
	v4, v6 := api.PeerStatus{Address: "198.18.0.12"}, api.PeerStatus{Address: "2001:db8::c"}
	for _, tt := range []struct {
		peers []api.PeerStatus
		want  string
	}{
		{[]api.PeerStatus{v4, v4}, "IPv4 BGP status\n"},
		{[]api.PeerStatus{v6, v6}, "IPv6 BGP status\n"},
		{[]api.PeerStatus{v4, v6}, "BGP status\n"},
	} {
		if got := sessionsHeading(tt.peers); got != tt.want {
			t.Errorf("sessionsHeading(%v) = %q, want %q", tt.peers, got, tt.want)
		}
	}
}
