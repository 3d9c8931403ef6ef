package lab

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// The kernel's IPv4 neighbour (ARP) table is one table for the whole host,
// shared by every network namespace, and net.ipv4.neigh.default.gc_thresh3
// caps it (1024 by default; the sysctl exists only in the root namespace).
// A lab's nodes all sit on one fabric subnet, so in a full mesh every node
// holds an entry for every other node: the table grows with the square of
// the node count. Past the cap the kernel refuses new entries ("neighbour
// table overflow"), BGP sessions never come up and pings fail. Up checks
// the estimate before it creates anything.

const (
	gcThresh3Sysctl = "net.ipv4.neigh.default.gc_thresh3"
	gcThresh3Path   = "/proc/sys/net/ipv4/neigh/default/gc_thresh3"
	// arpCacheStat's first column (hex) is the number of entries in the
	// shared table right now, all namespaces together.
	arpCacheStat = "/proc/net/stat/arp_cache"
)

// neighbourEntries estimates the IPv4 neighbour entries a running lab of
// nodes nodes (the first rrs of them route reflectors, rrs = 0 for a full
// mesh) with podsPerNode pods each holds: each node's BGP peers, its
// gateway, etcd and its pods; each pod's gateway; and etcd's and the ToR's
// entries for the nodes.
func neighbourEntries(nodes, rrs, podsPerNode int) int {
	var peers int
	if rrs == 0 {
		peers = nodes * (nodes - 1)
	} else {
		peers = rrs*(nodes-1) + (nodes-rrs)*rrs
	}
	return peers + 4*nodes + 2*nodes*podsPerNode
}

// maxNodesWithin is the largest node count (at most maxNodes) whose estimate
// fits limit, with rrs reflectors (0 = full mesh) and podsPerNode pods.
func maxNodesWithin(limit, rrs, podsPerNode, maxNodes int) int {
	n := max(rrs, 0)
	for n < maxNodes && neighbourEntries(n+1, rrs, podsPerNode) <= limit {
		n++
	}
	return n
}

// checkNeighbourTable returns an error naming the limit, the largest lab
// that fits it and the ways out when a lab of this shape would not fit a
// neighbour table capped at limit entries.
func checkNeighbourTable(nodes, rrs, podsPerNode, limit int) error {
	need := neighbourEntries(nodes, rrs, podsPerNode)
	if need <= limit {
		return nil
	}
	maxNodes := maxNodeHost - firstNodeHost + 1
	shape := "full-mesh"
	if rrs > 0 {
		shape = fmt.Sprintf("%d-reflector", rrs)
	}
	msg := fmt.Sprintf("a %s lab of %d nodes with %d pods each needs about %d neighbour (ARP) entries, more than the host's limit %s=%d "+
		"(one table for every network namespace): at most %d nodes fit",
		shape, nodes, podsPerNode, need, gcThresh3Sysctl, limit, maxNodesWithin(limit, rrs, podsPerNode, maxNodes))
	if rrs == 0 {
		if fit := maxNodesWithin(limit, 2, podsPerNode, maxNodes); fit >= nodes {
			msg += "; with route reflectors (--route-reflectors 2) this lab fits"
		} else {
			msg += fmt.Sprintf("; with route reflectors (--route-reflectors 2) up to %d", fit)
		}
	}
	msg += fmt.Sprintf("; or raise the limit: sysctl -w %s=%d (and gc_thresh2 to about half of it)", gcThresh3Sysctl, roundUpPow2(need+need/4))
	return errors.New(msg)
}

func roundUpPow2(n int) int {
	p := 1
	for p < n {
		p *= 2
	}
	return p
}

// hostNeighbourLimit reads gc_thresh3 and how many entries the shared
// table holds now.
func hostNeighbourLimit() (limit, inUse int, err error) {
	b, err := os.ReadFile(gcThresh3Path)
	if err != nil {
		return 0, 0, fmt.Errorf("reading %s: %w", gcThresh3Sysctl, err)
	}
	limit, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, 0, fmt.Errorf("reading %s: %w", gcThresh3Sysctl, err)
	}
	if b, err := os.ReadFile(arpCacheStat); err == nil {
		// "entries allocs …" then one line per CPU; entries is global.
		lines := strings.Split(string(b), "\n")
		if len(lines) > 1 {
			if f := strings.Fields(lines[1]); len(f) > 0 {
				if v, err := strconv.ParseInt(f[0], 16, 64); err == nil {
					inUse = int(v)
				}
			}
		}
	}
	return limit, inUse, nil
}

// checkHostFits refuses a lab that would overflow the host's neighbour
// table, and warns (on log) when it fits alone but not next to what other
// namespaces hold now.
func checkHostFits(log io.Writer, nodes, rrs, podsPerNode int) error {
	limit, inUse, err := hostNeighbourLimit()
	if err != nil {
		progress(log, "warning: cannot check the host's neighbour table limit: %v", err)
		return nil
	}
	if err := checkNeighbourTable(nodes, rrs, podsPerNode, limit); err != nil {
		return err
	}
	if need := neighbourEntries(nodes, rrs, podsPerNode); need+inUse > limit {
		progress(log, "warning: this lab needs about %d neighbour entries and the host's table already holds %d of its %s=%d: "+
			"sessions may not come up until other labs are down or the limit is raised", need, inUse, gcThresh3Sysctl, limit)
	}
	return nil
}
