package cni

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

// PluginType is the "type" of Tabby's entry in a CNI network configuration,
// and so the name of the plugin binary in the runtime's CNI bin directory.
const PluginType = "tabby"

// DefaultAgentSocket is where the shim finds tabby-agent when the network
// configuration names no agent_socket.
const DefaultAgentSocket = "/var/run/tabby/cni.sock"

// SupportedVersions are the CNI specification versions the plugin speaks.
var SupportedVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// Default deadlines of one request, shim and agent together, when the network
// configuration sets no timeout_seconds.
var defaultTimeouts = map[string]time.Duration{
	"ADD":    30 * time.Second,
	"DEL":    30 * time.Second,
	"CHECK":  15 * time.Second,
	"STATUS": 5 * time.Second,
	"GC":     60 * time.Second,
}

// NetConf is Tabby's network configuration: the standard CNI fields plus the
// plugin's own keys. ParseNetConf fills it in and applies the defaults.
type NetConf struct {
	types.NetConf

	// AgentSocket is the unix socket of tabby-agent (default DefaultAgentSocket).
	AgentSocket string `json:"agent_socket"`
	// MTU of the pod interface; 0 leaves the choice to the agent.
	MTU int `json:"mtu"`
	// TimeoutSeconds bounds one request of any command; 0 selects the
	// per-command default (ADD and DEL 30 s, CHECK 15 s, STATUS 5 s, GC 60 s).
	TimeoutSeconds int `json:"timeout_seconds"`

	// IPv4Pools restricts the pods of this network to these IP pools, each
	// given by name or CIDR; empty = every pool that serves the node. It is
	// read from "ipam": {"ipv4_pools": […]} as in Calico (or from a
	// top-level "ipv4_pools"). ADD fails if one does not exist.
	IPv4Pools []string `json:"ipv4_pools,omitempty"`
	// IPv6Pools is IPv4Pools for IPv6 addresses ("ipam": {"ipv6_pools"}).
	IPv6Pools []string `json:"ipv6_pools,omitempty"`
	// AssignIPv4 and AssignIPv6 say which families a pod of this network
	// gets an address of: IPv4 only unless set (Calico's "ipam":
	// {"assign_ipv4": "true", "assign_ipv6": "true"}, strings or booleans,
	// also accepted at the top level). A dual-stack network sets both.
	AssignIPv4 *FlexBool `json:"assign_ipv4,omitempty"`
	AssignIPv6 *FlexBool `json:"assign_ipv6,omitempty"`

	// FeatureControl turns on features that are off by default, under
	// Calico's key names.
	FeatureControl FeatureControl `json:"feature_control,omitempty"`

	// RuntimeConfig holds the capability arguments the runtime injected
	// (the plugin must declare "ips" and "mac" in its capabilities).
	RuntimeConfig RuntimeConfig `json:"runtimeConfig,omitempty"`
	// ConfArgs is the "args" object of the configuration (CNI conventions).
	ConfArgs *ConfArgs `json:"args,omitempty"`
}

// FlexBool is a boolean written as true/false or, as Calico's network
// configurations do, "true"/"false".
type FlexBool bool

// UnmarshalJSON implements json.Unmarshaler.
func (b *FlexBool) UnmarshalJSON(data []byte) error {
	switch strings.ToLower(strings.Trim(string(data), `"`)) {
	case "true":
		*b = true
	case "false":
		*b = false
	default:
		return fmt.Errorf("%s is not true or false", data)
	}
	return nil
}

// WantsIPv4 reports whether pods of the network get an IPv4 address
// (default yes).
func (c *NetConf) WantsIPv4() bool { return c.AssignIPv4 == nil || bool(*c.AssignIPv4) }

// WantsIPv6 reports whether pods of the network get an IPv6 address
// (default no).
func (c *NetConf) WantsIPv6() bool { return c.AssignIPv6 != nil && bool(*c.AssignIPv6) }

