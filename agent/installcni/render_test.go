package installcni

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRenderDefaultTemplate(t *testing.T) {
	b, cl, err := Render(DefaultTemplate, 1480, `/run/tabby dir/"cni".sock`)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "__") {
		t.Errorf("placeholders left:\n%s", b)
	}
	got := struct {
		Name, Version, Socket string
		MTU                   int
		Types                 []string
	}{cl.Name, cl.CNIVersion, cl.Tabby.AgentSocket, cl.Tabby.MTU, cl.PluginTypes}
	want := got
	want.Name, want.Version, want.Socket, want.MTU = "k8s-pod-network", "1.0.0", `/run/tabby dir/"cni".sock`, 1480
	want.Types = []string{"tabby", "portmap"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rendered (-want +got):\n%s", diff)
	}
}

func TestRenderRejects(t *testing.T) {
	tests := []struct {
		name, template string
		mtu            int
		socket         string
		wantErr        string
	}{
		{"unknown placeholder", strings.Replace(DefaultTemplate, `"snat": true`, `"snat": __SNAT__`, 1), 1500, "/s", "__SNAT__"},
		{"not JSON", "{", 1500, "/s", "parsing conflist"},
		{"tabby not first", `{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"portmap"},{"type":"tabby"}]}`, 1500, "/s", `first plugin is "portmap"`},
		{"no plugins", `{"name":"n","cniVersion":"1.0.0","plugins":[]}`, 1500, "/s", "plugins"},
		{"no name", `{"cniVersion":"1.0.0","plugins":[{"type":"tabby"}]}`, 1500, "/s", "name"},
		{"unsupported version", `{"name":"n","cniVersion":"0.2.0","plugins":[{"type":"tabby"}]}`, 1500, "/s", "cniVersion"},
		{"plugin without type", `{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"tabby"},{}]}`, 1500, "/s", "type"},
		{"relative socket", DefaultTemplate, 1500, "run/cni.sock", "agent_socket"},
		{"mtu out of range", DefaultTemplate, 20, "/s", "mtu"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := Render(tt.template, tt.mtu, tt.socket)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestConfigValidateReportsEverything(t *testing.T) {
	c := Config{BinDir: "opt/cni/bin", ConfDir: "", ConflistName: "../x.conf", PluginsDir: "rel", MTU: 67, AgentSocket: "sock"}
	err := c.validateInstall()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"cni bin dir", "cni conf dir", "conflist name", "source binary", "plugins dir", "mtu", "agent socket"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s:\n%v", want, err)
		}
	}
	d := Default()
	if err := d.Validate(); err != nil {
		t.Errorf("defaults (no source binary: enough to uninstall): %v", err)
	}
	if err := d.validateInstall(); err == nil || !strings.Contains(err.Error(), "source binary") {
		t.Errorf("defaults to install: err = %v, want one naming the source binary", err)
	}
	d.SourceBinary = "/usr/local/bin/tabby"
	if err := d.validateInstall(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	d.ConflistName = "10-tabby.conf"
	if err := d.Validate(); err == nil || !strings.Contains(err.Error(), ".conflist") {
		t.Errorf("a .conf name: err = %v, want one asking for .conflist", err)
	}
}
