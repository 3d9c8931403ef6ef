package agent

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/tabbynet/tabby/policy"
)

// maxWhatifQuery bounds the query string of GET /policy/evaluate; a
// packet's parameters fit in a few hundred bytes.
const maxWhatifQuery = 4096

// whatifRoutes adds the policy what-if endpoints to the status API:
//
//	GET /policy/ruleset   the Ruleset this agent last applied (JSON)
//	GET /policy/evaluate  policy.EvalPath of one packet over it (policy.Packet.Query)
//
// Both answer 503 until a policy pass has been applied. `tabbyctl explain
// packet` asks the agents of the nodes a packet crosses, so that what-if
// evaluates exactly the rules the dataplane rendered (docs/explain.md).
func (a *Agent) whatifRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /policy/ruleset", func(w http.ResponseWriter, r *http.Request) {
		rs, ok := a.appliedRuleset(w)
		if ok {
			writeJSON(w, rs)
		}
	})
	mux.HandleFunc("GET /policy/evaluate", func(w http.ResponseWriter, r *http.Request) {
		if len(r.URL.RawQuery) > maxWhatifQuery {
			http.Error(w, fmt.Sprintf("query of %d bytes, at most %d", len(r.URL.RawQuery), maxWhatifQuery), http.StatusRequestURITooLong)
			return
		}
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			http.Error(w, "malformed query: "+err.Error(), http.StatusBadRequest)
			return
		}
		path, pkt, err := policy.ParsePacketQuery(q)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rs, ok := a.appliedRuleset(w)
		if !ok {
			return
		}
		trs, acc, err := policy.EvalPath(rs, policy.Paths[path], pkt)
		if err != nil {
			// The compiled state is what cannot be evaluated: say so loudly.
			a.log.Error("what-if evaluation failed", "err", err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSON(w, policy.NodeTrace{Node: a.cfg.NodeName, Path: path, Accepted: acc, Traces: trs})
	})
}

// appliedRuleset is the Ruleset of the last successful policy pass, or
// writes why there is none.
func (a *Agent) appliedRuleset(w http.ResponseWriter) (*policy.Ruleset, bool) {
	if a.policy == nil {
		http.Error(w, "policy is not enforced on this node", http.StatusServiceUnavailable)
		return nil, false
	}
	rs := a.policy.published.Load()
	if rs == nil {
		http.Error(w, "policy not programmed yet", http.StatusServiceUnavailable)
		return nil, false
	}
	return rs, true
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v) // the client went away; nothing to do
}
