package e2e

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/kube/kubebins"
	"github.com/tabbynet/tabby/kube/kubetest"
	"github.com/tabbynet/tabby/lab"
	"github.com/tabbynet/tabby/lab/kube"
)

// npapiSubset is what `make test` runs of the network-policy-api
// conformance suite: two tests that between them cover both tiers, both
// directions, TCP and UDP, Accept, Deny and Pass, rule order and ports
// (2 minutes of suite, measured: BENCHMARKS.md). NPAPI_FULL=1
// (`make conformance-npapi`) runs every test.
const npapiSubset = `^TestConformance$/^(CNPAdminTierEgressTCP|CNPBaselineTierIngressUDP)$`

// npapiSCTP are the suite's tests that probe SCTP, which the lab's kernel
// does not have (docs/policy.md): they fail whatever Tabby does (a probe
// must connect, or time out; agnhost connect says "OTHER: protocol not
// supported").
var npapiSCTP = regexp.MustCompile(`SCTP|Gress$|InlineCIDRPeers$|EgressNodePeers$|PortRange$`)

// TestNPAPIConformance runs the network-policy-api conformance suite (the
// module's own tests, scripts/npapi-conformance) against a Kubernetes lab
// running Tabby with the ClusterNetworkPolicy CRD, as the cluster's admin
// from the control plane's namespace, and reports pass/fail/skip counts.
// Every test that does not probe SCTP must pass.
func TestNPAPIConformance(t *testing.T) {
	testkit.RequirePrivileged(t, "ip", "nsenter", "nft")
	kubetest.Require(t, kubebins.Names...)
	dir := os.Getenv("NPAPI_DIR")
	suiteBin := filepath.Join(dir, "npapi-conformance.test")
	if _, err := os.Stat(suiteBin); dir == "" || err != nil {
		t.Skipf("network-policy-api conformance suite not built (NPAPI_DIR=%q): run `make npapi-bins images`", dir)
	}
	binDir := os.Getenv("TABBY_BIN")
	archives, err := kube.HostCheck(binDir, []string{"pause.oci.tar", "tabby.oci.tar", "coredns.oci.tar", "echo.oci.tar", "agnhost.oci.tar"}, nil, nil)
	if err != nil {
		t.Skip(err.Error())
	}
	ctx := context.Background()
	name := testkit.UniqueName(t, "npc")
	base, err := lab.Up(ctx, lab.Options{Name: name, Nodes: 2, RunDir: runDir, BinDir: binDir, NoAgents: true, Log: testWriter{t}})
	if err != nil {
		_ = lab.Teardown(context.Background(), runDir, name, testWriter{t})
		t.Fatalf("lab up: %v", err)
	}
	l := kube.New(base)
	t.Cleanup(func() {
		if t.Failed() {
			dumpKubeLogs(t, l)
		}
		if err := l.Down(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	if err := l.Up(ctx, kube.UpOptions{Kube: kube.KubeOptions{Images: archives, KubeProxy: kube.ProxyNFTables},
		Deploy: kube.DeployOptions{ManifestDir: "../manifests"}}); err != nil {
		t.Fatal(err)
	}
	run := npapiSubset
	if os.Getenv("NPAPI_FULL") == "1" {
		run = "^TestConformance$"
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+lab.NetNSPath(l.State().EtcdNS()), "--",
		suiteBin, "-test.v", "-test.timeout=80m", "-test.run", run, "-all-features")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+l.AdminKubeconfig())
	out, runErr := cmd.CombinedOutput()
	// Kept after the test (t.TempDir would not be): the whole suite's output.
	logPath := filepath.Join(os.TempDir(), "tabby-npapi-conformance.log")
	if err := os.WriteFile(logPath, out, 0o644); err != nil {
		t.Log(err)
	} else {
		t.Logf("the suite's output: %s", logPath)
	}
	pass, fail, skip := npapiCounts(out)
	t.Logf("network-policy-api conformance (%s) in %v: %d passed, %d failed, %d skipped; failed: %v",
		run, time.Since(start).Round(time.Second), len(pass), len(fail), len(skip), fail)
	var core []string
	for _, f := range fail {
		if !npapiSCTP.MatchString(f) {
			core = append(core, f)
		}
	}
	// A suite that failed with no failing test named (a crash, a timeout)
	// fails this test too; failures that only need SCTP do not.
	if len(core) > 0 || len(pass) == 0 || (runErr != nil && len(fail) == 0) {
		t.Errorf("conformance tests failed that do not need SCTP: %v (suite: %v)\n%s", core, runErr, tail(out, 200))
	}
}

// npapiCounts lists the suite's tests (TestConformance/<name>, not their
// subtests) by outcome.
func npapiCounts(out []byte) (pass, fail, skip []string) {
	re := regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): TestConformance/([A-Za-z0-9]+) `)
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := re.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		switch m[1] {
		case "PASS":
			pass = append(pass, m[2])
		case "FAIL":
			fail = append(fail, m[2])
		default:
			skip = append(skip, m[2])
		}
	}
	return pass, fail, skip
}

func tail(b []byte, lines int) string {
	ls := strings.Split(string(b), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}
