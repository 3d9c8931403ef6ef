package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// call is one Handler invocation seen by fakeHandler.
type call struct {
	Cmd         string
	ContainerID string
	Args        *Args
	Prev        *current.Result
	Valid       []types.GCAttachment
	Conf        *NetConf
}

// fakeHandler records calls and answers with the hooks it was given, or
// with a fixed attachment built from the request.
type fakeHandler struct {
	add    func(ctx context.Context, req *Request) (*current.Result, error)
	del    func(ctx context.Context, req *Request) error
	check  func(ctx context.Context, req *Request) error
	status func(ctx context.Context) error
	gc     func(ctx context.Context) error

	mu    sync.Mutex
	calls []call
}

func (f *fakeHandler) record(c call) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
}

func (f *fakeHandler) Calls() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

func (f *fakeHandler) Add(ctx context.Context, req *Request, conf *NetConf, args *Args) (*current.Result, error) {
	f.record(call{Cmd: "ADD", ContainerID: req.ContainerID, Args: args, Conf: conf})
	if f.add != nil {
		return f.add(ctx, req)
	}
	ip := "10.244.0.5"
	if len(args.IPs) > 0 {
		ip = args.IPs[0].String()
	}
	res := testResult(req.IfName, ip)
	if args.MAC != "" {
		res.Interfaces[0].Mac = args.MAC
	}
	return res, nil
}

func (f *fakeHandler) Del(ctx context.Context, req *Request, conf *NetConf, args *Args) error {
	f.record(call{Cmd: "DEL", ContainerID: req.ContainerID, Args: args, Prev: conf.CurrentPrevResult(), Conf: conf})
	if f.del != nil {
		return f.del(ctx, req)
	}
	return nil
}

func (f *fakeHandler) Check(ctx context.Context, req *Request, conf *NetConf, args *Args, prev *current.Result) error {
	f.record(call{Cmd: "CHECK", ContainerID: req.ContainerID, Args: args, Prev: prev, Conf: conf})
	if f.check != nil {
		return f.check(ctx, req)
	}
	return nil
}

func (f *fakeHandler) Status(ctx context.Context, conf *NetConf) error {
	f.record(call{Cmd: "STATUS", Conf: conf})
	if f.status != nil {
		return f.status(ctx)
	}
	return nil
}

func (f *fakeHandler) GC(ctx context.Context, conf *NetConf, valid []types.GCAttachment) error {
	f.record(call{Cmd: "GC", Valid: valid, Conf: conf})
	if f.gc != nil {
		return f.gc(ctx)
	}
	return nil
}

// testResult is a Tabby-style attachment: a /32 behind 169.254.1.1.
func testResult(ifName, ip string) *current.Result {
	_, dst, _ := net.ParseCIDR("0.0.0.0/0")
	return &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{{Name: ifName, Mac: "02:42:0a:f4:00:05", Sandbox: "/var/run/netns/pod"}},
		IPs: []*current.IPConfig{{
			Interface: current.Int(0),
			Address:   net.IPNet{IP: net.ParseIP(ip).To4(), Mask: net.CIDRMask(32, 32)},
			Gateway:   net.ParseIP("169.254.1.1").To4(),
		}},
		Routes: []*types.Route{{Dst: *dst, GW: net.ParseIP("169.254.1.1").To4()}},
	}
}

// startServer runs a server with h on a socket in a fresh temporary
// directory and stops it when the test ends. It returns the socket path.
func startServer(t testing.TB, h Handler, opts ...Option) (string, *Server) {
	t.Helper()
	path := filepath.Join(shortTempDir(t), "run", "cni.sock")
	srv := NewServer(path, h, nil, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-srv.Ready():
	case err := <-done:
		done <- err // for the cleanup
		t.Fatalf("Run ended early: %v", err)
	}
	return path, srv
}

// shortTempDir is a temporary directory whose paths fit into a unix socket
// address (108 bytes), which t.TempDir's long names may not.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tcni")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// netconf is a tabby network configuration pointing at socket, with extra
// keys merged in.
func netconf(t testing.TB, cniVersion, socket string, extra map[string]any) []byte {
	t.Helper()
	m := map[string]any{
		"cniVersion":   cniVersion,
		"name":         "k8s-pod-network",
		"type":         "tabby",
		"agent_socket": socket,
	}
	for k, v := range extra {
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// runShim runs the shim in process as skel would for cmd, returning what
// it printed and its error.
func runShim(ctx context.Context, cmd, containerID, cniArgs string, stdin []byte) ([]byte, error) {
	var out bytes.Buffer
	s := &shim{stdout: &out}
	err := s.run(ctx, cmd, &skel.CmdArgs{
		ContainerID: containerID,
		Netns:       "/var/run/netns/pod-" + containerID,
		IfName:      "eth0",
		Args:        cniArgs,
		Path:        "/opt/cni/bin",
		StdinData:   stdin,
	})
	return out.Bytes(), err
}
