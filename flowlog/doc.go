// Package flowlog owns the agent's flow logs: it turns the packets Tabby's
// policy rules log (NFLOG) and the kernel's conntrack events into flow
// records, attributed to the rule that decided and enriched with the
// endpoints the cluster view knows, aggregated per interval into a bounded
// buffer (docs/flows.md). It does no I/O: dataplane reads the kernel and
// the agent serves the records.
package flowlog
