package manifests

import (
	"encoding/json"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
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
	if cl.Tabby.MTU != cfg.MTU || cfg.MTU != 1500 {
		t.Errorf("MTU %d in the conflist, %d configured; want 1500 (no encapsulation)", cl.Tabby.MTU, cfg.MTU)
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

// TestEtcdTLSWiring: the TLS file settings are empty (plain HTTP) or name
// a key of the Secret at its mount path, readable only by root.
func TestEtcdTLSWiring(t *testing.T) {
	o, _, pod := daemonSet(t)
	cm := find[*corev1.ConfigMap](t, o, cmName)
	sec := find[*corev1.Secret](t, o, secName)
	main := container(t, pod.Containers, "tabby-node")
	var secretMount string
	for _, v := range pod.Volumes {
		if v.Secret == nil {
			continue
		}
		if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o077 != 0 {
			t.Errorf("secret volume %s is readable by group or others", v.Name)
		}
		for _, vm := range main.VolumeMounts {
			if vm.Name == v.Name {
				secretMount = vm.MountPath
				if !vm.ReadOnly {
					t.Errorf("secret mount %s is writable", vm.MountPath)
				}
			}
		}
	}
	if secretMount == "" {
		t.Fatal("the agent does not mount the etcd secret")
	}
	wantKeys := []string{"etcd-ca", "etcd-cert", "etcd-key"}
	var keys []string
	for k := range sec.Data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if diff := cmp.Diff(wantKeys, keys); diff != "" {
		t.Errorf("secret keys (-want +got):\n%s", diff)
	}
	for _, env := range []string{"TABBY_ETCD_CA_FILE", "TABBY_ETCD_CERT_FILE", "TABBY_ETCD_KEY_FILE"} {
		p := configMapEnv(t, cm, main, env)
		if p == "" {
			continue
		}
		if !slices.Contains(keys, strings.TrimPrefix(p, secretMount+"/")) {
			t.Errorf("%s = %q is not a key of the secret mounted at %s", env, p, secretMount)
		}
	}
}
