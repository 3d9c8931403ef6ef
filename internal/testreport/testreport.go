// Package testreport reads `go test -json` streams, one per test tier, and
// says honestly what ran: a package whose every test skipped is reported as
// skipped with the reason, not as "ok", and the summary at the end of `make
// test` lists each tier as run or skipped, with why.
package testreport

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// Skip is one skipped test and its reason.
type Skip struct {
	Package string `json:"package"`
	Test    string `json:"test"`
	Reason  string `json:"reason"`
}

// Tier is what one tier did.
type Tier struct {
	Name string `json:"name"`
	// Ran is false for a tier skipped as a whole; Reason says why.
	Ran    bool   `json:"ran"`
	Reason string `json:"reason,omitempty"`
	Passed int    `json:"passed"`
	Failed int    `json:"failed"`
	// Skipped counts tests that skipped, listed in Skips.
	Skipped int    `json:"skipped"`
	Skips   []Skip `json:"skips,omitempty"`
	// FailedNames are failed tests, and packages that failed without a
	// failed test (build errors, panics, timeouts).
	FailedNames []string `json:"failedNames,omitempty"`
}

// OK reports whether nothing failed.
func (t *Tier) OK() bool { return t.Failed == 0 && len(t.FailedNames) == 0 }

type testKey struct{ pkg, test string }

type pkgState struct {
	passed, failed, skipped int
	failedTest              bool
}

// reasonRE finds the t.Skip message in a skipped test's output.
var reasonRE = regexp.MustCompile(`^\s+\S+\.go:\d+: (.*)$`)

// Read consumes a `go test -json` stream for tier name, writes a readable
// report to w as packages finish (failed tests with their output, build
// errors, and for each package ok, skipped or FAIL with counts), and
// returns the tier's totals. Lines that are not JSON are passed through.
func Read(name string, r io.Reader, w io.Writer) (*Tier, error) {
	t := &Tier{Name: name, Ran: true}
	out := map[testKey][]string{}
	pkgs := map[string]*pkgState{}
	pkg := func(p string) *pkgState {
		if pkgs[p] == nil {
			pkgs[p] = &pkgState{}
		}
		return pkgs[p]
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil {
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		k := testKey{ev.Package, ev.Test}
		switch ev.Action {
		case "build-output":
			fmt.Fprint(w, ev.Output)
		case "output":
			out[k] = append(out[k], ev.Output)
		case "pass":
			if ev.Test == "" {
				report(w, ev, pkg(ev.Package), false)
				continue
			}
			if !strings.Contains(ev.Test, "/") {
				t.Passed++
				pkg(ev.Package).passed++
			}
			delete(out, k)
		case "skip":
			if ev.Test == "" {
				report(w, ev, pkg(ev.Package), false)
				continue
			}
			if !strings.Contains(ev.Test, "/") {
				t.Skipped++
				pkg(ev.Package).skipped++
				t.Skips = append(t.Skips, Skip{Package: ev.Package, Test: ev.Test, Reason: skipReason(out[k])})
			}
			delete(out, k)
		case "fail":
			if ev.Test == "" {
				p := pkg(ev.Package)
				if !p.failedTest {
					// Failed without a failed test: build error, panic, timeout.
					t.FailedNames = append(t.FailedNames, ev.Package)
					fmt.Fprint(w, strings.Join(out[k], ""))
					// A panic or timeout is told in the output of the
					// tests still running, which never end: name them.
					for _, name := range unended(out, ev.Package) {
						t.FailedNames = append(t.FailedNames, ev.Package+"."+name+" (did not end)")
						fmt.Fprint(w, unendedOutput(out[testKey{ev.Package, name}], unendedLines))
					}
				}
				report(w, ev, p, true)
				continue
			}
			fmt.Fprint(w, strings.Join(out[k], ""))
			if !strings.Contains(ev.Test, "/") {
				t.Failed++
				p := pkg(ev.Package)
				p.failed++
				p.failedTest = true
				t.FailedNames = append(t.FailedNames, ev.Package+"."+ev.Test)
			}
			delete(out, k)
		}
	}
	if err := sc.Err(); err != nil {
		return t, fmt.Errorf("reading go test output: %w", err)
	}
	return t, nil
}

// unendedLines bounds the output shown of a test that did not end (a
// timeout's goroutine dump runs to thousands of lines).
const unendedLines = 80

// unended returns the top-level tests of pkg that started and neither
// passed, failed nor skipped, sorted.
func unended(out map[testKey][]string, pkg string) []string {
	var names []string
	for k := range out {
		if k.pkg == pkg && k.test != "" && !strings.Contains(k.test, "/") {
			names = append(names, k.test)
		}
	}
	slices.Sort(names)
	return names
}

// head joins the first n lines, saying how many were left out.
func head(lines []string, n int) string {
	if len(lines) <= n {
		return strings.Join(lines, "")
	}
	return strings.Join(lines[:n], "") + fmt.Sprintf("    … %d more lines\n", len(lines)-n)
}

// report writes a package's result line.
func report(w io.Writer, ev event, p *pkgState, failed bool) {
	el := (time.Duration(ev.Elapsed*1000) * time.Millisecond).String()
	switch {
	case failed:
		fmt.Fprintf(w, "FAIL  %s  %s  (%d passed, %d failed, %d skipped)\n", ev.Package, el, p.passed, p.failed, p.skipped)
	case p.passed+p.failed+p.skipped == 0:
		// No test files, or none matched -run: nothing to say.
	case p.passed == 0 && p.failed == 0:
		fmt.Fprintf(w, "SKIP  %s  %s  (all %d tests skipped: not run)\n", ev.Package, el, p.skipped)
	case p.skipped > 0:
		fmt.Fprintf(w, "ok    %s  %s  (%d passed, %d skipped)\n", ev.Package, el, p.passed, p.skipped)
	default:
		fmt.Fprintf(w, "ok    %s  %s  (%d passed)\n", ev.Package, el, p.passed)
	}
}

// skipReason is the message of the last t.Skip in a test's output.
func skipReason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		if m := reasonRE.FindStringSubmatch(strings.TrimRight(lines[i], "\n")); m != nil {
			return m[1]
		}
	}
	return "no reason given"
}

