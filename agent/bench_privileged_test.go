package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
)

// BenchmarkPrivilegedCNIAddDel measures CNI ADD and DEL latency of Tabby and,
// in the same run and the same kind of node namespace, of the reference
// ptp + host-local plugins from Debian's containernetworking-plugins. Both
// are executed through libcni from a thread inside the node namespace, as a
// runtime on that node would. Run with -benchtime=50x or more; it reports
// medians and p99s.
//
//	go test -run '^$' -bench PrivilegedCNIAddDel -benchtime 100x ./agent
func BenchmarkPrivilegedCNIAddDel(b *testing.B) {
	requireRoot(b)
	if _, err := os.Stat("/usr/lib/cni/ptp"); err != nil {
		b.Skip("reference plugins not installed (Debian package containernetworking-plugins)")
	}
	b.Run("tabby", func(b *testing.B) {
		e := newNodeEnv(b)
		list := e.conflistChain(b, "1.0.0", false)
		benchAddDel(b, e.nodePath, e.cni, list)
	})
	b.Run("ptp+host-local", func(b *testing.B) {
		_, nodePath := newNetNS(b, "tabby-bref")
		conf, err := json.Marshal(map[string]any{
			"cniVersion": "1.0.0", "name": "ref",
			"plugins": []map[string]any{{
				"type": "ptp", "mtu": 1500,
				"ipam": map[string]any{"type": "host-local", "subnet": "10.244.200.0/24", "dataDir": b.TempDir(),
					"routes": []map[string]string{{"dst": "0.0.0.0/0"}}},
			}},
		})
		if err != nil {
			b.Fatal(err)
		}
		list, err := libcni.ConfListFromBytes(conf)
		if err != nil {
			b.Fatal(err)
		}
		cfg := libcni.NewCNIConfigWithCacheDir([]string{"/usr/lib/cni"}, b.TempDir(), nil)
		benchAddDel(b, nodePath, cfg, list)
	})
}

// benchAddDel adds and deletes b.N pods, one at a time, from inside nodePath.
func benchAddDel(b *testing.B, nodePath string, cfg *libcni.CNIConfig, list *libcni.NetworkConfigList) {
	ctx := context.Background()
	pods := make([]string, b.N)
	for i := range b.N {
		_, pods[i] = newNetNS(b, "tabby-bp")
	}
	adds := make([]time.Duration, 0, b.N)
	dels := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	err := ns.WithNetNSPath(nodePath, func(ns.NetNS) error {
		for i := range b.N {
			rt := podRT(fmt.Sprintf("bench-%d", i), pods[i], fmt.Sprintf("bench-%d", i))
			start := time.Now()
			if _, err := cfg.AddNetworkList(ctx, list, rt); err != nil {
				return fmt.Errorf("ADD %d: %w", i, err)
			}
			adds = append(adds, time.Since(start))
			start = time.Now()
			if err := cfg.DelNetworkList(ctx, list, rt); err != nil {
				return fmt.Errorf("DEL %d: %w", i, err)
			}
			dels = append(dels, time.Since(start))
		}
		return nil
	})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(ms(quantile(adds, 0.5)), "add-p50-ms")
	b.ReportMetric(ms(quantile(adds, 0.99)), "add-p99-ms")
	b.ReportMetric(ms(quantile(dels, 0.5)), "del-p50-ms")
	b.ReportMetric(ms(quantile(dels, 0.99)), "del-p99-ms")
}

func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
