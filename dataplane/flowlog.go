package dataplane

import (
	"strconv"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/policy"
)

// FlowLogRules says which policy rules send packets to NFLOG, for the
// agent's flow logs (docs/flows.md). Every rule with a policy.Origin has a
// packet and byte counter whatever this says.
type FlowLogRules struct {
	// Deny: drops with an Origin log every packet they drop.
	Deny bool
	// Allow: allows with an Origin (and the default-allow end of a host
	// endpoint's list) log the packet they allow. Established packets are
	// accepted before any policy rule, so that is the first packet of each
	// flow only.
	Allow bool
	// Group is the NFLOG group (netlink multicast group of nfnetlink_log).
	Group uint16
}

// Logs reports whether rule r logs.
func (fl FlowLogRules) Logs(r policy.Rule) bool {
	if r.Origin == nil {
		return false
	}
	// By the API's action, not the verdict: a Pass rule marks the packet
	// (VerdictSetMark) as an allow does, and must not log as one.
	switch r.Origin.Action {
	case string(api.ActionDeny):
		return fl.Deny && r.Verdict.Kind == policy.VerdictDrop
	case string(api.ActionAllow):
		return fl.Allow && (r.Verdict.Kind == policy.VerdictAccept || r.Verdict.Kind == policy.VerdictSetMark)
	}
	return false
}

// FlowLogPrefixTag starts every log prefix Tabby's rules use.
const FlowLogPrefixTag = "tabby:"

// FlowLogPrefix is the NFLOG prefix of a rule of origin o:
// "tabby:<origin id>", well under the 64 characters iptables allows.
func FlowLogPrefix(o *policy.Origin) string { return FlowLogPrefixTag + o.ID() }

// ruleExtrasText is what the counter and the log add to a rule's text (and
// so to its identity): the origin, so that equal matches of two policies
// are two rules with their own counters, and the log target.
func ruleExtrasText(r policy.Rule, fl FlowLogRules) string {
	if r.Origin == nil {
		return ""
	}
	s := " counter origin " + r.Origin.String()
	if fl.Logs(r) {
		s += " log group " + strconv.Itoa(int(fl.Group)) + " prefix " + FlowLogPrefix(r.Origin)
	}
	return s
}

// RuleCounter is the packet and byte count of the kernel rules of one
// origin.
type RuleCounter struct {
	Origin         *policy.Origin
	Packets, Bytes uint64
}
