package manifests

import (
	"net/netip"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tabbynet/tabby/agent"
	"github.com/tabbynet/tabby/agent/installcni"
	"github.com/tabbynet/tabby/cni"
)

const (
	namespace = "tabby-system"
	dsName    = "tabby-node"
	saName    = "tabby-node"
	cmName    = "tabby-config"
	secName   = "tabby-etcd-secrets"
)

func daemonSet(t *testing.T) (*objects, *appsv1.DaemonSet, *corev1.PodSpec) {
	t.Helper()
	o := loadManifests(t)
	ds := find[*appsv1.DaemonSet](t, o, dsName)
	return o, ds, &ds.Spec.Template.Spec
}

func container(t *testing.T, cs []corev1.Container, name string) *corev1.Container {
	t.Helper()
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

func TestDaemonSetNodeAgentInvariants(t *testing.T) {
	o, ds, pod := daemonSet(t)
	if ds.Namespace != namespace {
		t.Errorf("namespace %q, want %q", ds.Namespace, namespace)
	}
	if !pod.HostNetwork {
		t.Error("hostNetwork is off: the agent must run in the node's network namespace")
	}
	if pod.HostPID {
		// The agent reaches pod namespaces through /var/run/netns.
		t.Error("hostPID is on, but the agent does not need the host's PID namespace")
	}
	if pod.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q, want system-node-critical", pod.PriorityClassName)
	}
	if !slices.ContainsFunc(pod.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Operator == corev1.TolerationOpExists && tol.Key == "" && tol.Effect == "" && tol.TolerationSeconds == nil
	}) {
		t.Errorf("tolerations %+v do not tolerate every taint (want {operator: Exists})", pod.Tolerations)
	}
	if pod.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("nodeSelector %v, want kubernetes.io/os: linux", pod.NodeSelector)
	}

	us := ds.Spec.UpdateStrategy
	if us.Type != appsv1.RollingUpdateDaemonSetStrategyType || us.RollingUpdate == nil ||
		us.RollingUpdate.MaxUnavailable == nil || *us.RollingUpdate.MaxUnavailable != intstr.FromInt32(1) {
		t.Errorf("updateStrategy %+v, want RollingUpdate with maxUnavailable 1", us)
	}
	if ds.Spec.Selector == nil {
		t.Fatal("no selector")
	}
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the template's labels %v", k, v, ds.Spec.Template.Labels)
		}
	}

	if pod.ServiceAccountName != saName {
		t.Errorf("serviceAccountName %q, want %q", pod.ServiceAccountName, saName)
	}
	sa := find[*corev1.ServiceAccount](t, o, saName)
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken ||
		pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the API token is mounted, but the agent never calls the Kubernetes API")
	}

	main := container(t, pod.Containers, "tabby-node")
	if len(pod.Containers) != 1 {
		t.Errorf("%d containers, want 1", len(pod.Containers))
	}
	if sc := main.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Error("the agent container is not privileged")
	}
	if r := main.Resources.Requests; r.Cpu().IsZero() || r.Memory().IsZero() {
		t.Errorf("resource requests %v: want cpu and memory", r)
	}
	if l := main.Resources.Limits; l.Cpu() != nil && !l.Cpu().IsZero() {
		t.Errorf("cpu limit %v would throttle the node's router", l.Cpu())
	}
	ic := container(t, pod.InitContainers, "install-cni")
	if ic.Image != main.Image || ic.Image == "" {
		t.Errorf("images %q (install-cni) and %q (agent): want one image carrying both binaries", ic.Image, main.Image)
	}
	if env := envOf(t, main, "NODENAME"); env.ValueFrom == nil || env.ValueFrom.FieldRef == nil || env.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODENAME = %+v, want the downward API's spec.nodeName", env)
	}
}

func envOf(t *testing.T, c *corev1.Container, name string) corev1.EnvVar {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			return e
		}
	}
	t.Fatalf("container %s has no env %s", c.Name, name)
	return corev1.EnvVar{}
}

// flagValue returns the value of --name=value or --name value in args.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// contractFlags are the agent's flags as docs/contracts.md documents them.
func contractFlags(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../docs/contracts.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "## tabby-agent command line")
	if !ok {
		t.Fatal(`docs/contracts.md has no "tabby-agent command line" section`)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	var out []string
	for _, m := range regexp.MustCompile(`--[a-z0-9-]+`).FindAllString(sec, -1) {
		out = append(out, strings.TrimPrefix(m, "--"))
	}
	return out
}

