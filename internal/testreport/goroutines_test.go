package testreport

import (
	"runtime"
	"strings"
	"sync"
	"testing"
)

// parkedOnChannel waits on c: several goroutines here have one stack.
func parkedOnChannel(c chan struct{}, started *sync.WaitGroup) {
	started.Done()
	<-c
}

// dumpLines is every goroutine's stack as a timeout prints it, split into
// lines as test2json hands them over.
func dumpLines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.SplitAfter(string(buf), "\n")
}

func TestFoldGoroutinesRealDump(t *testing.T) {
	c := make(chan struct{})
	defer close(c)
	var started sync.WaitGroup
	started.Add(5)
	for range 5 {
		go parkedOnChannel(c, &started)
	}
	started.Wait()
	// Let each reach its receive: one counted as started may not have
	// parked yet.
	var lines []string
	for {
		lines = dumpLines()
		if strings.Count(strings.Join(lines, ""), "testreport.parkedOnChannel(") == 5 &&
			strings.Count(strings.Join(lines, ""), "[chan receive]:\ngithub.com/tabbynet/tabby/internal/testreport.parkedOnChannel") == 5 {
			break
		}
		runtime.Gosched()
	}
	got := foldGoroutines(append([]string{"panic: test timed out after 20m0s\n"}, lines...), maxDigestLines)
	want := "    5× [chan receive]\n        github.com/tabbynet/tabby/internal/testreport.parkedOnChannel (goroutines_test.go:"
	if !strings.Contains(got, want) {
		t.Errorf("the five parked goroutines are not one entry %q:\n%s", want, got)
	}
	if !strings.Contains(got, "        created by github.com/tabbynet/tabby/internal/testreport.TestFoldGoroutinesRealDump (goroutines_test.go:") {
		t.Errorf("their creator is not one frame without its goroutine number:\n%s", got)
	}
	if strings.Contains(got, "0x") {
		t.Errorf("arguments or offsets left in:\n%s", got)
	}
}

func TestFoldGoroutinesWaitsAndBound(t *testing.T) {
	dump := `goroutine 1 [chan receive, 19 minutes]:
testing.(*T).Run(0xc000102000, {0x7a, 0x13}, 0xc00010a000)
	/usr/lib/go/src/testing/testing.go:2005 +0x485
main.main()
	_testmain.go:45 +0x9b

goroutine 7 [select, 3 minutes]:
x/bgp.(*Speaker).bfdLoop(0xc0001)
	/work/bgp/bfd.go:88 +0x1a5
created by x/bgp.(*Speaker).Start in goroutine 6
	/work/bgp/speaker.go:120 +0x3c5

goroutine 9 [select, 18 minutes]:
x/bgp.(*Speaker).bfdLoop(0xc0002)
	/work/bgp/bfd.go:88 +0x1a5
created by x/bgp.(*Speaker).Start in goroutine 8
	/work/bgp/speaker.go:120 +0x3c5

goroutine 11 [select]:
x/bgp.(*Speaker).bfdLoop(0xc0003)
	/work/bgp/bfd.go:88 +0x1a5
created by x/bgp.(*Speaker).Start in goroutine 10
	/work/bgp/speaker.go:120 +0x3c5
`
	got := foldGoroutines(strings.SplitAfter(dump, "\n"), maxDigestLines)
	for _, want := range []string{
		"    goroutines at the timeout: 4, 2 distinct stacks",
		"    1× [chan receive, up to 19 minutes]\n        testing.(*T).Run (testing.go:2005)\n        main.main (_testmain.go:45)\n",
		"    3× [select, up to 18 minutes]\n        x/bgp.(*Speaker).bfdLoop (bfd.go:88)\n        created by x/bgp.(*Speaker).Start (speaker.go:120)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("folded dump lacks %q:\n%s", want, got)
		}
	}
	if got := foldGoroutines(strings.SplitAfter(dump, "\n"), 5); !strings.Contains(got, "… 1 more stacks") || strings.Count(got, "\n") > 5 {
		t.Errorf("bounded to 5 lines:\n%s", got)
	}
}

func TestUnendedOutputKeepsTheTestsOwnLines(t *testing.T) {
	lines := strings.SplitAfter("=== RUN   TestHang\n    hang_test.go:9: dialing\npanic: test timed out after 20m0s\n\ngoroutine 3 [IO wait, 20 minutes]:\nx.dial()\n\t/x/d.go:1 +0x1\n", "\n")
	got := unendedOutput(lines, 80)
	for _, want := range []string{"    hang_test.go:9: dialing\n", "panic: test timed out after 20m0s\n", "    1× [IO wait, up to 20 minutes]\n        x.dial (d.go:1)\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("lacks %q:\n%s", want, got)
		}
	}
}
