package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// webRow is a flow the web view must show: a cell of the row's source
// ends with srcPort, the row is on node with action and names policy.
type webRow struct {
	node, action, srcPort, policy string
}

// testWebView runs `tabbyctl ui` against TestFlowLogs' lab and loads it
// in headless Chromium: the rendered page shows both nodes with their BGP
// sessions, the two pods, the denied connection (:81) with the default deny
// of node2's ingress and the allowed one (:80) with fl/web-in rule 0 (and
// node1's egress rule for both), and the what-if form answers DENIED at
// node2 for :81 and ALLOWED for :80. The page fetches nothing but the view.
// A screenshot is kept (the path is logged).
func testWebView(ctx context.Context, t *testing.T, l *lab.Lab) {
	chrome, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (Debian package chromium, scripts/deps.sh): the web view is not tested in a browser")
	}
	base := startUI(t, l)
	bctx, foreign := startBrowser(ctx, t, chrome, base)
	start := time.Now()
	if err := chromedp.Do(bctx, chromedp.Navigate(base)); err != nil {
		t.Fatalf("loading %s: %v", base, err)
	}
	wantFlows := []webRow{
		{"node2", "deny", ":40081", "default Deny at the end of ingress policies"},
		{"node2", "allow", ":40080", "NetworkPolicy fl/web-in ingress rule 0 (Allow)"},
		{"node1", "allow", ":40081", "NetworkPolicy fl/cli-out egress rule 0 (Allow)"},
		{"node1", "allow", ":40080", "NetworkPolicy fl/cli-out egress rule 0 (Allow)"},
	}
	var page webPage
	testkit.EventuallyEvery(t, 30*time.Second, 250*time.Millisecond, "the page shows nodes, pods and flows", func() error {
		rctx, cancel := context.WithTimeout(bctx, 10*time.Second)
		defer cancel()
		p, err := chromedp.Run(rctx, chromedp.Evaluate[webPage](readPageJS))
		if err != nil {
			return err
		}
		page = p
		return page.check(wantFlows)
	})
	t.Logf("web view rendered everything %v after loading; status %q", time.Since(start).Round(time.Millisecond), page.Status)

	for _, c := range []struct{ port, want string }{
		{"81/tcp", "Verdict: DENIED at node2"},
		{"80/tcp", "Verdict: ALLOWED"},
	} {
		out := whatIf(bctx, t, "pod/fl/fcli", "pod/fl/fweb", c.port)
		wants := []string{c.want, "node1, egress: ACCEPT", "decided NetworkPolicy fl/cli-out in tier default egress rule 0 (Allow)"}
		if c.port == "81/tcp" {
			wants = append(wants, "node2, ingress: DROP", "decided default Deny at the end of ingress policies")
		} else {
			wants = append(wants, "node2, ingress: ACCEPT", "decided NetworkPolicy fl/web-in in tier default ingress rule 0 (Allow)")
		}
		for _, w := range wants {
			if !strings.Contains(out, w) {
				t.Errorf("what-if %s lacks %q:\n%s", c.port, w, out)
			}
		}
	}
	// The denied case stays on screen for the screenshot.
	whatIf(bctx, t, "pod/fl/fcli", "pod/fl/fweb", "81/tcp")
	saveScreenshot(bctx, t)
	if f := foreign(); len(f) > 0 {
		t.Errorf("the page fetched outside the view: %q", f)
	}
}

// webPage is what readPageJS reads of the rendered DOM: each table's rows
// (header excluded) as cell texts.
type webPage struct {
	Nodes  [][]string `json:"nodes"`
	Pods   [][]string `json:"pods"`
	Flows  [][]string `json:"flows"`
	Status string     `json:"status"`
}

const readPageJS = `(() => {
  const rows = id => Array.from(document.querySelectorAll("#" + id + " tr")).slice(1)
    .map(tr => Array.from(tr.cells).map(td => td.textContent));
  return {nodes: rows("nodes"), pods: rows("pods"), flows: rows("flows"),
    status: document.getElementById("status").textContent};
})()`