// TestDaemonSetAgentCommandLine: the agent's flags exist, and the probes
// reach its health endpoints where --http-listen puts them.
func TestDaemonSetAgentCommandLine(t *testing.T) {
	_, _, pod := daemonSet(t)
	main := container(t, pod.Containers, "tabby-node")
	if len(main.Command) == 0 || main.Command[0] != "tabby-agent" {
		t.Fatalf("command %v, want tabby-agent", main.Command)
	}
	argv := slices.Concat(main.Command[1:], main.Args)
	known := contractFlags(t)
	for _, a := range argv {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if strings.HasPrefix(a, "--") && !slices.Contains(known, name) {
			t.Errorf("agent flag %s is not in docs/contracts.md (known: %v)", a, known)
		}
	}

	listen, ok := flagValue(argv, "http-listen")
	if !ok {
		listen = agent.Default().HTTPListen.String()
	}
	ap, err := netip.ParseAddrPort(listen)
	if err != nil {
		t.Fatalf("--http-listen %q: %v", listen, err)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"liveness", main.LivenessProbe, "/healthz"},
		{"readiness", main.ReadinessProbe, "/readyz"},
	} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s probe: want an httpGet probe", p.name)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path {
			t.Errorf("%s probe path %q, want %q", p.name, g.Path, p.path)
		}
		if g.Port != intstr.FromInt32(int32(ap.Port())) {
			t.Errorf("%s probe port %v, want %d from --http-listen", p.name, g.Port.String(), ap.Port())
		}
		// With hostNetwork the kubelet probes the node's address unless
		// told otherwise; an agent on loopback must be probed there.
		if ap.Addr().IsLoopback() && g.Host != ap.Addr().String() {
			t.Errorf("%s probe host %q, but the agent listens on %s only", p.name, g.Host, ap.Addr())
		}
		if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
			t.Errorf("%s probe scheme %s, want HTTP", p.name, g.Scheme)
		}
		if p.probe.TimeoutSeconds < 1 || p.probe.PeriodSeconds < 1 {
			t.Errorf("%s probe timing %+v", p.name, p.probe)
		}
	}
	if lp := main.LivenessProbe; lp != nil && int(lp.PeriodSeconds)*int(max(lp.FailureThreshold, 3)) < 30 {
		t.Errorf("liveness probe kills the agent after %ds of failures: too eager for a node's router", lp.PeriodSeconds*max(lp.FailureThreshold, 3))
	}
}

type mount struct {
	Container, MountPath, HostPath string
	Type                           corev1.HostPathType
	ReadOnly                       bool
	Propagation                    corev1.MountPropagationMode
}

func hostMounts(t *testing.T, pod *corev1.PodSpec) []mount {
	t.Helper()
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		if _, dup := vols[v.Name]; dup {
			t.Errorf("volume %s twice", v.Name)
		}
		vols[v.Name] = v
	}
	var out []mount
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		for _, vm := range c.VolumeMounts {
			v, ok := vols[vm.Name]
			if !ok {
				t.Errorf("container %s mounts unknown volume %s", c.Name, vm.Name)
				continue
			}
			if v.HostPath == nil {
				continue
			}
			m := mount{Container: c.Name, MountPath: vm.MountPath, HostPath: v.HostPath.Path, ReadOnly: vm.ReadOnly}
			if v.HostPath.Type != nil {
				m.Type = *v.HostPath.Type
			}
			if vm.MountPropagation != nil {
				m.Propagation = *vm.MountPropagation
			}
			out = append(out, m)
		}
	}
	return out
}

func TestDaemonSetMounts(t *testing.T) {
	_, _, pod := daemonSet(t)
	want := []mount{
		{"install-cni", "/host/opt/cni/bin", "/opt/cni/bin", corev1.HostPathDirectoryOrCreate, false, ""},
		{"install-cni", "/host/etc/cni/net.d", "/etc/cni/net.d", corev1.HostPathDirectoryOrCreate, false, ""},
		{"tabby-node", "/var/run/tabby", "/var/run/tabby", corev1.HostPathDirectoryOrCreate, false, ""},
		{"tabby-node", "/var/lib/tabby", "/var/lib/tabby", corev1.HostPathDirectoryOrCreate, false, ""},
		{"tabby-node", "/run/xtables.lock", "/run/xtables.lock", corev1.HostPathFileOrCreate, false, ""},
		{"tabby-node", "/lib/modules", "/lib/modules", corev1.HostPathDirectory, true, ""},
		// Pod namespaces are mounted there after the agent started.
		{"tabby-node", "/var/run/netns", "/var/run/netns", corev1.HostPathDirectoryOrCreate, false, corev1.MountPropagationHostToContainer},
	}
	if diff := cmp.Diff(want, hostMounts(t, pod)); diff != "" {
		t.Errorf("host mounts (-want +got):\n%s", diff)
	}
}

