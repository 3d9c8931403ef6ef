package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/lab"
)

// tabbyctl runs tabbyctl against the lab's etcd: the one in $TABBY_BIN, or
// else one built for the lab (the lab builds only what it runs itself).
func tabbyctl(t *testing.T, l *lab.Lab, args ...string) (string, error) {
	t.Helper()
	bin := tabbyctlBin(t, l)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	argv := append([]string{"--etcd-endpoints", "unix://" + filepath.Join(l.Dir(), "etcd.sock")}, args...)
	out, err := exec.CommandContext(ctx, bin, argv...).CombinedOutput()
	return string(out), err
}

// tabbyctlBin is the tabbyctl binary of $TABBY_BIN, or one built into the
// lab's directory.
func tabbyctlBin(t *testing.T, l *lab.Lab) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := filepath.Join(os.Getenv("TABBY_BIN"), "tabbyctl")
	if os.Getenv("TABBY_BIN") == "" {
		bin = filepath.Join(l.Dir(), "bin", "tabbyctl")
		if _, err := os.Stat(bin); err != nil {
			out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/tabbynet/tabby/cmd/tabbyctl").CombinedOutput()
			if err != nil {
				t.Fatalf("building tabbyctl: %v\n%s", err, out)
			}
		}
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("tabbyctl binary: %v", err)
	}
	return bin
}

// testTabbyctl: node status shows every session Established, explain names
// the right nodes and routes for a cross-node pod, and ipam check is clean
// after churn but finds a leak made on purpose.
func testTabbyctl(t *testing.T, l *lab.Lab) {
	out, err := tabbyctl(t, l, "node", "status", "--all")
	if err != nil {
		t.Fatalf("node status --all: %v\n%s", err, out)
	}
	n := len(l.State().Nodes)
	if want := fmt.Sprintf("%d of %d BGP sessions established", n*(n-1), n*(n-1)); !strings.Contains(out, want) {
		t.Errorf("node status --all lacks %q:\n%s", want, out)
	}

	out, err = tabbyctl(t, l, "explain", "pod", "default/n1p1")
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	ip := podIP(t, l, "n1p1")
	var node1 string
	for _, nd := range l.State().Nodes {
		if nd.Name == "node1" {
			node1 = nd.IP.Addr().String()
		}
	}
	for _, want := range []string{ip.String() + "/32 dev cali", "affine to node1", "via " + node1 + " proto 81", "node2", "node3"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}

	if out, err := tabbyctl(t, l, "ipam", "check", "--leak-grace", "0s"); err != nil {
		t.Errorf("ipam check after churn: %v\n%s", err, out)
	}
	// A leak on purpose: an address held by no workload.
	ctx := context.Background()
	a := ipam.New(l.Store())
	asg, err := a.Assign(ctx, ipam.AssignRequest{Node: "node2", Handle: "e2e-leak"})
	if err != nil {
		t.Fatal(err)
	}
	out, err = tabbyctl(t, l, "ipam", "check", "--leak-grace", "0s")
	if err == nil || !strings.Contains(out, asg.Addr.String()) {
		t.Errorf("ipam check did not report the leaked %s (err %v):\n%s", asg.Addr, err, out)
	}
	if out, err := tabbyctl(t, l, "ipam", "release", "--ip", asg.Addr.String(), "--handle", "e2e-leak"); err != nil {
		t.Errorf("ipam release: %v\n%s", err, out)
	}
	if out, err := tabbyctl(t, l, "ipam", "check", "--leak-grace", "0s"); err != nil {
		t.Errorf("ipam check after release: %v\n%s", err, out)
	}
}