// check: both nodes with an Established session each, both pods with a
// 10.244 address, and every wanted flow row (columns: end, node, reporter,
// source, destination, action, policy, packets).
func (p webPage) check(flows []webRow) error {
	var missing []string
	for _, n := range []string{"node1", "node2"} {
		if !slices.ContainsFunc(p.Nodes, func(r []string) bool {
			return len(r) == 3 && r[0] == n && strings.Contains(r[1], "198.18.") && strings.Contains(r[2], "Established")
		}) {
			missing = append(missing, "node "+n+" with an Established session")
		}
	}
	for _, pod := range [][2]string{{"fcli", "node1"}, {"fweb", "node2"}} {
		if !slices.ContainsFunc(p.Pods, func(r []string) bool {
			return len(r) == 4 && r[0] == "fl" && r[1] == pod[0] && r[2] == pod[1] && strings.HasPrefix(r[3], "10.244.")
		}) {
			missing = append(missing, "pod fl/"+pod[0])
		}
	}
	for _, w := range flows {
		if !slices.ContainsFunc(p.Flows, func(r []string) bool {
			return len(r) == 8 && r[1] == w.node && strings.HasPrefix(r[3], "fl/fcli ") && strings.HasSuffix(r[3], w.srcPort) &&
				strings.HasPrefix(r[4], "fl/fweb ") && r[5] == w.action && r[6] == w.policy
		}) {
			missing = append(missing, fmt.Sprintf("flow %v", w))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("page lacks %q (status %q, %d nodes, %d pods, %d flows)", missing, p.Status, len(p.Nodes), len(p.Pods), len(p.Flows))
	}
	return nil
}

// startUI runs `tabbyctl ui` on a free loopback port against the lab (the
// agents through their status sockets) until the test ends, and returns
// its URL.
func startUI(t *testing.T, l *lab.Lab) string {
	t.Helper()
	cmd := exec.Command(tabbyctlBin(t, l), "--etcd-endpoints", "unix://"+filepath.Join(l.Dir(), "etcd.sock"),
		"ui", "--listen", "127.0.0.1:0", "--agent", "unix://"+filepath.Join(l.Dir(), "{node}", "status.sock"))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("tabbyctl ui stderr:\n%s", stderr.String())
		}
	})
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		re := regexp.MustCompile(`http://127\.0\.0\.1:\d+/`)
		for sc.Scan() {
			if u := re.FindString(sc.Text()); u != "" {
				urls <- u
			}
		}
	}()
	select {
	case u := <-urls:
		return u
	case <-time.After(30 * time.Second):
		t.Fatalf("tabbyctl ui did not say where it serves; stderr:\n%s", stderr.String())
	}
	return ""
}

// startBrowser starts headless Chromium (its own profile, no sandbox as
// root, no background networking, every name but 127.0.0.1 unresolvable,
// so the view is all it can reach by name) and a tab. foreign
// returns the URLs the tab requested outside base.
func startBrowser(ctx context.Context, t *testing.T, chrome, base string) (tab context.Context, foreign func() []string) {
	t.Helper()
	// DefaultExecAllocatorOptions: --headless, --no-first-run,
	// --disable-background-networking, --disable-dev-shm-usage and more.
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"), chromedp.WindowSize(1280, 900))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	tab, tcancel := chromedp.NewContext(actx)
	t.Cleanup(func() { tcancel(); acancel() })
	var mu sync.Mutex
	var urls []string
	// The first call starts the browser: with the tab's own context, which
	// lives until the cleanup.
	if err := chromedp.Listen(tab, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok && !strings.HasPrefix(e.Request.URL, base) {
			mu.Lock()
			urls = append(urls, e.Request.URL)
			mu.Unlock()
		}
	}); err != nil {
		t.Fatalf("starting %s: %v", chrome, err)
	}
	return tab, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(urls)
	}
}

// whatIf fills the what-if form, submits it and returns the answer the
// page shows.
func whatIf(tab context.Context, t *testing.T, from, to, port string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 60*time.Second)
	defer cancel()
	err := chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS(`#whatif input[name=from]`), from),
		chromedp.SetValue(chromedp.CSS(`#whatif input[name=to]`), to),
		chromedp.SetValue(chromedp.CSS(`#whatif input[name=port]`), port),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("explain").textContent = ""`),
		chromedp.Click(chromedp.CSS(`#whatif button`)))
	var out string
	if err == nil {
		out, err = chromedp.Run(ctx, chromedp.Poll[string](`(() => { const s = document.getElementById("explain").textContent;
			return s.includes("Verdict:") || s.startsWith("error:") ? s : false; })()`, chromedp.WithPollingTimeout(50*time.Second)))
	}
	if err != nil {
		t.Fatalf("what-if %s -> %s %s: %v", from, to, port, err)
	}
	return out
}

// saveScreenshot keeps a full-page PNG of the view in $TABBY_ARTIFACTS (or
// the temporary directory) and logs its path.
func saveScreenshot(tab context.Context, t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := os.Getenv("TABBY_ARTIFACTS")
	if dir == "" {
		dir = os.TempDir()
	}
	path := filepath.Join(dir, fmt.Sprintf("tabby-webview-%s.png", time.Now().UTC().Format("20060102T150405")))
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	t.Logf("screenshot of the web view (%d bytes): %s", len(png), path)
}
