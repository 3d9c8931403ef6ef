package datastore

import (
	stdjson "encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
)

// decodeSamples are records as etcd may hold them, written by Tabby or
// around it: each must decode exactly as encoding/json decodes it.
var decodeSamples = []struct{ kind, data string }{
	{api.KindWorkloadEndpoint, `{"apiVersion":"tabby.dev/v1","kind":"WorkloadEndpoint","metadata":{"name":"n1-k8s-web-1-eth0","namespace":"default","labels":{"app":"web","tier":"frontend"},"annotations":{"tabby.dev/origin":"kubernetes"}},"spec":{"node":"n1","orchestrator":"k8s","pod":"web-1","containerID":"abc","endpoint":"eth0","interfaceName":"cali0123","mac":"0e:11:22:33:44:55","ipNetworks":["10.244.3.4/32"],"ipamHandle":"h","namespaceLabels":{"kubernetes.io/metadata.name":"default"},"ports":[{"name":"http","protocol":"TCP","port":80}]}}`},
	{api.KindWorkloadEndpoint, `{"metadata":{"name":"x","labels":{"a\u00e9":"b\"c","k":"v\n"}},"spec":{"node":"n"}}`},
	{api.KindWorkloadEndpoint, `{"metadata":{"name":"x","labels":{"a":"\xff\xfe","b":"ok"}},"spec":{}}`},
	{api.KindWorkloadEndpoint, `{"METADATA":{"Name":"x","LABELS":{"a":"1"}},"Spec":{"NODE":"n"}}`},
	{api.KindWorkloadEndpoint, `{"metadata":{"name":"x","labels":{"a":"1","a":"2"}},"metadata":{"name":"y"}}`},
	{api.KindWorkloadEndpoint, `{"metadata":{"name":"x","labels":null,"annotations":{}},"spec":{"namespaceLabels":{"a":null}}}`},
	{api.KindWorkloadEndpoint, `{"metadata":{"name":"x","labels":{"a":1}}}`},
	{api.KindWorkloadEndpoint, `{"metadata":{"name":"x","labels":["a"]}}`},
	{api.KindWorkloadEndpoint, `{"metadata":{"name":"x","labels":{"a":"b"`},
	{api.KindWorkloadEndpoint, `{"metadata":{"name":"x"},"spec":{"ports":[{"port":70000}]}}`},
	{api.KindWorkloadEndpoint, `{"unknown":{"deep":[1,2,3]},"metadata":{"name":"x","creationTimestamp":"2026-01-02T03:04:05Z"}}`},
	{api.KindWorkloadEndpoint, `not json`},
	{api.KindWorkloadEndpoint, ``},
	{api.KindNetworkPolicy, `{"metadata":{"name":"p","namespace":"default"},"spec":{"selector":"app == 'web'","ingress":[{"action":"Allow","source":{"selector":"all()"}}]}}`},
	{api.KindBGPConfiguration, `{"metadata":{"name":"default"},"spec":{"asNumber":64512,"nodeToNodeMeshEnabled":true}}`},
}

func TestUnmarshalRecordAsEncodingJSON(t *testing.T) {
	samples := decodeSamples
	if ex, err := os.ReadFile("../api/testdata/examples.yaml"); err == nil {
		objs, err := api.Decode(ex)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			b, _ := stdjson.Marshal(o)
			samples = append(samples, struct{ kind, data string }{api.KindOf(o), string(b)})
		}
	}
	for _, s := range samples {
		checkAsEncodingJSON(t, s.kind, []byte(s.data))
	}
}

func checkAsEncodingJSON(t *testing.T, kind string, data []byte) {
	t.Helper()
	want, _ := api.New(kind)
	got, _ := api.New(kind)
	werr := stdjson.Unmarshal(data, want)
	gerr := unmarshalRecord(data, got)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("%s %q: error %v, encoding/json's %v", kind, data, gerr, werr)
	}
	if werr != nil {
		return
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("%s %q: decoded otherwise than by encoding/json (-want +got):\n%s", kind, data, d)
	}
}

func FuzzUnmarshalRecord(f *testing.F) {
	for _, s := range decodeSamples {
		f.Add(s.data)
	}
	f.Fuzz(func(t *testing.T, data string) {
		for _, kind := range []string{api.KindWorkloadEndpoint, api.KindNetworkPolicy} {
			checkAsEncodingJSON(t, kind, []byte(data))
		}
	})
}

// Interned strings are shared, the table stays bounded, and long strings
// are not kept.
func TestInternTable(t *testing.T) {
	var tab internTable
	a, b := tab.intern([]byte("app")), tab.intern([]byte("app"))
	if unsafe.StringData(a) != unsafe.StringData(b) || tab.internString("app") != a {
		t.Errorf("equal strings not shared")
	}
	for i := range 3 * internMax {
		tab.intern([]byte(strconv.Itoa(i)))
		if len(tab.m) > internMax {
			t.Fatalf("table holds %d strings, bound %d", len(tab.m), internMax)
		}
	}
	long := strings.Repeat("x", internMaxLen+1)
	if tab.intern([]byte(long)); len(tab.m) > 0 && tab.m[long] != "" {
		t.Errorf("a string longer than %d bytes was kept", internMaxLen)
	}
}
