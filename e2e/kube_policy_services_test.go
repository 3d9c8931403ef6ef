package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/image"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// servicePortOffset: a policy-lab server's port p is reached through its
// Service's port p+servicePortOffset, so that every ClusterIP probe goes
// through kube-proxy's port translation and the policy sees only the
// target port.
const servicePortOffset = 10000

// policyServicesManifest is TestPolicy's pods (policyPods) as Kubernetes
// pods pinned to their nodes, aweb's container port 8080 named http, and
// one ClusterIP Service per server pod selecting it alone (its namespace
// and app label) with every server port mapped from p+servicePortOffset.
func policyServicesManifest() string {
	var b strings.Builder
	for _, ns := range []string{"alpha", "beta", "gamma"} {
		fmt.Fprintf(&b, "apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n---\n", ns)
	}
	for _, p := range policyPods {
		ports := ""
		if p.name == "aweb" {
			ports = "\n    ports: [{name: http, containerPort: 8080}]"
		}
		fmt.Fprintf(&b, `apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: {app: %s}}
spec:
  nodeName: %s
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: pause
    image: %s
    imagePullPolicy: Never%s
---
`, p.name, p.ns, p.app, p.node, image.PauseName, ports)
		if p.app == "client" {
			continue
		}
		fmt.Fprintf(&b, "apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: %s}\nspec:\n  selector: {app: %s}\n  ports:\n", p.name, p.ns, p.app)
		for _, port := range serverTCP {
			fmt.Fprintf(&b, "  - {name: tcp-%d, protocol: TCP, port: %d, targetPort: %d}\n", port, port+servicePortOffset, port)
		}
		for _, port := range serverUDP {
			fmt.Fprintf(&b, "  - {name: udp-%d, protocol: UDP, port: %d, targetPort: %d}\n", port, port+servicePortOffset, port)
		}
		b.WriteString("---\n")
	}
	return b.String()
}

// TestKubePolicyServices runs TestPolicy's truth table (policySteps) on the
// Kubernetes lab with kube-proxy in nftables mode: every case is probed
// both at the server pod's own address and through the ClusterIP of the
// server's own Service (port p+servicePortOffset, kube-proxy's DNAT to the
// pod's port p), and must get its verdict, and the server's answer with
// the client's own address, along both. No case has a pod reach its own
// Service (hairpin), so none differs (docs/kubernetes-lab.md).
func TestKubePolicyServices(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	l := upKubeProxyLab(ctx, t, "svpl", 3)
	kubectl := labKubectl(ctx, t, l, policyServicesManifest())
	ips := map[string]netip.Addr{}
	netns := map[string]string{}
	clusterIPs := map[string]netip.Addr{}
	for _, p := range policyPods {
		kubectl("-n", p.ns, "wait", "--for=condition=Ready", "pod/"+p.name, "--timeout=3m")
		pods, err := l.KubePods(ctx, p.ns, "app="+p.app)
		if err != nil || len(pods) != 1 || pods[0].Name != p.name || pods[0].Node != p.node {
			t.Fatalf("pods %+v, %v: want %s alone on %s", pods, err, p.name, p.node)
		}
		ips[p.name], netns[p.name] = pods[0].IPs[0].Addr(), lab.NetNSPath(pods[0].NetNS)
		if p.app != "client" {
			startPolicyServerIn(t, netns[p.name], p.name, serverTCP, serverUDP)
			clusterIPs[p.name] = netip.MustParseAddr(kubectl("-n", p.ns, "get", "service", p.name, "-o", "jsonpath={.spec.clusterIP}"))
		}
	}
	t.Cleanup(func() { deleteAllPolicies(t, l.Lab) })
	inNS := func(src string) string { return netns[src] }
	direct := casePath{name: "direct", ns: inNS,
		addr: func(c policyCase) netip.AddrPort { return netip.AddrPortFrom(ips[c.dst], uint16(c.port)) }}
	viaService := casePath{name: "via ClusterIP", ns: inNS,
		addr: func(c policyCase) netip.AddrPort {
			return netip.AddrPortFrom(clusterIPs[c.dst], uint16(c.port+servicePortOffset))
		}}
	// kube-proxy programs a Service a moment after its EndpointSlice.
	testkit.Eventually(t, time.Minute, "every server reached through its ClusterIP", func() error {
		for dst, ip := range clusterIPs {
			for _, proto := range []string{"tcp", "udp"} {
				port := serverTCP[0]
				if proto == "udp" {
					port = serverUDP[0]
				}
				addr := netip.AddrPortFrom(ip, uint16(port+servicePortOffset))
				if r := probeIn(ctx, netns["acli"], proto, addr); r.err != nil || !r.allowed {
					return fmt.Errorf("acli -> %s at %s/%s: allowed=%v %v", dst, addr, proto, r.allowed, r.err)
				}
			}
		}
		return nil
	})
	waitPolicyConverged(ctx, t, l.Lab)
	total := 0
	for _, step := range policySteps(ips) {
		ok := t.Run(step.name, func(t *testing.T) {
			setPolicies(ctx, t, l.Lab, step.objs)
			waitPolicyConverged(ctx, t, l.Lab)
			checkCasesVia(ctx, t, ips, step.cases, direct, viaService)
		})
		total += len(step.cases)
		if !ok {
			break
		}
	}
	t.Logf("%d truth-table cases, each probed directly and through a ClusterIP", total)
	// Hairpin: a server reaching its own Service. kube-proxy masquerades
	// a connection whose source is the backend it picked, so the server
	// sees its node's address; but Tabby's filter judges the packet before
	// that SNAT (kube-proxy's masquerade is in postrouting), so policy
	// decides as for a connection from the pod itself
	// (docs/kubernetes-lab.md): allowed with no policy, dropped under
	// alpha's default-deny, let in by alpha's same-namespace rule (which
	// the node's address would not match) — while the pod's connection to
	// its own address never leaves the pod and always succeeds.
	t.Run("Hairpin", func(t *testing.T) {
		var node netip.Addr
		for _, n := range l.State().Nodes {
			if n.Name == "node1" {
				node = n.IP.Addr()
			}
		}
		steps := policySteps(ips)
		for _, h := range []struct {
			step    policyStep
			allowed bool
		}{{steps[0], true}, {steps[1], false}, {steps[2], true}} {
			setPolicies(ctx, t, l.Lab, h.step.objs)
			waitPolicyConverged(ctx, t, l.Lab)
			var cases []policyCase
			for _, proto := range []string{"tcp", "udp"} {
				port := serverTCP[0]
				if proto == "udp" {
					port = serverUDP[0]
				}
				c := policyCase{src: "aweb", dst: "aweb", proto: proto, port: port}
				cases = append(cases, c)
				var r probeResult
				for range 2 {
					if r = probeIn(ctx, netns["aweb"], proto, viaService.addr(c)); r.err == nil && r.allowed == h.allowed {
						break
					}
				}
				switch want := "aweb " + node.String(); {
				case r.err != nil:
					t.Errorf("%s: aweb -> its own Service %s: %v", h.step.name, proto, r.err)
				case r.allowed != h.allowed:
					t.Errorf("%s: aweb -> its own Service %s: allowed=%v, want %v", h.step.name, proto, r.allowed, h.allowed)
				case r.allowed && r.answer != want:
					t.Errorf("%s: aweb -> its own Service %s: answer %q, want %q (the node's address after masquerade)", h.step.name, proto, r.answer, want)
				}
			}
			for i := range cases {
				cases[i].allowed = true
			}
			checkCasesVia(ctx, t, ips, cases, direct)
		}
	})
}
