package cni

import (
	"errors"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// FuzzParseRequest feeds the parsing that both the shim and the agent run on
// what a runtime sends (network configuration, CNI_ARGS, prevResult). It
// must never panic, and every rejection must be a CNI error object.
//
//	go test -run '^$' -fuzz FuzzParseRequest -fuzztime 60s ./cni
func FuzzParseRequest(f *testing.F) {
	seeds := []struct{ cmd, conf, args string }{
		{"ADD", `{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"tabby","mtu":1500}`, "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web-0"},
		{"ADD", `{"cniVersion":"1.0.0","name":"n","type":"tabby","runtimeConfig":{"ips":["10.244.0.5/32"],"mac":"02:00:00:00:00:01"},"args":{"cni":{"labels":[{"key":"app","value":"web"}]}}}`, ""},
		{"DEL", `{"cniVersion":"0.4.0","name":"n","type":"tabby","prevResult":{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.244.0.5/32"}]}}`, "K8S_POD_NAME=a"},
		{"CHECK", `{"cniVersion":"1.1.0","name":"n","type":"tabby","prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.244.0.5/32","interface":0}]}}`, ""},
		{"GC", `{"cniVersion":"1.1.0","name":"n","type":"tabby","cni.dev/valid-attachments":[{"containerID":"c","ifname":"eth0"}]}`, ""},
		{"STATUS", `{"cniVersion":"1.1.0","name":"n","type":"tabby"}`, ""},
		{"ADD", `{"cniVersion":"9.9.9"}`, "=;;=="},
		{"ADD", `{"cniVersion":"1.0.0","name":"n","type":"tabby","runtimeConfig":{"ips":["x"]}}`, "K8S_POD_NAME"},
	}
	for _, s := range seeds {
		f.Add(s.cmd, []byte(s.conf), s.args, "c1", "eth0")
	}
	f.Fuzz(func(t *testing.T, cmd string, conf []byte, args, containerID, ifName string) {
		req := &Request{Command: cmd, StdinData: conf, Args: args, ContainerID: containerID, IfName: ifName, Netns: "/var/run/netns/x"}
		nc, a, _, err := parseRequest(req)
		if err != nil {
			var ce *types.Error
			if !errors.As(err, &ce) {
				t.Fatalf("rejection is not a CNI error object: %T %v", err, err)
			}
			return
		}
		if nc == nil {
			t.Fatal("accepted without a configuration")
		}
		if (cmd == "ADD" || cmd == "DEL" || cmd == "CHECK") && a == nil {
			t.Fatalf("%s accepted without arguments", cmd)
		}
	})
}
