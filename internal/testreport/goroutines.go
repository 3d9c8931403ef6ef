package testreport

import (
	"fmt"
	"path"
	"regexp"
	"strings"
)

// A test that did not end leaves Go's goroutine dump in its output: on a
// timeout, every goroutine of the test binary, thousands of lines. The first
// lines alone (the panicking timer and a few others) rarely show what hung,
// and the report is often all that is kept of a failed CI run. So the dump
// is folded: goroutines with the same stack are one entry, with how many and
// how long the longest had waited, frames without arguments or offsets.

// goroutineRE is a goroutine's header: "goroutine 42 [select, 18 minutes]:".
var goroutineRE = regexp.MustCompile(`^goroutine \d+ (?:gp=\S+ m=\S+ (?:mp=\S+ )?)?\[([^\]]*)\]:$`)

// frameLocRE is a frame's location line: "\t/path/file.go:123 +0x1a5".
var frameLocRE = regexp.MustCompile(`^\t(\S+):(\d+)(?: \+0x[0-9a-f]+)?$`)

// maxDigestLines bounds the folded dump.
const maxDigestLines = 400

type stackGroup struct {
	state   string // without the wait: "select", "chan receive", "IO wait"
	waitMax string // the longest wait among them, as the dump says it ("18 minutes")
	waitMin int    // minutes of waitMax, for comparing
	frames  []string
	count   int
}

// unendedOutput is what the report shows of a test that did not end: its
// output up to the goroutine dump (at most n lines), then the dump folded.
func unendedOutput(lines []string, n int) string {
	first := len(lines)
	for i, l := range lines {
		if goroutineRE.MatchString(strings.TrimRight(l, "\n")) {
			first = i
			break
		}
	}
	if first == len(lines) {
		return head(lines, n)
	}
	return head(lines[:first], n) + foldGoroutines(lines[first:], maxDigestLines)
}

// foldGoroutines folds a goroutine dump (lines as `go test` wrote them) into
// one entry per distinct stack, in the order first seen, at most max lines.
func foldGoroutines(lines []string, max int) string {
	var groups []*stackGroup
	byKey := map[string]*stackGroup{}
	total := 0
	var cur *stackGroup
	var frames []string
	end := func() {
		if cur == nil {
			return
		}
		key := cur.state + "\x00" + strings.Join(frames, "\x00")
		g := byKey[key]
		if g == nil {
			g = &stackGroup{state: cur.state, frames: frames, waitMin: -1}
			byKey[key] = g
			groups = append(groups, g)
		}
		g.count++
		if cur.waitMin > g.waitMin {
			g.waitMin, g.waitMax = cur.waitMin, cur.waitMax
		}
		total++
		cur, frames = nil, nil
	}
	var fn string
	for _, raw := range lines {
		l := strings.TrimRight(raw, "\n")
		if m := goroutineRE.FindStringSubmatch(l); m != nil {
			end()
			cur = parseState(m[1])
			fn = ""
			continue
		}
		if cur == nil {
			continue
		}
		switch m := frameLocRE.FindStringSubmatch(l); {
		case l == "":
			end()
		case m != nil:
			frames = append(frames, fmt.Sprintf("%s (%s:%s)", fn, path.Base(m[1]), m[2]))
		default:
			fn = stripArgs(l)
		}
	}
	end()
	var b strings.Builder
	fmt.Fprintf(&b, "    goroutines at the timeout: %d, %d distinct stacks (folded by the test report)\n", total, len(groups))
	lines0 := 1
	for i, g := range groups {
		wait := g.state
		if g.waitMax != "" {
			wait += ", up to " + g.waitMax
		}
		entry := []string{fmt.Sprintf("    %d× [%s]\n", g.count, wait)}
		for _, f := range g.frames {
			entry = append(entry, "        "+f+"\n")
		}
		if lines0+len(entry) > max {
			fmt.Fprintf(&b, "    … %d more stacks\n", len(groups)-i)
			break
		}
		b.WriteString(strings.Join(entry, ""))
		lines0 += len(entry)
	}
	return b.String()
}

// parseState splits a goroutine's bracket ("select, 18 minutes", "chan
// receive, locked to thread") into its state and its wait.
func parseState(s string) *stackGroup {
	g := &stackGroup{waitMin: -1}
	var rest []string
	for _, part := range strings.Split(s, ", ") {
		var n int
		if _, err := fmt.Sscanf(part, "%d minutes", &n); err == nil && strings.HasSuffix(part, "minutes") {
			g.waitMax, g.waitMin = part, n
			continue
		}
		rest = append(rest, part)
	}
	g.state = strings.Join(rest, ", ")
	return g
}

// stripArgs drops a frame's arguments: "pkg.(*T).F(0xc000, 0x1)" becomes
// "pkg.(*T).F", "created by pkg.F in goroutine 7" becomes "created by pkg.F"
// (the creator's number would keep equal stacks apart).
func stripArgs(l string) string {
	if strings.HasPrefix(l, "created by ") {
		if i := strings.Index(l, " in goroutine "); i > 0 {
			return l[:i]
		}
		return l
	}
	if i := strings.LastIndex(l, "("); i > 0 && strings.HasSuffix(l, ")") {
		return l[:i]
	}
	return l
}