// TestDaemonSetPathsAgree: what install-cni writes, what the agent listens
// on and what the host sees are the same paths.
func TestDaemonSetPathsAgree(t *testing.T) {
	o, _, pod := daemonSet(t)
	main := container(t, pod.Containers, "tabby-node")
	ic := container(t, pod.InitContainers, "install-cni")
	mounts := hostMounts(t, pod)
	// hostPathOf maps a path inside container c to the host's path.
	hostPathOf := func(c, p string) (string, bool) {
		for _, m := range mounts {
			if m.Container != c {
				continue
			}
			if rel, ok := strings.CutPrefix(p, m.MountPath); ok && (rel == "" || rel[0] == '/') {
				return path.Join(m.HostPath, rel), true
			}
		}
		return "", false
	}

	mainArgv := slices.Concat(main.Command[1:], main.Args)
	def := agent.Default()
	get := func(name, fallback string) string {
		if v, ok := flagValue(mainArgv, name); ok {
			return v
		}
		return fallback
	}
	cniSock, stateDir, statusSock := get("cni-socket", def.CNISocket), get("state-dir", def.StateDir), get("status-socket", def.StatusSocket)

	cfg := installConfig(t, o, ic)
	// The shim runs on the host and dials agent_socket there.
	if h, ok := hostPathOf("tabby-node", path.Dir(cniSock)); !ok || path.Join(h, path.Base(cniSock)) != cfg.AgentSocket {
		t.Errorf("the agent's CNI socket %s is at %q on the host, but the conflist names %s", cniSock, h, cfg.AgentSocket)
	}
	if cfg.AgentSocket != cni.DefaultAgentSocket {
		t.Errorf("agent socket %s differs from the shim's default %s", cfg.AgentSocket, cni.DefaultAgentSocket)
	}
	if _, ok := hostPathOf("tabby-node", statusSock); !ok {
		t.Errorf("status socket %s is not on a host mount (tabbyctl on the node cannot reach it)", statusSock)
	}
	if _, ok := hostPathOf("tabby-node", stateDir); !ok {
		t.Errorf("state dir %s is not on a host mount: state would not survive a container restart", stateDir)
	}
	for dir, host := range map[string]string{cfg.BinDir: "/opt/cni/bin", cfg.ConfDir: "/etc/cni/net.d"} {
		if h, ok := hostPathOf("install-cni", dir); !ok || h != host {
			t.Errorf("install-cni writes to %s, which is %q on the host, want %s", dir, h, host)
		}
	}
}

// installConfig is the install-cni configuration of the init container:
// its arguments parsed by the real flag set, its env from the ConfigMap.
func installConfig(t *testing.T, o *objects, ic *corev1.Container) installcni.Config {
	t.Helper()
	argv := slices.Concat(ic.Command, ic.Args)
	if len(argv) < 2 || argv[0] != "tabby-agent" || argv[1] != "install-cni" {
		t.Fatalf("install-cni container runs %v, want tabby-agent install-cni", argv)
	}
	cfg := installcni.Default()
	fs := pflag.NewFlagSet("install-cni", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	if err := fs.Parse(argv[2:]); err != nil {
		t.Fatalf("install-cni arguments %v: %v", argv[2:], err)
	}
	if fs.NArg() > 0 {
		t.Errorf("install-cni takes no arguments, got %v", fs.Args())
	}
	cm := find[*corev1.ConfigMap](t, o, cmName)
	cfg.Template = configMapEnv(t, cm, ic, "CNI_NETWORK_CONFIG")
	mtu, err := strconv.Atoi(configMapEnv(t, cm, ic, "CNI_MTU"))
	if err != nil {
		t.Fatalf("CNI_MTU: %v", err)
	}
	cfg.MTU = mtu
	cfg.SourceBinary = "/usr/local/bin/tabby"
	if err := cfg.Validate(); err != nil {
		t.Errorf("install-cni configuration: %v", err)
	}
	return cfg
}

// configMapEnv is the value of env name of container c, which must come
// from a key of cm.
func configMapEnv(t *testing.T, cm *corev1.ConfigMap, c *corev1.Container, name string) string {
	t.Helper()
	e := envOf(t, c, name)
	if e.ValueFrom == nil || e.ValueFrom.ConfigMapKeyRef == nil || e.ValueFrom.ConfigMapKeyRef.Name != cm.Name {
		t.Fatalf("%s: env %s does not come from ConfigMap %s", c.Name, name, cm.Name)
	}
	v, ok := cm.Data[e.ValueFrom.ConfigMapKeyRef.Key]
	if !ok {
		t.Fatalf("%s: env %s names key %q, which ConfigMap %s lacks", c.Name, name, e.ValueFrom.ConfigMapKeyRef.Key, cm.Name)
	}
	return v
}

// TestDaemonSetEnvReferences: every ConfigMap key and Secret the pod refers
// to exists, so that no container is stuck in CreateContainerConfigError.
func TestDaemonSetEnvReferences(t *testing.T) {
	o, _, pod := daemonSet(t)
	cm := find[*corev1.ConfigMap](t, o, cmName)
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		for _, e := range c.Env {
			if e.ValueFrom == nil || e.ValueFrom.ConfigMapKeyRef == nil {
				continue
			}
			ref := e.ValueFrom.ConfigMapKeyRef
			if ref.Name != cmName {
				t.Errorf("%s: env %s refers to ConfigMap %s", c.Name, e.Name, ref.Name)
			} else if _, ok := cm.Data[ref.Key]; !ok {
				t.Errorf("%s: env %s refers to missing key %s", c.Name, e.Name, ref.Key)
			}
		}
	}
	// The Secret itself is the operator's (README): the manifest leaves
	// it out so that applying it again never empties it.
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.SecretName != secName {
			t.Errorf("volume %s refers to Secret %s", v.Name, v.Secret.SecretName)
		}
	}
}
