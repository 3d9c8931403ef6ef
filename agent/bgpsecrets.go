package agent

import (
	"slices"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
)

// bgpProblems are what the last pass could not configure as asked: the
// sessions left out because their password's Secret key does not
// resolve, and configuration problems (a nodeMeshPassword that does not
// resolve, a localASNumber ignored). They show in the node's status.
type bgpProblems struct {
	unresolved []bgp.Unresolved
	problems   []string
}

// meshPassword is the cluster sessions' password (bgp.MeshPasswordFrom).
// When BGPConfiguration's nodeMeshPassword names a Secret key that does
// not resolve (deleted, not copied yet), the last value that resolved
// stays in use, else the generated mesh key: every agent reads the same
// record, so all fall back alike and the mesh stays up; the problem is
// reported (noteMeshProblem) instead of taking every cluster session down.
func (b *bgpOwner) meshPassword(bc *api.BGPConfiguration, lookup bgp.PasswordLookup) string {
	pw, err := bgp.MeshPasswordFrom(bc, b.meshKey(), lookup)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.meshProblem = ""
	switch {
	case err == nil && bc != nil && bc.Spec.NodeMeshPassword.SecretKeyRef != nil:
		b.meshSecret = pw
	case err != nil && b.meshSecret != "":
		b.meshProblem = "bgpconfiguration: " + err.Error() + "; the last password that resolved stays in use"
		pw = b.meshSecret
	case err != nil:
		b.meshProblem = "bgpconfiguration: " + err.Error() + "; the generated mesh key is used instead"
	}
	return pw
}

// noteBGPProblems records the sessions left out for their passwords and
// the configuration problems of this pass, and logs them once per change.
func (b *bgpOwner) noteBGPProblems(down []bgp.Unresolved, problems []string) {
	b.mu.Lock()
	if b.meshProblem != "" {
		problems = append([]string{b.meshProblem}, problems...)
	}
	b.mu.Unlock()
	var lines []string
	for _, d := range down {
		lines = append(lines, d.Peer.Address.String()+": "+d.Reason)
	}
	if replaced(&b.mu, &b.problemLines, append(lines, problems...)) {
		for _, d := range down {
			b.log.Warn("bgp session not made: its password does not resolve", "peer", d.Peer.Address, "name", d.Peer.Name, "reason", d.Reason)
		}
		for _, p := range problems {
			b.log.Warn("bgp configuration problem", "problem", p)
		}
	}
	b.mu.Lock()
	b.bgpProblems = bgpProblems{unresolved: slices.Clone(down), problems: problems}
	b.mu.Unlock()
}

// problemStatus adds the sessions left out (state Idle, the reason as
// INFO) to the status's peers and the configuration problems to its
// BGPProblems. Called with b.mu held.
func (b *bgpOwner) problemStatus(st *api.AgentStatus) {
	for _, d := range b.unresolved {
		st.Peers = append(st.Peers, api.PeerStatus{Address: d.Peer.Address.String(), Type: string(d.Peer.Type), State: "Idle", Info: d.Reason})
	}
	st.BGPProblems = slices.Clone(b.problems)
}