// FeatureControl is the "feature_control" object of the configuration.
type FeatureControl struct {
	// IPAddrsNoIPAM allows a pod's ipAddrsNoIpam annotation: the pod gets
	// the address it names without IPAM. Off by default, as in Calico: any
	// pod that may set the annotation could then claim any address.
	IPAddrsNoIPAM bool `json:"ip_addrs_no_ipam,omitempty"`
}

// RuntimeConfig is the part of "runtimeConfig" that Tabby understands.
type RuntimeConfig struct {
	IPs []string `json:"ips,omitempty"` // "10.244.0.5/32" or "10.244.0.5"
	MAC string   `json:"mac,omitempty"`
}

// ConfArgs is the "args" object of a network configuration as described by
// the CNI conventions: {"cni": {"labels": [{"key": "…", "value": "…"}]}}.
type ConfArgs struct {
	CNI struct {
		Labels []Label `json:"labels,omitempty"`
	} `json:"cni"`
}

// Label is one entry of args.cni.labels.
type Label struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Args is everything the request says about the workload, parsed from
// CNI_ARGS, args.cni.labels and runtimeConfig.
type Args struct {
	PodNamespace     string
	PodName          string
	InfraContainerID string
	Labels           map[string]string
	IPs              []netip.Addr // requested addresses, in order, unmapped
	MAC              string       // requested MAC address, lowercase, or ""
}

// Timeout is the deadline of one request of command cmd ("ADD", …).
func (c *NetConf) Timeout(cmd string) time.Duration {
	if c.TimeoutSeconds > 0 {
		return time.Duration(c.TimeoutSeconds) * time.Second
	}
	if d, ok := defaultTimeouts[cmd]; ok {
		return d
	}
	return defaultTimeouts["ADD"]
}

// CurrentPrevResult is the prevResult converted to the current result
// version, or nil. The server fills it in for CHECK and DEL only.
func (c *NetConf) CurrentPrevResult() *current.Result {
	r, _ := c.PrevResult.(*current.Result)
	return r
}

// MarshalJSON encodes the standard and Tabby fields together. Without it the
// MarshalJSON promoted from the embedded types.NetConf would silently drop
// every Tabby field.
func (c NetConf) MarshalJSON() ([]byte, error) {
	base := c.NetConf
	if base.PrevResult != nil && base.RawPrevResult == nil {
		raw, err := resultToMap(base.PrevResult)
		if err != nil {
			return nil, err
		}
		base.RawPrevResult = raw
	}
	baseJSON, err := json.Marshal(&base)
	if err != nil {
		return nil, err
	}
	extra := struct {
		AgentSocket    string          `json:"agent_socket,omitempty"`
		MTU            int             `json:"mtu,omitempty"`
		TimeoutSeconds int             `json:"timeout_seconds,omitempty"`
		IPv4Pools      []string        `json:"ipv4_pools,omitempty"`
		IPv6Pools      []string        `json:"ipv6_pools,omitempty"`
		AssignIPv4     *FlexBool       `json:"assign_ipv4,omitempty"`
		AssignIPv6     *FlexBool       `json:"assign_ipv6,omitempty"`
		FeatureControl *FeatureControl `json:"feature_control,omitempty"`
		RuntimeConfig  *RuntimeConfig  `json:"runtimeConfig,omitempty"`
		ConfArgs       *ConfArgs       `json:"args,omitempty"`
	}{AgentSocket: c.AgentSocket, MTU: c.MTU, TimeoutSeconds: c.TimeoutSeconds, IPv4Pools: c.IPv4Pools, IPv6Pools: c.IPv6Pools,
		AssignIPv4: c.AssignIPv4, AssignIPv6: c.AssignIPv6, ConfArgs: c.ConfArgs}
	if c.FeatureControl != (FeatureControl{}) {
		extra.FeatureControl = &c.FeatureControl
	}
	if len(c.RuntimeConfig.IPs) > 0 || c.RuntimeConfig.MAC != "" {
		extra.RuntimeConfig = &c.RuntimeConfig
	}
	extraJSON, err := json.Marshal(extra)
	if err != nil {
		return nil, err
	}
	merged := map[string]json.RawMessage{}
	for _, b := range [][]byte{baseJSON, extraJSON} {
		if err := json.Unmarshal(b, &merged); err != nil {
			return nil, err
		}
	}
	return json.Marshal(merged)
}

