package kube

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tabbynet/tabby/internal/image"
	"github.com/tabbynet/tabby/lab"
)

// DemoService is the demo's Service: one echo backend (internal/cmd/echo,
// answering with its pod's name and the client's address) behind the
// ClusterIP Service hello on port 80.
const DemoService = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: hello
  namespace: default
spec:
  replicas: 1
  selector:
    matchLabels:
      app: hello
  template:
    metadata:
      labels:
        app: hello
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1
      containers:
        - name: echo
          image: ` + image.EchoName + `
          imagePullPolicy: Never
          args: ["-listen", ":8080"]
          ports:
            - containerPort: 8080
---
apiVersion: v1
kind: Service
metadata:
  name: hello
  namespace: default
spec:
  selector:
    app: hello
  ports:
    - port: 80
      targetPort: 8080
`

// demoServiceName is DemoService's DNS name.
const demoServiceName = "hello.default.svc." + ClusterDomain

// demoServiceMatrix applies DemoService and, from one of clients (pods of
// the demo) on every node but the backend's, resolves the Service's name
// through kube-dns and connects to it, as the pod's own resolver and
// sockets would: both from inside the pod's network namespace. It prints
// what each got and fails on the first that gets nothing.
func (l *Cluster) demoServiceMatrix(ctx context.Context, clients []lab.PodState, w io.Writer) error {
	path := filepath.Join(l.kubeDir(), "hello.yaml")
	if err := os.WriteFile(path, []byte(DemoService), 0o644); err != nil {
		return err
	}
	if _, err := l.Kubectl(ctx, "apply", "-f", path); err != nil {
		return err
	}
	if _, err := l.Kubectl(ctx, "rollout", "status", "deployment/hello", "--timeout=3m"); err != nil {
		return err
	}
	backends, err := l.KubePods(ctx, "default", "app=hello")
	if err != nil {
		return err
	}
	if len(backends) != 1 {
		return fmt.Errorf("%d hello pods running, want 1", len(backends))
	}
	backend := backends[0]
	out, err := l.Kubectl(ctx, "get", "service", "hello", "-o", "wide")
	if err != nil {
		return err
	}
	w.Write(out)
	fmt.Fprintf(w, "backend %s on %s (%s)\n\n", backend.Name, backend.Node, backend.IPs[0].Addr())
	seen := map[string]bool{}
	for _, c := range clients {
		if c.Node == backend.Node || seen[c.Node] {
			continue
		}
		seen[c.Node] = true
		// The Service's EndpointSlice reaches kube-proxy and CoreDNS a
		// moment after the backend is ready.
		var addr netip.Addr
		var answer string
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := lab.Poll(wctx, 250*time.Millisecond, func() (bool, error) {
			var err error
			addr, answer, err = serviceRequest(wctx, c.NetNS, demoServiceName, 80)
			return err == nil, nil
		})
		cancel()
		if err != nil {
			_, _, last := serviceRequest(ctx, c.NetNS, demoServiceName, 80)
			return fmt.Errorf("from %s on %s, %s: %v", c.Name, c.Node, demoServiceName, last)
		}
		// The backend answers "<its name> <the client's address:port>".
		f := strings.Fields(answer)
		if len(f) != 2 || f[0] != backend.Name || !strings.HasPrefix(f[1], c.IPs[0].Addr().String()+":") {
			return fmt.Errorf("from %s on %s: answer %q, want %s seeing %s", c.Name, c.Node, answer, backend.Name, c.IPs[0].Addr())
		}
		fmt.Fprintf(w, "%s on %s: %s is %s, answered %q\n", c.Name, c.Node, demoServiceName, addr, answer)
	}
	if len(seen) == 0 {
		return fmt.Errorf("no demo pod on a node other than %s", backend.Node)
	}
	fmt.Fprintf(w, "\nevery node's pods reach the Service by name; the backend sees each pod's own address\n")
	return nil
}

// serviceRequest resolves name through kube-dns and reads the one line a
// connection to it at port gets, both from the network namespace ns.
func serviceRequest(ctx context.Context, ns, name string, port int) (netip.Addr, string, error) {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return lab.DialIn(ctx, ns, network, net.JoinHostPort(DNSServiceIP, "53"))
	}}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	addrs, err := r.LookupNetIP(rctx, "ip4", name+".")
	if err != nil || len(addrs) == 0 {
		return netip.Addr{}, "", fmt.Errorf("resolving %s through %s: %v", name, DNSServiceIP, err)
	}
	addr := addrs[0].Unmap()
	c, err := lab.DialIn(rctx, ns, "tcp", netip.AddrPortFrom(addr, uint16(port)).String())
	if err != nil {
		return addr, "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return addr, strings.TrimSpace(line), err
}
