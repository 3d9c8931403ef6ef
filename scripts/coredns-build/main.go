// Command coredns is CoreDNS v1.15.0 with the plugins a Kubernetes cluster's
// DNS uses and nothing else: kubernetes (Service and pod records from the
// API server), forward (upstreams, unused in the lab, which reaches nothing
// outside), errors, log, health, ready, cache, loop and loadbalance. The
// lab's Corefile (lab/kube) uses them; a Corefile naming any other plugin
// is refused at start.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
)

// directives are the plugins in the order CoreDNS's plugin.cfg chains them
// (the order of a query's path, whatever the Corefile's order).
var directives = []string{
	"ready", "health", "errors", "log", "loadbalance", "cache", "kubernetes", "loop", "forward",
}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
