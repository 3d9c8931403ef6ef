package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/google/go-cmp/cmp"
	"github.com/tabbynet/tabby/internal/testkit"
)

func TestWireResultInRequestedVersion(t *testing.T) {
	h := &fakeHandler{}
	sock, _ := startServer(t, h)
	for _, v := range SupportedVersions {
		t.Run(v, func(t *testing.T) {
			out, err := runShim(context.Background(), "ADD", "c-"+strings.ReplaceAll(v, ".", ""), "", netconf(t, v, sock, nil))
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			res, err := version.NewResult(v, out)
			if err != nil {
				t.Fatalf("parsing result as %s: %v\n%s", v, err, out)
			}
			if res.Version() != v {
				t.Errorf("result version %q, want %q", res.Version(), v)
			}
			if !strings.Contains(string(out), fmt.Sprintf(`"cniVersion": %q`, v)) {
				t.Errorf("printed result does not carry cniVersion %s:\n%s", v, out)
			}
			got, err := current.NewResultFromResult(res)
			if err != nil {
				t.Fatal(err)
			}
			want := testResult("eth0", "10.244.0.5")
			want.CNIVersion = got.CNIVersion
			if diff := cmp.Diff(mustJSON(t, want), mustJSON(t, got)); diff != "" {
				t.Errorf("result after round trip (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWireErrorMapping(t *testing.T) {
	tests := []struct {
		name    string
		conf    map[string]any // overrides of the network configuration
		cmd     string
		addErr  error
		panics  bool
		noRes   bool
		want    *types.Error
		handled bool // whether the handler must have been called
	}{
		{name: "cni error passes through", cmd: "ADD", addErr: types.NewError(types.ErrUnknownContainer, "no such pod", "gone"),
			want: &types.Error{Code: 3, Msg: "no such pod", Details: "gone"}, handled: true},
		{name: "wrapped cni error passes through", cmd: "ADD", addErr: fmt.Errorf("assigning: %w", types.NewError(types.ErrTryAgainLater, "pool busy", "")),
			want: &types.Error{Code: 11, Msg: "pool busy"}, handled: true},
		{name: "plain error is internal", cmd: "ADD", addErr: errors.New("assigning address for k8s.c1: pool exhausted"),
			want: &types.Error{Code: 999, Msg: "assigning address for k8s.c1: pool exhausted"}, handled: true},
		{name: "deadline is try again later", cmd: "ADD", addErr: fmt.Errorf("writing endpoint: %w", context.DeadlineExceeded),
			want: &types.Error{Code: 11, Msg: "writing endpoint: context deadline exceeded", Details: "tabby-agent ran out of time for this request"}, handled: true},
		{name: "panic is internal", cmd: "ADD", panics: true,
			want: &types.Error{Code: 999, Msg: "tabby-agent failed: boom"}, handled: true},
		{name: "nil result is internal", cmd: "ADD", noRes: true,
			want: &types.Error{Code: 999, Msg: "tabby-agent produced no result for ADD"}, handled: true},
		{name: "wrong type", cmd: "ADD", conf: map[string]any{"type": "calico"},
			want: &types.Error{Code: 7, Msg: "invalid tabby network configuration", Details: `type is "calico", want "tabby"`}},
		{name: "bad mtu and timeout", cmd: "ADD", conf: map[string]any{"mtu": 20, "timeout_seconds": -1},
			want: &types.Error{Code: 7, Msg: "invalid tabby network configuration", Details: "mtu 20 is outside 68..65535; timeout_seconds -1 is negative"}},
		{name: "unsupported version", cmd: "ADD", conf: map[string]any{"cniVersion": "0.2.0"},
			want: &types.Error{Code: 1, Msg: "incompatible CNI versions", Details: `network configuration has cniVersion "0.2.0"; tabby supports 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0`}},
		{name: "check before 0.4.0", cmd: "CHECK", conf: map[string]any{"cniVersion": "0.3.1"},
			want: &types.Error{Code: 1, Msg: "config version 0.3.1 does not allow CHECK", Details: "CHECK needs cniVersion 0.4.0 or later"}},
		{name: "status before 1.1.0", cmd: "STATUS", conf: map[string]any{"cniVersion": "1.0.0"},
			want: &types.Error{Code: 1, Msg: "config version 1.0.0 does not allow STATUS", Details: "STATUS needs cniVersion 1.1.0 or later"}},
		{name: "check without prevResult", cmd: "CHECK",
			want: &types.Error{Code: 7, Msg: "CHECK needs a prevResult", Details: "the runtime passed no prevResult in the network configuration"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &fakeHandler{add: func(context.Context, *Request) (*current.Result, error) {
				if tt.panics {
					panic("boom")
				}
				if tt.noRes {
					return nil, nil
				}
				return nil, tt.addErr
			}}
			sock, srv := startServer(t, h)
			stdin := netconf(t, "1.1.0", sock, tt.conf)
			// Send the raw request, bypassing the shim's own validation, so
			// that the server's mapping is what is tested.
			resp, err := roundTrip(context.Background(), sock, &Request{Command: tt.cmd, ContainerID: "c1", IfName: "eth0", StdinData: stdin}, time.Minute)
			if err != nil {
				t.Fatalf("roundTrip: %v", err)
			}
			if diff := cmp.Diff(tt.want, resp.Error); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if got := len(h.Calls()) > 0; got != tt.handled {
				t.Errorf("handler called: %v, want %v", got, tt.handled)
			}
			// Through the shim the runtime sees the same error object.
			_, err = runShim(context.Background(), tt.cmd, "c1", "", stdin)
			var got *types.Error
			if !errors.As(err, &got) {
				t.Errorf("shim error %v (%T), want a *types.Error", err, err)
			} else if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("shim error (-want +got):\n%s", diff)
			}
			if n := srv.locks.waiters("c1"); n != 0 {
				t.Errorf("lock of c1 still has %d holders", n)
			}
		})
	}
}

func TestUnreachableAgent(t *testing.T) {
	dir := shortTempDir(t)
	// A socket file whose listener is gone: connection refused.
	refused := filepath.Join(dir, "refused.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: refused, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()

	for _, tc := range []struct {
		name, sock, cmd string
		code            uint
	}{
		{"missing socket", filepath.Join(dir, "missing", "cni.sock"), "ADD", types.ErrTryAgainLater},
		{"connection refused", refused, "DEL", types.ErrTryAgainLater},
		{"status", refused, "STATUS", types.ErrPluginNotAvailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runShim(context.Background(), tc.cmd, "c1", "", netconf(t, "1.1.0", tc.sock, nil))
			var te *types.Error
			if !errors.As(err, &te) {
				t.Fatalf("error %v (%T), want a *types.Error", err, err)
			}
			if te.Code != tc.code {
				t.Errorf("code %d, want %d", te.Code, tc.code)
			}
			if want := "cannot reach tabby-agent at " + tc.sock; te.Msg != want {
				t.Errorf("msg %q, want %q", te.Msg, want)
			}
			for _, hint := range []string{"tabby-node pod running on this node", "agent_socket", tc.sock} {
				if !strings.Contains(te.Details, hint) {
					t.Errorf("details %q do not mention %q", te.Details, hint)
				}
			}
		})
	}
}

func TestWireArgsReachHandler(t *testing.T) {
	h := &fakeHandler{}
	sock, _ := startServer(t, h)
	stdin := netconf(t, "1.0.0", sock, map[string]any{
		"mtu":             1450,
		"args":            map[string]any{"cni": map[string]any{"labels": []map[string]string{{"key": "app", "value": "web"}}}},
		"runtimeConfig":   map[string]any{"ips": []string{"10.244.1.7/32"}, "mac": "0A:58:0A:F4:01:07"},
		"timeout_seconds": 7,
	})
	cniArgs := "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=c7;K8S_POD_UID=u1"
	if _, err := runShim(context.Background(), "ADD", "c7", cniArgs, stdin); err != nil {
		t.Fatal(err)
	}
	calls := h.Calls()
	if len(calls) != 1 {
		t.Fatalf("%d calls, want 1", len(calls))
	}
	want := &Args{PodNamespace: "shop", PodName: "web-0", InfraContainerID: "c7",
		Labels: map[string]string{"app": "web"}, IPs: mustAddrs("10.244.1.7"), MAC: "0a:58:0a:f4:01:07"}
	if diff := cmp.Diff(want, calls[0].Args, addrCmp); diff != "" {
		t.Errorf("args (-want +got):\n%s", diff)
	}
	if c := calls[0].Conf; c.MTU != 1450 || c.Timeout("ADD") != 7*time.Second || c.AgentSocket != sock {
		t.Errorf("conf mtu %d timeout %s socket %s", c.MTU, c.Timeout("ADD"), c.AgentSocket)
	}
}

func TestWirePrevResult(t *testing.T) {
	h := &fakeHandler{}
	sock, _ := startServer(t, h)
	// The runtime caches the result in the configuration's version (0.4.0
	// here) and hands it back as prevResult.
	old, err := testResult("eth0", "10.244.0.9").GetAsVersion("0.4.0")
	if err != nil {
		t.Fatal(err)
	}
	prevMap, err := resultToMap(old)
	if err != nil {
		t.Fatal(err)
	}
	withPrev := netconf(t, "0.4.0", sock, map[string]any{"prevResult": prevMap})
	for _, cmd := range []string{"CHECK", "DEL"} {
		if _, err := runShim(context.Background(), cmd, "c9", "", withPrev); err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
	}
	// DEL without prevResult, and with a damaged one, still works.
	if _, err := runShim(context.Background(), "DEL", "c9", "", netconf(t, "0.4.0", sock, nil)); err != nil {
		t.Fatalf("DEL without prevResult: %v", err)
	}
	if _, err := runShim(context.Background(), "DEL", "c9", "", netconf(t, "1.0.0", sock, map[string]any{"prevResult": map[string]any{"ips": "nonsense"}})); err != nil {
		t.Fatalf("DEL with damaged prevResult: %v", err)
	}
	// ADD ignores a prevResult.
	if _, err := runShim(context.Background(), "ADD", "c9", "", withPrev); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	calls := h.Calls()
	if len(calls) != 5 {
		t.Fatalf("%d calls, want 5", len(calls))
	}
	for i, want := range []string{"10.244.0.9/32", "10.244.0.9/32", "", "", ""} {
		got := ""
		if p := calls[i].Prev; p != nil {
			if p.CNIVersion != current.ImplementedSpecVersion {
				t.Errorf("call %d: prevResult version %s, want current", i, p.CNIVersion)
			}
			got = p.IPs[0].Address.String()
		}
		if got != want {
			t.Errorf("call %d (%s): prevResult address %q, want %q", i, calls[i].Cmd, got, want)
		}
		if calls[i].Cmd == "ADD" && calls[i].Conf.PrevResult != nil {
			t.Errorf("ADD saw a prevResult")
		}
	}
}

func TestWireStatusAndGC(t *testing.T) {
	var statusErr error
	h := &fakeHandler{status: func(context.Context) error { return statusErr }}
	sock, _ := startServer(t, h)
	if _, err := runShim(context.Background(), "STATUS", "", "", netconf(t, "1.1.0", sock, nil)); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
	statusErr = errors.New("no IP pool has free blocks")
	_, err := runShim(context.Background(), "STATUS", "", "", netconf(t, "1.1.0", sock, nil))
	if diff := cmp.Diff(error(&types.Error{Code: 50, Msg: "no IP pool has free blocks"}), err); diff != "" {
		t.Errorf("STATUS error (-want +got):\n%s", diff)
	}
	valid := []types.GCAttachment{{ContainerID: "c1", IfName: "eth0"}, {ContainerID: "c2", IfName: "eth0"}}
	if _, err := runShim(context.Background(), "GC", "", "", netconf(t, "1.1.0", sock, map[string]any{"cni.dev/valid-attachments": valid})); err != nil {
		t.Fatalf("GC: %v", err)
	}
	calls := h.Calls()
	if diff := cmp.Diff(valid, calls[len(calls)-1].Valid); diff != "" {
		t.Errorf("valid attachments (-want +got):\n%s", diff)
	}
}

func TestWireObserverAndDeadline(t *testing.T) {
	type obs struct {
		Cmd  string
		Code uint
	}
	var mu sync.Mutex
	var seen []obs
	h := &fakeHandler{
		del: func(ctx context.Context, _ *Request) error {
			<-ctx.Done() // the agent is stuck until the request's deadline
			return ctx.Err()
		},
	}
	sock, _ := startServer(t, h, WithObserver(func(cmd string, dur time.Duration, err error) {
		o := obs{Cmd: cmd}
		var te *types.Error
		if errors.As(err, &te) {
			o.Code = te.Code
		} else if err != nil {
			t.Errorf("observer got %T, want *types.Error", err)
		}
		mu.Lock()
		seen = append(seen, o)
		mu.Unlock()
	}))
	if _, err := runShim(context.Background(), "ADD", "c1", "", netconf(t, "1.0.0", sock, nil)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := runShim(context.Background(), "DEL", "c1", "", netconf(t, "1.0.0", sock, map[string]any{"timeout_seconds": 1}))
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrTryAgainLater {
		t.Fatalf("DEL error %v, want code 11", err)
	}
	if d := time.Since(start); d < 850*time.Millisecond || d > 5*time.Second {
		t.Errorf("DEL took %s, want about the 1 s timeout", d)
	}
	testkit.Eventually(t, 10*time.Second, "observer to see DEL", testkit.Cond(func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == 2
	}))
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]obs{{"ADD", 0}, {"DEL", 11}}, seen); diff != "" {
		t.Errorf("observed (-want +got):\n%s", diff)
	}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
