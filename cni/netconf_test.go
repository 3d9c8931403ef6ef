package cni

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"
)

var addrCmp = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

func mustAddrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestParseNetConfDefaults(t *testing.T) {
	conf, err := ParseNetConf([]byte(`{"cniVersion":"1.0.0","name":"k8s","type":"tabby"}`))
	if err != nil {
		t.Fatal(err)
	}
	if conf.AgentSocket != DefaultAgentSocket {
		t.Errorf("agent socket %q, want %q", conf.AgentSocket, DefaultAgentSocket)
	}
	for cmd, want := range map[string]time.Duration{"ADD": 30 * time.Second, "DEL": 30 * time.Second, "CHECK": 15 * time.Second, "STATUS": 5 * time.Second, "GC": time.Minute} {
		if got := conf.Timeout(cmd); got != want {
			t.Errorf("Timeout(%s) = %s, want %s", cmd, got, want)
		}
	}
	conf.TimeoutSeconds = 3
	if got := conf.Timeout("GC"); got != 3*time.Second {
		t.Errorf("Timeout(GC) with timeout_seconds 3 = %s", got)
	}
}

func TestParseNetConfErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want *types.Error
	}{
		{"not json", `{"cniVersion":`, &types.Error{Code: 6, Msg: "decoding network configuration: unexpected end of JSON input"}},
		{"no version", `{"name":"k8s","type":"tabby"}`, &types.Error{Code: 1, Msg: "incompatible CNI versions",
			Details: `network configuration has cniVersion ""; tabby supports 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0`}},
		{"every problem at once", `{"cniVersion":"1.1.0","type":"bridge","agent_socket":"run/cni.sock","mtu":70000}`,
			&types.Error{Code: 7, Msg: "invalid tabby network configuration",
				Details: `name is missing; type is "bridge", want "tabby"; agent_socket "run/cni.sock" is not an absolute path; mtu 70000 is outside 68..65535`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseNetConf([]byte(tt.in))
			got, _ := err.(*types.Error)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseNetConfPools(t *testing.T) {
	const head = `{"cniVersion":"1.0.0","name":"k8s","type":"tabby",`
	tests := []struct {
		name, in string
		want     []string
		problem  string
	}{
		{"none", `"ipam":{"type":"x"}}`, nil, ""},
		{"in the ipam section, as Calico", `"ipam":{"ipv4_pools":["blue","10.244.0.0/24"]}}`, []string{"blue", "10.244.0.0/24"}, ""},
		{"top level", `"ipv4_pools":["blue"]}`, []string{"blue"}, ""},
		{"both, agreeing", `"ipv4_pools":["blue"],"ipam":{"ipv4_pools":["blue"]}}`, []string{"blue"}, ""},
		{"both, disagreeing", `"ipv4_pools":["blue"],"ipam":{"ipv4_pools":["red"]}}`, nil,
			"ipam.ipv4_pools [red] and ipv4_pools [blue] disagree; give one"},
		{"host bits", `"ipam":{"ipv4_pools":["10.244.0.1/24"]}}`, nil, `ipv4_pools: "10.244.0.1/24" has host bits set (the pool is 10.244.0.0/24)`},
		{"not a CIDR", `"ipam":{"ipv4_pools":["10.244.0.0/33"]}}`, nil, `ipv4_pools: "10.244.0.0/33" is not a CIDR`},
		{"IPv6", `"ipam":{"ipv4_pools":["fd00::/64"]}}`, nil, `ipv4_pools: "fd00::/64" is not an IPv4 CIDR`},
		{"empty name", `"ipam":{"ipv4_pools":[""]}}`, nil, `ipv4_pools: "" is not a pool name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conf, err := ParseNetConf([]byte(head + tt.in))
			if tt.problem != "" {
				e, _ := err.(*types.Error)
				if e == nil || e.Code != types.ErrInvalidNetworkConfig || len(e.Details) < len(tt.problem) || e.Details[:len(tt.problem)] != tt.problem {
					t.Fatalf("error %v, want details starting %q", err, tt.problem)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, conf.IPv4Pools); diff != "" {
				t.Errorf("pools (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseNetConfFamilies(t *testing.T) {
	const head = `{"cniVersion":"1.0.0","name":"k8s","type":"tabby",`
	tests := []struct {
		name, in string
		v4, v6   bool
		pools6   []string
		problem  string
	}{
		{"default: IPv4 only", `"ipam":{"type":"x"}}`, true, false, nil, ""},
		{"dual stack, Calico's strings", `"ipam":{"assign_ipv4":"true","assign_ipv6":"true","ipv6_pools":["fd00:10:244::/48","v6"]}}`, true, true, []string{"fd00:10:244::/48", "v6"}, ""},
		{"IPv6 only, booleans at the top level", `"assign_ipv4":false,"assign_ipv6":true}`, false, true, nil, ""},
		{"neither", `"ipam":{"assign_ipv4":"false"}}`, false, false, nil, "assign_ipv4 and assign_ipv6 are both false"},
		{"not a boolean", `"ipam":{"assign_ipv6":"yes"}}`, false, false, nil, "decoding"},
		{"disagreeing", `"assign_ipv6":true,"ipam":{"assign_ipv6":"false"}}`, false, false, nil, "ipam.assign_ipv6 and assign_ipv6 disagree"},
		{"IPv4 CIDR in ipv6_pools", `"ipam":{"ipv6_pools":["10.244.0.0/24"]}}`, false, false, nil, `ipv6_pools: "10.244.0.0/24" is not an IPv6 CIDR`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conf, err := ParseNetConf([]byte(head + tt.in))
			if tt.problem != "" {
				if err == nil || !strings.Contains(err.Error(), tt.problem) {
					t.Fatalf("error %v, want one saying %q", err, tt.problem)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if conf.WantsIPv4() != tt.v4 || conf.WantsIPv6() != tt.v6 || !slices.Equal(conf.IPv6Pools, tt.pools6) {
				t.Errorf("IPv4 %v, IPv6 %v, ipv6_pools %v; want %v, %v, %v", conf.WantsIPv4(), conf.WantsIPv6(), conf.IPv6Pools, tt.v4, tt.v6, tt.pools6)
			}
			// The agent gets the configuration through the shim: the
			// families survive the round trip.
			b, err := json.Marshal(conf)
			if err != nil {
				t.Fatal(err)
			}
			again, err := parseRequestForTest(b)
			if err != nil || again.WantsIPv4() != tt.v4 || again.WantsIPv6() != tt.v6 || !slices.Equal(again.IPv6Pools, tt.pools6) {
				t.Errorf("after the round trip %s: %+v, %v", b, again, err)
			}
		})
	}
}

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name    string
		cniArgs string
		conf    string // JSON keys added to a valid configuration
		want    *Args
		wantErr *types.Error
	}{
		{name: "empty", want: &Args{}},
		{name: "kubernetes", cniArgs: "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=nginx-1;K8S_POD_INFRA_CONTAINER_ID=abc123;K8S_POD_UID=9f",
			want: &Args{PodNamespace: "default", PodName: "nginx-1", InfraContainerID: "abc123"}},
		{name: "unknown key without IgnoreUnknown", cniArgs: "K8S_POD_NAME=x;FOO=bar",
			wantErr: &types.Error{Code: 4, Msg: "invalid CNI_ARGS", Details: `ARGS: unknown args ["FOO=bar"]`}},
		{name: "malformed pair", cniArgs: "K8S_POD_NAME",
			wantErr: &types.Error{Code: 4, Msg: "invalid CNI_ARGS", Details: `ARGS: invalid pair "K8S_POD_NAME"`}},
		{name: "labels", conf: `"args":{"cni":{"labels":[{"key":"app","value":"web"},{"key":"tier","value":""}]}}`,
			want: &Args{Labels: map[string]string{"app": "web", "tier": ""}}},
		{name: "other args keys are ignored", conf: `"args":{"cni":{"labels":[{"key":"a","value":"b"}],"ips":["10.0.0.1"]},"other":1}`,
			want: &Args{Labels: map[string]string{"a": "b"}}},
		{name: "ips with and without mask", conf: `"runtimeConfig":{"ips":["10.244.0.5/32","10.244.3.9","fd00::5/128","::ffff:10.244.0.6"]}`,
			want: &Args{IPs: mustAddrs("10.244.0.5", "10.244.3.9", "fd00::5", "10.244.0.6")}},
		{name: "mac is normalised", conf: `"runtimeConfig":{"mac":"0A-58-0A-F4-00-05"}`,
			want: &Args{MAC: "0a:58:0a:f4:00:05"}},
		{name: "bad workload arguments, all reported", conf: `"args":{"cni":{"labels":[{"key":"","value":"x"},{"key":"a","value":"1"},{"key":"a","value":"2"}]}},` +
			`"runtimeConfig":{"ips":["10.244.0.300","10.244.0.5","10.244.0.5/32"],"mac":"00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01"}`,
			wantErr: &types.Error{Code: 7, Msg: "invalid workload arguments", Details: `args.cni.labels has an empty key (value "x"); ` +
				`args.cni.labels has key "a" twice; ` +
				`runtimeConfig.ips: parsing "10.244.0.300": ParseAddr("10.244.0.300"): IPv4 field has value >255; ` +
				`runtimeConfig.ips has 10.244.0.5 twice; ` +
				`runtimeConfig.mac "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01" is not a 48-bit MAC address`}},
		{name: "bad mac", conf: `"runtimeConfig":{"mac":"nope"}`,
			wantErr: &types.Error{Code: 7, Msg: "invalid workload arguments", Details: "runtimeConfig.mac: address nope: invalid MAC address"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := `{"cniVersion":"1.0.0","name":"k8s","type":"tabby"`
			if tt.conf != "" {
				in += "," + tt.conf
			}
			conf, err := ParseNetConf([]byte(in + "}"))
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseArgs(conf, tt.cniArgs)
			gotErr, _ := err.(*types.Error)
			if err != nil && gotErr == nil {
				t.Fatalf("error %v is a %T, want *types.Error", err, err)
			}
			if diff := cmp.Diff(tt.wantErr, gotErr); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.want, got, addrCmp); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
		})
	}
}

// A NetConf must survive json.Marshal with its Tabby fields and its parsed
// prevResult, which the embedded types.NetConf's MarshalJSON would drop.
func TestNetConfMarshalRoundTrip(t *testing.T) {
	in := `{"cniVersion":"1.0.0","name":"k8s","type":"tabby","agent_socket":"/run/t.sock","mtu":1440,"timeout_seconds":9,` +
		`"ipam":{"type":"tabby-ipam","ipv4_pools":["10.244.0.0/24","blue"]},` +
		`"feature_control":{"ip_addrs_no_ipam":true},"capabilities":{"ips":true},"runtimeConfig":{"ips":["10.244.0.5"]},"args":{"cni":{"labels":[{"key":"app","value":"db"}]}}}`
	conf, err := ParseNetConf([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if !conf.FeatureControl.IPAddrsNoIPAM {
		t.Fatalf("feature_control.ip_addrs_no_ipam not parsed: %+v", conf.FeatureControl)
	}
	conf.PrevResult = testResult("eth0", "10.244.0.5")
	b, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	again, err := parseRequestForTest(b)
	if err != nil {
		t.Fatalf("re-parsing %s: %v", b, err)
	}
	if again.PrevResult == nil {
		t.Fatalf("prevResult lost: %s", b)
	}
	again.PrevResult, conf.PrevResult = nil, nil
	if diff := cmp.Diff(conf, again); diff != "" {
		t.Errorf("after marshal and parse (-want +got):\n%s", diff)
	}
}

func parseRequestForTest(stdin []byte) (*NetConf, error) {
	conf, _, _, err := parseRequest(&Request{Command: "DEL", ContainerID: "c1", StdinData: stdin})
	return conf, err
}
