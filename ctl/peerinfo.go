package ctl

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/tabbynet/tabby/bgp/session"
)

// The agent publishes a session's last disconnect reason as the speaker
// reports it ("<reason>: <detail>", e.g. "notification received:
// notification-received code 6(cease) subcode 2(administrative shutdown)").
// node status turns that and the session state into words an operator
// acts on; the raw text stays in the agent's JSON status.

// reasonText is the operator text of each disconnect reason.
var reasonText = map[string]string{
	"admin down":            "session shut down on this node",
	"hold timer expired":    "hold timer expired: no keepalive from the peer",
	"read failed":           "connection lost (read failed)",
	"write failed":          "connection lost (write failed)",
	"idle timer expired":    "retrying after the idle hold time",
	"restart timer expired": "peer did not come back within its graceful-restart time",
	"graceful restart":      "peer restarting (graceful restart), its routes kept",
	"invalid msg":           "peer sent an invalid message",
	"hard reset":            "session reset (hard reset)",
	"deconfigured":          "peer removed from the configuration",
	"bad peer as":           "peer's AS number differs from the configured one",
}

// notificationRE matches the code and subcode of a BGP NOTIFICATION as the
// speaker spells them.
var notificationRE = regexp.MustCompile(`code (\d+)\(([^)]*)\) subcode (\d+)\(([^)]*)\)`)

// notificationCodes names the NOTIFICATION error codes (RFC 4271 §4.5) the
// way router documentation does.
var notificationCodes = map[int]string{
	1: "message header error",
	2: "OPEN error",
	3: "UPDATE error",
	4: "hold timer expired",
	5: "FSM error",
	6: "Cease",
	7: "ROUTE-REFRESH error",
}

// notificationText renders a NOTIFICATION's codes: "Cease/administrative
// shutdown", "OPEN error/bad peer AS".
func notificationText(detail string) string {
	m := notificationRE.FindStringSubmatch(detail)
	if m == nil {
		return ""
	}
	code, _ := strconv.Atoi(m[1])
	name, ok := notificationCodes[code]
	if !ok {
		name = "error code " + m[1]
	}
	sub := m[4]
	switch {
	case sub == "undefined" && m[3] == "0":
		return name
	case sub == "undefined":
		sub = "subcode " + m[3]
	case sub == "bad peer as":
		sub = "bad peer AS"
	case sub == "bad bgp identifier":
		sub = "bad BGP identifier"
	}
	return name + "/" + sub
}

// stateText explains a session state that has no disconnect reason.
var stateText = map[session.State]string{
	session.Idle:        "not connecting yet (idle)",
	session.Connect:     "waiting for peer to connect",
	session.Active:      "waiting for peer to connect",
	session.OpenSent:    "connected, waiting for the peer's OPEN",
	session.OpenConfirm: "connected, waiting for the peer's first keepalive",
}

// PeerInfoText is the INFO column of node status for a session in state
// with the published info. An Established session shows nothing; an
// unknown reason is shown as published rather than hidden.
func PeerInfoText(state, info string) string {
	st, known := session.Parse(state)
	if known && st == session.Established {
		return ""
	}
	info = strings.TrimSpace(info)
	if info == "" {
		if !known {
			return ""
		}
		return stateText[st]
	}
	reason, detail, _ := strings.Cut(info, ": ")
	switch reason {
	case "notification received":
		if n := notificationText(detail); n != "" {
			return "peer sent " + n
		}
		return "peer sent a notification"
	case "notification sent":
		if n := notificationText(detail); n != "" {
			return fmt.Sprintf("this node sent %s to the peer", n)
		}
		return "this node sent a notification to the peer"
	}
	if t, ok := reasonText[reason]; ok {
		return t
	}
	return info
}