func resultToMap(r types.Result) (map[string]any, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encoding prevResult: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("encoding prevResult: %w", err)
	}
	return m, nil
}

// ParseNetConf decodes and validates a network configuration (the stdin of
// the plugin) and applies defaults. The prevResult is left unparsed. Errors
// are *types.Error with a CNI error code.
func ParseNetConf(data []byte) (*NetConf, error) {
	conf := &NetConf{}
	if err := json.Unmarshal(data, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decoding network configuration: %v", err), "")
	}
	if conf.AgentSocket == "" {
		conf.AgentSocket = DefaultAgentSocket
	}
	var ipamSection struct {
		IPAM struct {
			IPv4Pools  []string  `json:"ipv4_pools"`
			IPv6Pools  []string  `json:"ipv6_pools"`
			AssignIPv4 *FlexBool `json:"assign_ipv4"`
			AssignIPv6 *FlexBool `json:"assign_ipv6"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(data, &ipamSection); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decoding network configuration: ipam: %v", err), "")
	}
	var problems []string
	for _, f := range []struct {
		key      string
		fromIPAM []string
		top      *[]string
	}{{"ipv4_pools", ipamSection.IPAM.IPv4Pools, &conf.IPv4Pools}, {"ipv6_pools", ipamSection.IPAM.IPv6Pools, &conf.IPv6Pools}} {
		switch {
		case len(f.fromIPAM) == 0:
		case len(*f.top) == 0:
			*f.top = f.fromIPAM
		case !slices.Equal(f.fromIPAM, *f.top):
			problems = append(problems, fmt.Sprintf("ipam.%s %v and %s %v disagree; give one", f.key, f.fromIPAM, f.key, *f.top))
		}
	}
	for _, f := range []struct {
		key      string
		fromIPAM *FlexBool
		top      **FlexBool
	}{{"assign_ipv4", ipamSection.IPAM.AssignIPv4, &conf.AssignIPv4}, {"assign_ipv6", ipamSection.IPAM.AssignIPv6, &conf.AssignIPv6}} {
		switch {
		case f.fromIPAM == nil:
		case *f.top == nil:
			*f.top = f.fromIPAM
		case **f.top != *f.fromIPAM:
			problems = append(problems, fmt.Sprintf("ipam.%s and %s disagree; give one", f.key, f.key))
		}
	}
	if !supportedVersion(conf.CNIVersion) {
		return nil, types.NewError(types.ErrIncompatibleCNIVersion, "incompatible CNI versions",
			fmt.Sprintf("network configuration has cniVersion %q; tabby supports %s",
				conf.CNIVersion, strings.Join(SupportedVersions, ", ")))
	}
	if conf.Name == "" {
		problems = append(problems, "name is missing")
	}
	if conf.Type != PluginType {
		problems = append(problems, fmt.Sprintf("type is %q, want %q", conf.Type, PluginType))
	}
	if !filepath.IsAbs(conf.AgentSocket) {
		problems = append(problems, fmt.Sprintf("agent_socket %q is not an absolute path", conf.AgentSocket))
	}
	if conf.MTU != 0 && (conf.MTU < 68 || conf.MTU > 65535) {
		problems = append(problems, fmt.Sprintf("mtu %d is outside 68..65535", conf.MTU))
	}
	if conf.TimeoutSeconds < 0 {
		problems = append(problems, fmt.Sprintf("timeout_seconds %d is negative", conf.TimeoutSeconds))
	}
	for _, p := range conf.IPv4Pools {
		if msg := checkPoolRef(p, false); msg != "" {
			problems = append(problems, "ipv4_pools: "+msg)
		}
	}
	for _, p := range conf.IPv6Pools {
		if msg := checkPoolRef(p, true); msg != "" {
			problems = append(problems, "ipv6_pools: "+msg)
		}
	}
	if !conf.WantsIPv4() && !conf.WantsIPv6() {
		problems = append(problems, "assign_ipv4 and assign_ipv6 are both false: a pod would get no address")
	}
	if len(problems) > 0 {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "invalid tabby network configuration", strings.Join(problems, "; "))
	}
	return conf, nil
}

// checkPoolRef says what is wrong with an ipv4_pools (ipv6_pools, when
// is6) entry: a pool name or a CIDR of the family. Whether the pool exists
// is the agent's question.
func checkPoolRef(p string, is6 bool) string {
	if strings.Contains(p, "/") {
		pfx, err := netip.ParsePrefix(p)
		switch {
		case err != nil:
			return fmt.Sprintf("%q is not a CIDR: %v", p, err)
		case pfx.Addr().Is6() != is6:
			if is6 {
				return fmt.Sprintf("%q is not an IPv6 CIDR", p)
			}
			return fmt.Sprintf("%q is not an IPv4 CIDR", p)
		case pfx.Masked() != pfx:
			return fmt.Sprintf("%q has host bits set (the pool is %s)", p, pfx.Masked())
		}
		return ""
	}
	if p == "" || strings.TrimSpace(p) != p || len(p) > 253 {
		return fmt.Sprintf("%q is not a pool name", p)
	}
	return ""
}

func supportedVersion(v string) bool {
	for _, s := range SupportedVersions {
		if s == v {
			return true
		}
	}
	return false
}

// k8sArgs is the CNI_ARGS a Kubernetes runtime passes. Its fields are named
// exactly like the keys because types.LoadArgs looks them up by field name.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString //nolint:revive // named after the key
	K8S_POD_NAME               types.UnmarshallableString //nolint:revive
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString //nolint:revive
}

// ParseArgs parses CNI_ARGS ("K=V;K=V", unknown keys are an error unless
// IgnoreUnknown=1) and the labels, IPs and MAC of the configuration. Errors
// are *types.Error with a CNI error code.
func ParseArgs(conf *NetConf, cniArgs string) (*Args, error) {
	var ka k8sArgs
	if err := types.LoadArgs(cniArgs, &ka); err != nil {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, "invalid CNI_ARGS", err.Error())
	}
	a := &Args{
		PodNamespace:     string(ka.K8S_POD_NAMESPACE),
		PodName:          string(ka.K8S_POD_NAME),
		InfraContainerID: string(ka.K8S_POD_INFRA_CONTAINER_ID),
	}
	var problems []string
	if conf.ConfArgs != nil {
		for _, l := range conf.ConfArgs.CNI.Labels {
			if l.Key == "" {
				problems = append(problems, fmt.Sprintf("args.cni.labels has an empty key (value %q)", l.Value))
				continue
			}
			if _, dup := a.Labels[l.Key]; dup {
				problems = append(problems, fmt.Sprintf("args.cni.labels has key %q twice", l.Key))
				continue
			}
			if a.Labels == nil {
				a.Labels = map[string]string{}
			}
			a.Labels[l.Key] = l.Value
		}
	}
	seen := map[netip.Addr]bool{}
	for _, s := range conf.RuntimeConfig.IPs {
		addr, err := parseIP(s)
		if err != nil {
			problems = append(problems, fmt.Sprintf("runtimeConfig.ips: %v", err))
			continue
		}
		if seen[addr] {
			problems = append(problems, fmt.Sprintf("runtimeConfig.ips has %s twice", addr))
			continue
		}
		seen[addr] = true
		a.IPs = append(a.IPs, addr)
	}
	if conf.RuntimeConfig.MAC != "" {
		hw, err := net.ParseMAC(conf.RuntimeConfig.MAC)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("runtimeConfig.mac: %v", err))
		case len(hw) != 6:
			problems = append(problems, fmt.Sprintf("runtimeConfig.mac %q is not a 48-bit MAC address", conf.RuntimeConfig.MAC))
		default:
			a.MAC = hw.String()
		}
	}
	if len(problems) > 0 {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "invalid workload arguments", strings.Join(problems, "; "))
	}
	return a, nil
}

// parseIP accepts "10.244.0.5/32" as well as "10.244.0.5"; the prefix length
// is dropped because Tabby gives every workload address a /32 (or /128).
func parseIP(s string) (netip.Addr, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("parsing %q: %w", s, err)
		}
		return p.Addr().Unmap(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("parsing %q: %w", s, err)
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("parsing %q: zones are not allowed", s)
	}
	return a.Unmap(), nil
}

// commandMinVersion is the first spec version that has each command.
var commandMinVersion = map[string]string{
	"ADD":    "0.3.0",
	"DEL":    "0.3.0",
	"CHECK":  "0.4.0",
	"STATUS": "1.1.0",
	"GC":     "1.1.0",
}

// parseRequest is the parsing the shim and the server share: command,
// configuration, arguments and (for CHECK and DEL) the prevResult converted
// to the current result version.
func parseRequest(req *Request) (*NetConf, *Args, *current.Result, error) {
	minVer, ok := commandMinVersion[req.Command]
	if !ok {
		return nil, nil, nil, types.NewError(types.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("unknown CNI command %q", req.Command), "")
	}
	conf, err := ParseNetConf(req.StdinData)
	if err != nil {
		return nil, nil, nil, err
	}
	if ok, _ := version.GreaterThanOrEqualTo(conf.CNIVersion, minVer); !ok {
		return nil, nil, nil, types.NewError(types.ErrIncompatibleCNIVersion,
			fmt.Sprintf("config version %s does not allow %s", conf.CNIVersion, req.Command),
			fmt.Sprintf("%s needs cniVersion %s or later", req.Command, minVer))
	}
	switch req.Command {
	case "STATUS", "GC":
		return conf, nil, nil, nil
	}
	if req.ContainerID == "" {
		return nil, nil, nil, types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_CONTAINERID is missing", "")
	}
	args, err := ParseArgs(conf, req.Args)
	if err != nil {
		return nil, nil, nil, err
	}
	var prev *current.Result
	switch req.Command {
	case "ADD":
		// Tabby is the first plugin of a chain: there is no prevResult to use.
		conf.RawPrevResult = nil
	case "CHECK", "DEL":
		prev, err = parsePrevResult(conf)
		if err != nil {
			if req.Command == "CHECK" {
				return nil, nil, nil, err
			}
			// A DEL must not get stuck on a damaged cache entry: it works
			// without the prevResult.
			prev = nil
		}
		if req.Command == "CHECK" && prev == nil {
			return nil, nil, nil, types.NewError(types.ErrInvalidNetworkConfig, "CHECK needs a prevResult",
				"the runtime passed no prevResult in the network configuration")
		}
		conf.RawPrevResult, conf.PrevResult = nil, nil
		if prev != nil { // not a typed nil in the interface
			conf.PrevResult = prev
		}
	}
	return conf, args, prev, nil
}

func parsePrevResult(conf *NetConf) (*current.Result, error) {
	if conf.RawPrevResult == nil {
		return nil, nil
	}
	if err := version.ParsePrevResult(&conf.NetConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decoding prevResult", err.Error())
	}
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "converting prevResult to the current version", err.Error())
	}
	return prev, nil
}
