package bgp

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"
)

// Why a simulated session ended (SimDrop.Side and Cause).
const (
	// SimSidePeer: the peer closed the connection or sent a NOTIFICATION.
	SimSidePeer = "peer"
	// SimSideLocal: the simulated node ended it (its hold timer, a failed
	// write, a message it could not frame).
	SimSideLocal = "local"

	SimHoldExpired  = "hold timer expired" // nothing from the peer for the hold time
	SimNotification = "notification"       // the peer sent one (Code, Subcode)
	SimPeerClosed   = "closed by peer"     // EOF or reset
	SimWriteFailed  = "write failed"
	SimReadFailed   = "read failed"
	SimBadMessage   = "bad message"
)

// SimDrop is why a simulated session ended, and what it had seen: the
// harness logs and counts it (lab/sim).
type SimDrop struct {
	Side, Cause string
	// Code and Subcode of the NOTIFICATION received (Cause
	// SimNotification), e.g. 4/0 hold timer expired, 6/x cease.
	Code, Subcode uint8
	// Established is how long the session had been established when it
	// ended (zero: it never was, it ended while opening).
	Established time.Duration
	// Silent is how long the peer had sent nothing when it ended (zero:
	// nothing ever came).
	Silent time.Duration
	// SinceEstablished counts the peer's messages after the KEEPALIVE
	// that established the session; Keepalives and Updates all it sent.
	SinceEstablished, Keepalives, Updates uint64
	Err                                   error
}

func (d *SimDrop) Error() string {
	what := d.Cause
	if d.Cause == SimNotification {
		what = fmt.Sprintf("notification %d/%d (%s)", d.Code, d.Subcode, notificationName(d.Code, d.Subcode))
	}
	up := "never established"
	if d.Established > 0 {
		up = fmt.Sprintf("established %s, %d messages from the peer since", d.Established.Round(100*time.Millisecond), d.SinceEstablished)
	}
	silent := "nothing received"
	if d.Silent > 0 || d.Keepalives+d.Updates > 0 {
		silent = fmt.Sprintf("last message from the peer %s before", d.Silent.Round(100*time.Millisecond))
	}
	return fmt.Sprintf("%s (%s side): %s; %s; %d KEEPALIVEs, %d UPDATEs in all: %v", what, d.Side, up, silent, d.Keepalives, d.Updates, d.Err)
}

func (d *SimDrop) Unwrap() error { return d.Err }

// notificationName names the NOTIFICATION codes a reflector sends.
func notificationName(code, sub uint8) string {
	switch code {
	case 1:
		return "message header error"
	case 2:
		return "OPEN message error"
	case 3:
		return "UPDATE message error"
	case 4:
		return "hold timer expired"
	case 5:
		return "FSM error"
	case 6:
		names := map[uint8]string{1: "maximum prefixes", 2: "administrative shutdown", 3: "peer de-configured",
			4: "administrative reset", 5: "connection rejected", 6: "other configuration change", 7: "connection collision", 8: "out of resources", 9: "hard reset"}
		if n, ok := names[sub]; ok {
			return "cease: " + n
		}
		return "cease"
	}
	return "unknown"
}

// simNotificationError is a NOTIFICATION the peer sent.
type simNotificationError struct{ code, sub uint8 }

func (e *simNotificationError) Error() string {
	return fmt.Sprintf("sim session: peer sent notification %d/%d", e.code, e.sub)
}

func notification(body []byte) error {
	e := &simNotificationError{}
	if len(body) >= 2 {
		e.code, e.sub = body[0], body[1]
	}
	return e
}

// simProtocolError is a message the simulated node could not take.
type simProtocolError struct{ what string }

func (e *simProtocolError) Error() string { return "sim session: " + e.what }

// dropped classifies err, the end of the session, into a SimDrop.
func (s *SimSession) dropped(err error) *SimDrop {
	d := &SimDrop{Err: err, Keepalives: s.keepalives.Load(), Updates: s.updates.Load(), SinceEstablished: s.sinceUp.Load()}
	now := time.Now()
	if up := s.upAt.Load(); up != 0 {
		d.Established = now.Sub(time.Unix(0, up))
	}
	if last := s.lastRead.Load(); last != 0 {
		d.Silent = now.Sub(time.Unix(0, last))
	}
	var ne *simNotificationError
	var pe *simProtocolError
	switch {
	case errors.As(err, &ne):
		d.Side, d.Cause, d.Code, d.Subcode = SimSidePeer, SimNotification, ne.code, ne.sub
	case errors.Is(err, os.ErrDeadlineExceeded):
		d.Side, d.Cause = SimSideLocal, SimHoldExpired
	case errors.As(err, &pe):
		d.Side, d.Cause = SimSideLocal, SimBadMessage
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, io.ErrClosedPipe):
		d.Side, d.Cause = SimSidePeer, SimPeerClosed
	default: // net.ErrClosed: closed here (a failed write is recorded first)
		d.Side, d.Cause = SimSideLocal, SimReadFailed
	}
	return d
}
