package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

// CNIRequest is one runtime call of a network configuration list, the body
// of `tabby-lab cni add|del|check`.
type CNIRequest struct {
	Command     string // add, del, check
	Conflist    string // path of the .conflist
	NetNS       string // path of the pod's network namespace
	ContainerID string
	IfName      string
	CNIPath     []string // plugin directories
	CacheDir    string
	Args        [][2]string       // CNI_ARGS pairs
	Labels      map[string]string // injected as args.cni.labels into every plugin
}

// RunCNI calls the plugins of the configuration list through libcni, as a
// container runtime does, and returns the result of ADD as JSON (nothing
// for DEL and CHECK). It runs in the calling process's network namespace,
// which must be the node's.
func RunCNI(ctx context.Context, r CNIRequest) ([]byte, error) {
	raw, err := os.ReadFile(r.Conflist)
	if err != nil {
		return nil, fmt.Errorf("reading CNI configuration: %w", err)
	}
	if len(r.Labels) > 0 {
		if raw, err = injectLabels(raw, r.Labels); err != nil {
			return nil, err
		}
	}
	list, err := libcni.ConfListFromBytes(raw)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", r.Conflist, err)
	}
	cfg := libcni.NewCNIConfigWithCacheDir(r.CNIPath, r.CacheDir, nil)
	rt := &libcni.RuntimeConf{ContainerID: r.ContainerID, NetNS: r.NetNS, IfName: r.IfName, Args: r.Args}
	switch r.Command {
	case "add":
		res, err := cfg.AddNetworkList(ctx, list, rt)
		if err != nil {
			return nil, fmt.Errorf("CNI ADD: %w", err)
		}
		b, err := json.Marshal(res)
		if err != nil {
			return nil, fmt.Errorf("encoding CNI result: %w", err)
		}
		return b, nil
	case "del":
		if err := cfg.DelNetworkList(ctx, list, rt); err != nil {
			return nil, fmt.Errorf("CNI DEL: %w", err)
		}
		return nil, nil
	case "check":
		if err := cfg.CheckNetworkList(ctx, list, rt); err != nil {
			return nil, fmt.Errorf("CNI CHECK: %w", err)
		}
		return nil, nil
	}
	return nil, fmt.Errorf("unknown CNI command %q (want add, del or check)", r.Command)
}

// injectLabels adds {"args":{"cni":{"labels":[…]}}} to every plugin of a
// configuration list, as the CNI conventions let a runtime pass labels.
func injectLabels(raw []byte, labels map[string]string) ([]byte, error) {
	var conf map[string]any
	if err := json.Unmarshal(raw, &conf); err != nil {
		return nil, fmt.Errorf("decoding CNI configuration: %w", err)
	}
	var ls []map[string]string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		ls = append(ls, map[string]string{"key": k, "value": labels[k]})
	}
	plugins, _ := conf["plugins"].([]any)
	for _, p := range plugins {
		if pm, ok := p.(map[string]any); ok {
			pm["args"] = map[string]any{"cni": map[string]any{"labels": ls}}
		}
	}
	return json.Marshal(conf)
}

// ParseCNIArgs reads "K=V;K=V".
func ParseCNIArgs(s string) ([][2]string, error) {
	var out [][2]string
	for _, kv := range strings.Split(s, ";") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("CNI argument %q: want K=V", kv)
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}
