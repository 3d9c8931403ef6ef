package cni

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/go-cmp/cmp"
)

// The real binaries, driven the way a container runtime drives them:
// libcni runs a conflist with tabby first and echoprev second.
func TestChainedConflistViaLibcni(t *testing.T) {
	for _, v := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) { testChain(t, v) })
	}
}

func testChain(t *testing.T, cniVersion string) {
	h := &fakeHandler{}
	sock, _ := startServer(t, h)
	dir := shortTempDir(t)
	recordDir := filepath.Join(dir, "records")
	if err := os.Mkdir(recordDir, 0o700); err != nil {
		t.Fatal(err)
	}
	list, err := libcni.NetworkConfFromBytes(mustMarshal(t, map[string]any{
		"cniVersion": cniVersion,
		"name":       "k8s-pod-network",
		"plugins": []map[string]any{
			{"type": "tabby", "agent_socket": sock, "mtu": 1440,
				"capabilities": map[string]bool{"ips": true, "mac": true},
				"args":         map[string]any{"cni": map[string]any{"labels": []Label{{Key: "app", Value: "web"}}}}},
			{"type": "echoprev", "record_dir": recordDir},
		},
	}))
	if err != nil {
		t.Fatal(err)
	}
	cniConf := libcni.NewCNIConfigWithCacheDir([]string{plugins(t)}, filepath.Join(dir, "cache"), nil)
	rt := &libcni.RuntimeConf{
		ContainerID: "chain1",
		NetNS:       "/var/run/netns/tabby-test-does-not-exist",
		IfName:      "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "shop"}, {"K8S_POD_NAME", "web-0"},
			{"K8S_POD_INFRA_CONTAINER_ID", "chain1"},
		},
		CapabilityArgs: map[string]any{"ips": []string{"10.244.7.7/32"}, "mac": "0a:58:0a:f4:07:07"},
	}
	ctx := context.Background()

	res, err := cniConf.AddNetworkList(ctx, list, rt)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if res.Version() != cniVersion {
		t.Errorf("chain result version %s, want %s", res.Version(), cniVersion)
	}
	final, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	// tabby's attachment, passed on by echoprev, which marked it.
	if got := final.IPs[0].Address.String(); got != "10.244.7.7/32" {
		t.Errorf("chain result address %s, want the requested 10.244.7.7/32", got)
	}
	if got := final.Interfaces[0].Mac; got != "0a:58:0a:f4:07:07" {
		t.Errorf("chain result MAC %s, want the requested one", got)
	}
	if final.DNS.Domain != "echoprev.test" {
		t.Errorf("chain result DNS domain %q: echoprev did not run after tabby", final.DNS.Domain)
	}
	// echoprev saw tabby's result as its prevResult.
	var echoAdd struct {
		PrevResult map[string]any `json:"prevResult"`
	}
	readJSON(t, filepath.Join(recordDir, "ADD.json"), &echoAdd)
	if echoAdd.PrevResult == nil {
		t.Error("echoprev got no prevResult on ADD")
	}

	if err := cniConf.CheckNetworkList(ctx, list, rt); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := cniConf.DelNetworkList(ctx, list, rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if cniVersion == "1.1.0" {
		if err := cniConf.GetStatusNetworkList(ctx, list); err != nil {
			t.Fatalf("STATUS: %v", err)
		}
		valid := []types.GCAttachment{{ContainerID: "other", IfName: "eth0"}}
		if err := cniConf.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: valid}); err != nil {
			t.Fatalf("GC: %v", err)
		}
	}

	type seen struct {
		Cmd, ContainerID, Pod string
		Labels                map[string]string
		PrevIP, PrevDomain    string
		MTU                   int
		Valid                 []types.GCAttachment
	}
	var got []seen
	for _, c := range h.Calls() {
		s := seen{Cmd: c.Cmd, ContainerID: c.ContainerID, MTU: c.Conf.MTU, Valid: c.Valid}
		if c.Args != nil {
			s.Pod, s.Labels = c.Args.PodNamespace+"/"+c.Args.PodName, c.Args.Labels
		}
		if c.Prev != nil {
			s.PrevIP, s.PrevDomain = c.Prev.IPs[0].Address.String(), c.Prev.DNS.Domain
		}
		got = append(got, s)
	}
	labels := map[string]string{"app": "web"}
	// CHECK and DEL get the chain's final result (cached by libcni) as prevResult.
	want := []seen{
		{Cmd: "ADD", ContainerID: "chain1", Pod: "shop/web-0", Labels: labels, MTU: 1440},
		{Cmd: "CHECK", ContainerID: "chain1", Pod: "shop/web-0", Labels: labels, PrevIP: "10.244.7.7/32", PrevDomain: "echoprev.test", MTU: 1440},
		{Cmd: "DEL", ContainerID: "chain1", Pod: "shop/web-0", Labels: labels, PrevIP: "10.244.7.7/32", PrevDomain: "echoprev.test", MTU: 1440},
	}
	if cniVersion == "1.1.0" {
		want = append(want,
			seen{Cmd: "STATUS", MTU: 1440},
			seen{Cmd: "GC", MTU: 1440, Valid: []types.GCAttachment{{ContainerID: "other", IfName: "eth0"}}})
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("agent saw (-want +got):\n%s", diff)
	}
	// libcni deletes in reverse order, so echoprev ran DEL too.
	if _, err := os.Stat(filepath.Join(recordDir, "DEL.json")); err != nil {
		t.Errorf("echoprev DEL: %v", err)
	}
}

func mustMarshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func readJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
}
