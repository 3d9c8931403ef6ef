package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/google/go-cmp/cmp"
)

var (
	buildOnce sync.Once
	binDir    string // holds the tabby and echoprev binaries
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// plugins builds cmd/tabby and the echoprev test plugin once per test
// binary and returns the directory holding them.
func plugins(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "tcni-bin")
		if buildErr != nil {
			return
		}
		for name, pkg := range map[string]string{
			"tabby":    "github.com/tabbynet/tabby/cmd/tabby",
			"echoprev": "./testdata/echoprev",
		} {
			out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, name), pkg).CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("building %s: %v\n%s", pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// execResult is what one run of the plugin binary produced.
type execResult struct {
	stdout, stderr []byte
	exitCode       int
}

// execPlugin runs the tabby binary as a runtime would: CNI_* variables in
// the environment, the configuration on stdin.
func execPlugin(t testing.TB, env map[string]string, stdin []byte) execResult {
	t.Helper()
	cmd := exec.Command(filepath.Join(plugins(t), "tabby"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := execResult{stdout: stdout.Bytes(), stderr: stderr.Bytes()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.exitCode = ee.ExitCode()
	case err != nil:
		t.Fatalf("running tabby: %v", err)
	}
	return res
}

func cniEnv(cmd, containerID string) map[string]string {
	return map[string]string{
		"CNI_COMMAND":     cmd,
		"CNI_CONTAINERID": containerID,
		"CNI_NETNS":       "/var/run/netns/tabby-test-does-not-exist",
		"CNI_IFNAME":      "eth0",
		"CNI_PATH":        "/opt/cni/bin",
		"CNI_ARGS":        "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-" + containerID,
	}
}

// cniError decodes the error object a failed run printed.
func cniError(t testing.TB, r execResult) *types.Error {
	t.Helper()
	if r.exitCode == 0 {
		t.Fatalf("exit code 0, want failure; stdout %s", r.stdout)
	}
	var e types.Error
	if err := json.Unmarshal(r.stdout, &e); err != nil {
		t.Fatalf("stdout is not a CNI error: %v\n%s", err, r.stdout)
	}
	return &e
}

func TestBinaryVersion(t *testing.T) {
	r := execPlugin(t, map[string]string{"CNI_COMMAND": "VERSION"}, nil)
	if r.exitCode != 0 {
		t.Fatalf("exit code %d: %s %s", r.exitCode, r.stdout, r.stderr)
	}
	info, err := (&version.PluginDecoder{}).Decode(r.stdout)
	if err != nil {
		t.Fatalf("decoding %s: %v", r.stdout, err)
	}
	if diff := cmp.Diff(SupportedVersions, info.SupportedVersions()); diff != "" {
		t.Errorf("supported versions (-want +got):\n%s", diff)
	}
}

func TestBinaryAddDelEveryVersion(t *testing.T) {
	h := &fakeHandler{}
	sock, _ := startServer(t, h)
	for _, v := range SupportedVersions {
		t.Run(v, func(t *testing.T) {
			id := "bin" + strings.ReplaceAll(v, ".", "")
			r := execPlugin(t, cniEnv("ADD", id), netconf(t, v, sock, nil))
			if r.exitCode != 0 {
				t.Fatalf("ADD exit code %d: %s %s", r.exitCode, r.stdout, r.stderr)
			}
			res, err := version.NewResult(v, r.stdout)
			if err != nil {
				t.Fatalf("parsing ADD output as %s: %v\n%s", v, err, r.stdout)
			}
			if res.Version() != v {
				t.Errorf("result version %s, want %s", res.Version(), v)
			}
			r = execPlugin(t, cniEnv("DEL", id), netconf(t, v, sock, nil))
			if r.exitCode != 0 || len(r.stdout) != 0 {
				t.Errorf("DEL exit code %d, stdout %q", r.exitCode, r.stdout)
			}
		})
	}
	var got []string
	for _, c := range h.Calls() {
		got = append(got, c.Cmd+" "+c.ContainerID+" "+c.Args.PodName)
	}
	want := []string{
		"ADD bin030 web-bin030", "DEL bin030 web-bin030", "ADD bin031 web-bin031", "DEL bin031 web-bin031",
		"ADD bin040 web-bin040", "DEL bin040 web-bin040", "ADD bin100 web-bin100", "DEL bin100 web-bin100",
		"ADD bin110 web-bin110", "DEL bin110 web-bin110",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("handler calls (-want +got):\n%s", diff)
	}
}

func TestBinaryErrors(t *testing.T) {
	h := &fakeHandler{
		add: func(context.Context, *Request) (*current.Result, error) {
			return nil, errors.New("assigning address: pool default-ipv4 is exhausted")
		},
		del: func(context.Context, *Request) error {
			return types.NewError(types.ErrUnknownContainer, "unknown container", "c1")
		},
	}
	sock, _ := startServer(t, h)
	missing := filepath.Join(shortTempDir(t), "cni.sock")
	noID := cniEnv("ADD", "x")
	delete(noID, "CNI_CONTAINERID")

	tests := []struct {
		name  string
		env   map[string]string
		stdin []byte
		want  *types.Error
	}{
		{"agent unreachable", cniEnv("ADD", "c1"), netconf(t, "1.0.0", missing, nil),
			&types.Error{Code: 11, Msg: "cannot reach tabby-agent at " + missing}},
		{"handler error", cniEnv("ADD", "c1"), netconf(t, "1.0.0", sock, nil),
			&types.Error{Code: 999, Msg: "assigning address: pool default-ipv4 is exhausted"}},
		{"cni error from handler", cniEnv("DEL", "c1"), netconf(t, "1.0.0", sock, nil),
			&types.Error{Code: 3, Msg: "unknown container", Details: "c1"}},
		{"missing variable", noID, netconf(t, "1.0.0", sock, nil),
			&types.Error{Code: 4, Msg: "required env variables [CNI_CONTAINERID] missing"}},
		{"unsupported version", cniEnv("ADD", "c1"), netconf(t, "0.2.0", sock, nil),
			&types.Error{Code: 1, Msg: "incompatible CNI versions"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := cniError(t, execPlugin(t, tt.env, tt.stdin))
			if tt.want.Details == "" {
				got.Details = "" // long operator hints, checked elsewhere
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBinaryWithoutCommandPrintsAbout(t *testing.T) {
	r := execPlugin(t, nil, nil)
	if r.exitCode != 0 || !strings.Contains(string(r.stderr), "CNI plugin tabby") ||
		!strings.Contains(string(r.stderr), "0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0") {
		t.Errorf("exit code %d, stderr %q", r.exitCode, r.stderr)
	}
}

// BenchmarkShimExec measures what every pod start pays for the plugin
// process itself: exec of the binary answering VERSION.
func BenchmarkShimExec(b *testing.B) {
	bin := filepath.Join(plugins(b), "tabby")
	for b.Loop() {
		cmd := exec.Command(bin)
		cmd.Env = []string{"CNI_COMMAND=VERSION"}
		out, err := cmd.Output()
		if err != nil || !bytes.Contains(out, []byte(`"supportedVersions"`)) {
			b.Fatalf("VERSION: %v %s", err, out)
		}
	}
}

// BenchmarkShimAdd is one ADD through the real binary and the socket, with
// a handler that does nothing.
func BenchmarkShimAdd(b *testing.B) {
	sock, _ := startServer(b, &fakeHandler{})
	stdin := netconf(b, "1.0.0", sock, nil)
	for b.Loop() {
		r := execPlugin(b, cniEnv("ADD", "bench"), stdin)
		if r.exitCode != 0 {
			b.Fatalf("ADD: %s %s", r.stdout, r.stderr)
		}
	}
}
