package manifests

import (
	"encoding/json"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/tabbynet/tabby/agent"
	"github.com/tabbynet/tabby/agent/installcni"
)

// TestConfigMap checks each value of tabby-config the way its consumer
// will parse it.
func TestConfigMap(t *testing.T) {
	o, _, pod := daemonSet(t)
	cm := find[*corev1.ConfigMap](t, o, cmName)
	main := container(t, pod.Containers, "tabby-node")

	// The CNI template renders into a conflist a runtime loads, Tabby first,
	// portmap chained with the portMappings capability.
	cfg := installConfig(t, o, container(t, pod.InitContainers, "install-cni"))
	b, cl, err := installcni.Render(cfg.Template, cfg.MTU, cfg.AgentSocket)
	if err != nil {
		t.Fatalf("cni_network_config: %v", err)
	}
	if diff := cmp.Diff([]string{"tabby", "portmap"}, cl.PluginTypes); diff != "" {
		t.Errorf("plugin chain (-want +got):\n%s", diff)
	}
	if cl.Name != "k8s-pod-network" || cl.CNIVersion != "1.0.0" {
		t.Errorf("name %q, cniVersion %q", cl.Name, cl.CNIVersion)
	}
	var raw struct {
		Plugins []struct {
			Capabilities map[string]bool `json:"capabilities"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	if !raw.Plugins[1].Capabilities["portMappings"] {
		t.Errorf("portmap lacks the portMappings capability: hostPort would be ignored")
	}
	if cl.Tabby.MTU != cfg.MTU || cfg.MTU != 0 {
		t.Errorf("MTU %d in the conflist, %d configured; want 0 (the agent chooses: 1500, or the VXLAN tunnel's)", cl.Tabby.MTU, cfg.MTU)
	}

	pool, err := netip.ParsePrefix(configMapEnv(t, cm, main, "TABBY_IPV4POOL_CIDR"))
	if err != nil || !pool.Addr().Is4() || pool != pool.Masked() || pool.Bits() > 24 {
		t.Errorf("ipv4_pool_cidr %v (err %v): want a masked IPv4 prefix with room for many blocks", pool, err)
	}

	if _, err := agent.ParseAutodetectMethod(configMapEnv(t, cm, main, "IP_AUTODETECTION_METHOD")); err != nil {
		t.Error(err)
	}

	// The endpoints are a placeholder the operator replaces (README);
	// with it replaced they are etcd client URLs.
	eps := strings.NewReplacer("<ETCD_IP>", "198.18.0.1", "<ETCD_PORT>", "2379").
		Replace(configMapEnv(t, cm, main, "TABBY_ETCD_ENDPOINTS"))
	for _, ep := range strings.Split(eps, ",") {
		u, err := url.Parse(strings.TrimSpace(ep))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Port() == "" || u.Path != "" {
			t.Errorf("etcd endpoint %q is not an http(s)://host:port URL (err %v)", ep, err)
		}
	}
}

// etcdSecretKeys are the keys of the Secret secName: the CA bundle, the
// client certificate and its key.
var etcdSecretKeys = []string{"etcd-ca", "etcd-cert", "etcd-key"}

// TestEtcdTLSWiring: etcd over TLS by default, for the agent and the
// controllers alike: https endpoints; the three TLS files set, each a key
// of the Secret at its read-only mount; the volume not optional (no TLS
// material, no start) and readable by the container's user but not by
// others; and the settings pass the agent's own validation.
func TestEtcdTLSWiring(t *testing.T) {
	o, _, pod := daemonSet(t)
	cm := find[*corev1.ConfigMap](t, o, cmName)
	kc := find[*appsv1.Deployment](t, o, "tabby-kube-controllers")
	for _, w := range []struct {
		pod  *corev1.PodSpec
		name string
	}{{pod, "tabby-node"}, {&kc.Spec.Template.Spec, "tabby-kube-controllers"}} {
		c := container(t, w.pod.Containers, w.name)
		var mount string
		for _, v := range w.pod.Volumes {
			if v.Secret == nil || v.Secret.SecretName != secName {
				continue
			}
			if v.Secret.Optional != nil && *v.Secret.Optional {
				t.Errorf("%s: the etcd secret is optional: the pod would start without its TLS files", w.name)
			}
			if !secretReadable(w.pod, c, v.Secret.DefaultMode) {
				t.Errorf("%s: the etcd secret (mode %o) is not readable by the container's user, or readable by others", w.name, derefMode(v.Secret.DefaultMode))
			}
			for _, vm := range c.VolumeMounts {
				if vm.Name == v.Name {
					mount = vm.MountPath
					if !vm.ReadOnly {
						t.Errorf("%s: secret mount %s is writable", w.name, vm.MountPath)
					}
				}
			}
		}
		if mount == "" {
			t.Errorf("%s does not mount the etcd secret", w.name)
			continue
		}
		cfg := agent.Default()
		cfg.NodeName = "n1"
		cfg.Etcd.Endpoints = strings.Split(strings.NewReplacer("<ETCD_IP>", "10.0.0.10", "<ETCD_PORT>", "2379").
			Replace(configMapEnv(t, cm, c, "TABBY_ETCD_ENDPOINTS")), ",")
		for _, ep := range cfg.Etcd.Endpoints {
			if !strings.HasPrefix(ep, "https://") {
				t.Errorf("%s: etcd endpoint %q is not https", w.name, ep)
			}
		}
		for i, f := range []*string{&cfg.Etcd.CAFile, &cfg.Etcd.CertFile, &cfg.Etcd.KeyFile} {
			env := []string{"TABBY_ETCD_CA_FILE", "TABBY_ETCD_CERT_FILE", "TABBY_ETCD_KEY_FILE"}[i]
			*f = configMapEnv(t, cm, c, env)
			if want := mount + "/" + etcdSecretKeys[i]; *f != want {
				t.Errorf("%s: %s = %q, want %q (key %s of the secret)", w.name, env, *f, want, etcdSecretKeys[i])
			}
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: the etcd settings do not validate: %v", w.name, err)
		}
	}
}

func derefMode(m *int32) int32 {
	if m == nil {
		return 0o644 // the Kubernetes default
	}
	return *m
}

// secretReadable says the container's user can read a secret volume of
// mode m (files owned by root, group fsGroup when set) and others cannot.
func secretReadable(pod *corev1.PodSpec, c *corev1.Container, m *int32) bool {
	mode := derefMode(m)
	if mode&0o007 != 0 {
		return false
	}
	var uid *int64
	if pod.SecurityContext != nil {
		uid = pod.SecurityContext.RunAsUser
	}
	if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
		uid = c.SecurityContext.RunAsUser
	}
	if uid == nil || *uid == 0 {
		return mode&0o400 != 0
	}
	return mode&0o040 != 0 && pod.SecurityContext != nil && pod.SecurityContext.FSGroup != nil
}

// TestREADMEMakesTheSecret: the README's command creates the Secret the
// pods mount, with exactly the keys they read.
func TestREADMEMakesTheSecret(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	cmd := regexp.MustCompile(`kubectl -n tabby-system create secret generic (\S+)((?:\s+\\?\s*--from-file=\S+)+)`).FindStringSubmatch(string(b))
	if cmd == nil {
		t.Fatal("README.md has no `kubectl -n tabby-system create secret generic … --from-file=…` command")
	}
	if cmd[1] != secName {
		t.Errorf("README creates secret %q, the pods mount %q", cmd[1], secName)
	}
	var keys []string
	for _, m := range regexp.MustCompile(`--from-file=([^=\s]+)=`).FindAllStringSubmatch(cmd[2], -1) {
		keys = append(keys, m[1])
	}
	slices.Sort(keys)
	if diff := cmp.Diff(etcdSecretKeys, keys); diff != "" {
		t.Errorf("README secret keys (-want +got):\n%s", diff)
	}
}
