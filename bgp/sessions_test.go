package bgp

import (
	"net/netip"
	"testing"
	"time"

	gobgpapi "github.com/osrg/gobgp/v4/api"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/tabbynet/tabby/bgp/session"
)

// TestSessionStates: both of GoBGP's spellings of a state translate to the
// same one of ours; Idle and anything unknown are Idle.
func TestSessionStates(t *testing.T) {
	tests := []struct {
		fsm  gobgp.FSMState
		api  gobgpapi.PeerState_SessionState
		want session.State
	}{
		{gobgp.BGP_FSM_IDLE, gobgpapi.PeerState_SESSION_STATE_IDLE, session.Idle},
		{gobgp.BGP_FSM_CONNECT, gobgpapi.PeerState_SESSION_STATE_CONNECT, session.Connect},
		{gobgp.BGP_FSM_ACTIVE, gobgpapi.PeerState_SESSION_STATE_ACTIVE, session.Active},
		{gobgp.BGP_FSM_OPENSENT, gobgpapi.PeerState_SESSION_STATE_OPENSENT, session.OpenSent},
		{gobgp.BGP_FSM_OPENCONFIRM, gobgpapi.PeerState_SESSION_STATE_OPENCONFIRM, session.OpenConfirm},
		{gobgp.BGP_FSM_ESTABLISHED, gobgpapi.PeerState_SESSION_STATE_ESTABLISHED, session.Established},
		{gobgp.FSMState(99), gobgpapi.PeerState_SESSION_STATE_UNSPECIFIED, session.Idle},
	}
	for _, tt := range tests {
		if got := fsmState(tt.fsm); got != tt.want {
			t.Errorf("fsmState(%v) = %v, want %v", tt.fsm, got, tt.want)
		}
		if got := apiState(tt.api); got != tt.want {
			t.Errorf("apiState(%v) = %v, want %v", tt.api, got, tt.want)
		}
	}
}

// A peer's End-of-RIB counts for the session it came on: once that session
// leaves Established, the next one must send its own.
func TestSessionTrackerEORPerSession(t *testing.T) {
	a := netip.MustParseAddr("198.18.0.14")
	tr := newSessionTracker()
	t0 := time.Now()
	tr.observe(a, session.Established, t0, "")
	tr.sawEOR(a)
	tr.observe(a, session.Established, t0, "") // a repeated event keeps it
	if !tr.eor[a] {
		t.Fatal("End-of-RIB lost while the session stayed Established")
	}
	tr.observe(a, session.Idle, t0.Add(time.Second), "graceful restart")
	tr.observe(a, session.Established, t0.Add(2*time.Second), "")
	if tr.eor[a] {
		t.Error("the End-of-RIB of the session before still counts")
	}
}