// WriteSummary prints every tier: run (with counts and the reasons tests
// skipped, grouped) or skipped (with why), then the closing line
// "N passed, N failed, N skipped" over all tiers.
func WriteSummary(w io.Writer, tiers []*Tier) {
	var passed, failed, skipped int
	fmt.Fprintln(w, "\n==== test tiers ====")
	for _, t := range tiers {
		if !t.Ran {
			fmt.Fprintf(w, "%-11s SKIPPED: %s\n", t.Name, t.Reason)
			continue
		}
		status := "ran"
		if !t.OK() {
			status = "FAILED"
		}
		fmt.Fprintf(w, "%-11s %s: %d passed, %d failed, %d skipped\n", t.Name, status, t.Passed, t.Failed, t.Skipped)
		for _, n := range t.FailedNames {
			fmt.Fprintf(w, "            failed: %s\n", n)
		}
		byReason := map[string][]string{}
		for _, s := range t.Skips {
			short := s.Package[strings.LastIndex(s.Package, "/")+1:] + "." + s.Test
			byReason[s.Reason] = append(byReason[s.Reason], short)
		}
		reasons := make([]string, 0, len(byReason))
		for r := range byReason {
			reasons = append(reasons, r)
		}
		slices.Sort(reasons)
		for _, r := range reasons {
			names := byReason[r]
			list := strings.Join(names[:min(3, len(names))], ", ")
			if len(names) > 3 {
				list += fmt.Sprintf(", … (%d more)", len(names)-3)
			}
			fmt.Fprintf(w, "            %d skipped: %s [%s]\n", len(names), r, list)
		}
		passed += t.Passed
		failed += len(t.FailedNames) // failed tests, and packages failed without one
		skipped += t.Skipped
	}
	fmt.Fprintf(w, "tiers: %d passed, %d failed, %d skipped\n", passed, failed, skipped)
}
