package testreport

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A stream as `go test -json` writes it: a package that ran, one whose
// every test skipped, one that failed, one that did not build.
const stream = `{"Action":"start","Package":"x/a"}
{"Action":"run","Package":"x/a","Test":"TestOne"}
{"Action":"output","Package":"x/a","Test":"TestOne","Output":"=== RUN   TestOne\n"}
{"Action":"run","Package":"x/a","Test":"TestOne/sub"}
{"Action":"pass","Package":"x/a","Test":"TestOne/sub","Elapsed":0}
{"Action":"pass","Package":"x/a","Test":"TestOne","Elapsed":0.01}
{"Action":"output","Package":"x/a","Test":"TestRoot","Output":"    a_test.go:12: privileged test skipped: needs root\n"}
{"Action":"output","Package":"x/a","Test":"TestRoot","Output":"--- SKIP: TestRoot (0.00s)\n"}
{"Action":"skip","Package":"x/a","Test":"TestRoot","Elapsed":0}
{"Action":"pass","Package":"x/a","Elapsed":0.5}
{"Action":"output","Package":"x/e2e","Test":"TestLab","Output":"    e2e_test.go:26: end-to-end test skipped: needs root\n"}
{"Action":"skip","Package":"x/e2e","Test":"TestLab","Elapsed":0}
{"Action":"output","Package":"x/e2e","Test":"TestMesh","Output":"    e2e_test.go:26: end-to-end test skipped: needs root\n"}
{"Action":"skip","Package":"x/e2e","Test":"TestMesh","Elapsed":0}
{"Action":"output","Package":"x/e2e","Output":"ok  \tx/e2e\t0.1s\n"}
{"Action":"pass","Package":"x/e2e","Elapsed":0.1}
{"Action":"output","Package":"x/b","Test":"TestBad","Output":"    b_test.go:3: got 1, want 2\n"}
{"Action":"fail","Package":"x/b","Test":"TestBad","Elapsed":0}
{"Action":"fail","Package":"x/b","Elapsed":0.2}
{"ImportPath":"x/c","Action":"build-output","Output":"c.go:1:1: syntax error\n"}
{"Action":"output","Package":"x/c","Output":"FAIL\tx/c [build failed]\n"}
{"Action":"fail","Package":"x/c","Elapsed":0}
{"Action":"skip","Package":"x/d","Elapsed":0}
{"Action":"run","Package":"x/t","Test":"TestQuick"}
{"Action":"output","Package":"x/t","Test":"TestQuick","Output":"=== RUN   TestQuick\n"}
{"Action":"pass","Package":"x/t","Test":"TestQuick","Elapsed":0}
{"Action":"run","Package":"x/t","Test":"TestHang"}
{"Action":"output","Package":"x/t","Test":"TestHang","Output":"=== RUN   TestHang\n"}
{"Action":"output","Package":"x/t","Test":"TestHang","Output":"panic: test timed out after 20m0s\n"}
{"Action":"output","Package":"x/t","Output":"FAIL\tx/t\t1200.3s\n"}
{"Action":"fail","Package":"x/t","Elapsed":1200.3}
not json
`

func TestRead(t *testing.T) {
	var out bytes.Buffer
	tier, err := Read("unit", strings.NewReader(stream), &out)
	if err != nil {
		t.Fatal(err)
	}
	want := &Tier{
		Name: "unit", Ran: true, Passed: 2, Failed: 1, Skipped: 3,
		Skips: []Skip{
			{Package: "x/a", Test: "TestRoot", Reason: "privileged test skipped: needs root"},
			{Package: "x/e2e", Test: "TestLab", Reason: "end-to-end test skipped: needs root"},
			{Package: "x/e2e", Test: "TestMesh", Reason: "end-to-end test skipped: needs root"},
		},
		FailedNames: []string{"x/b.TestBad", "x/c", "x/t", "x/t.TestHang (did not end)"},
	}
	if diff := cmp.Diff(want, tier); diff != "" {
		t.Errorf("tier (-want +got):\n%s", diff)
	}
	got := out.String()
	for _, line := range []string{
		"ok    x/a  500ms  (1 passed, 1 skipped)",
		"SKIP  x/e2e  100ms  (all 2 tests skipped: not run)",
		"    b_test.go:3: got 1, want 2",
		"FAIL  x/b  200ms  (0 passed, 1 failed, 0 skipped)",
		"c.go:1:1: syntax error",
		"FAIL  x/c  0s  (0 passed, 0 failed, 0 skipped)",
		"not json",
		"panic: test timed out after 20m0s",
		"FAIL  x/t  20m0.3s  (1 passed, 0 failed, 0 skipped)",
	} {
		if !strings.Contains(got, line+"\n") {
			t.Errorf("report lacks %q:\n%s", line, got)
		}
	}
	if strings.Contains(got, "ok    x/e2e") || strings.Contains(got, "x/d") {
		t.Errorf("a package that ran nothing is reported as ok:\n%s", got)
	}
}

func TestWriteSummary(t *testing.T) {
	tiers := []*Tier{
		{Name: "unit", Ran: true, Passed: 10, Skipped: 4, Skips: []Skip{
			{Package: "x/a", Test: "TestP1", Reason: "TABBY_SKIP_PRIVILEGED is set"},
			{Package: "x/a", Test: "TestP2", Reason: "TABBY_SKIP_PRIVILEGED is set"},
			{Package: "x/b", Test: "TestP3", Reason: "TABBY_SKIP_PRIVILEGED is set"},
			{Package: "x/b", Test: "TestP4", Reason: "TABBY_SKIP_PRIVILEGED is set"},
		}},
		{Name: "privileged", Ran: true, Passed: 3, Failed: 1, FailedNames: []string{"x/a.TestP1"}},
		{Name: "e2e", Reason: "not root (uid 1000): the lab needs network namespaces"},
	}
	var out bytes.Buffer
	WriteSummary(&out, tiers)
	want := `
==== test tiers ====
unit        ran: 10 passed, 0 failed, 4 skipped
            4 skipped: TABBY_SKIP_PRIVILEGED is set [a.TestP1, a.TestP2, b.TestP3, … (1 more)]
privileged  FAILED: 3 passed, 1 failed, 0 skipped
            failed: x/a.TestP1
e2e         SKIPPED: not root (uid 1000): the lab needs network namespaces
tiers: 13 passed, 1 failed, 4 skipped
`
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("summary (-want +got):\n%s", diff)
	}
}
