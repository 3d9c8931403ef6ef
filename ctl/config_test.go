package ctl

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/datastore"
)

func TestResolveConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	full := write("full.yaml", "etcd-endpoints: [https://198.18.0.1:2379, https://198.18.0.2:2379]\netcd-ca-file: /f/ca.pem\netcd-cert-file: /f/cert.pem\netcd-key-file: /f/key.pem\n")
	comma := write("comma.yaml", "etcd-endpoints: http://a:2379, http://b:2379\n")
	unknown := write("unknown.yaml", "etcd-endpoint: http://a:2379\n")
	missing := filepath.Join(dir, "missing.yaml")
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

	tests := []struct {
		name    string
		src     ConfigSources
		want    datastore.Config
		wantErr string
	}{
		{
			name: "defaults without file or environment",
			src:  ConfigSources{DefaultFile: missing},
			want: datastore.Config{Endpoints: []string{DefaultEndpoint}},
		},
		{
			name: "default file when it exists",
			src:  ConfigSources{DefaultFile: full},
			want: datastore.Config{Endpoints: []string{"https://198.18.0.1:2379", "https://198.18.0.2:2379"}, CAFile: "/f/ca.pem", CertFile: "/f/cert.pem", KeyFile: "/f/key.pem"},
		},
		{
			name: "comma-separated endpoints in the file",
			src:  ConfigSources{File: comma},
			want: datastore.Config{Endpoints: []string{"http://a:2379", "http://b:2379"}},
		},
		{
			name: "environment over file",
			src: ConfigSources{File: full, Getenv: env(map[string]string{
				EnvEndpoints: "http://e1:2379,http://e2:2379", EnvCAFile: "/e/ca.pem",
			})},
			want: datastore.Config{Endpoints: []string{"http://e1:2379", "http://e2:2379"}, CAFile: "/e/ca.pem", CertFile: "/f/cert.pem", KeyFile: "/f/key.pem"},
		},
		{
			name: "flags over environment",
			src: ConfigSources{
				Flags:  Config{Endpoints: []string{"unix:///run/etcd.sock"}, KeyFile: "/x/key.pem"},
				Getenv: env(map[string]string{EnvEndpoints: "http://e1:2379", EnvKeyFile: "/e/key.pem", EnvCertFile: "/e/cert.pem"}),
			},
			want: datastore.Config{Endpoints: []string{"unix:///run/etcd.sock"}, CertFile: "/e/cert.pem", KeyFile: "/x/key.pem"},
		},
		{name: "explicit file must exist", src: ConfigSources{File: missing}, wantErr: "no such file"},
		{name: "unknown key in file", src: ConfigSources{File: unknown}, wantErr: `unknown field "etcd-endpoint"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.src.DefaultFile == "" {
				tt.src.DefaultFile = missing
			}
			got, err := tt.src.Resolve()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Resolve() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve(): %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Resolve() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDialTarget(t *testing.T) {
	tests := []struct{ ep, network, addr, err string }{
		{ep: "http://127.0.0.1:2379", network: "tcp", addr: "127.0.0.1:2379"},
		{ep: "https://etcd.example", network: "tcp", addr: "etcd.example:2379"},
		{ep: "unix:///run/tabby/etcd.sock", network: "unix", addr: "/run/tabby/etcd.sock"},
		{ep: "unix://relative.sock", network: "unix", addr: "relative.sock"},
		{ep: "gopher://x", err: `unsupported scheme "gopher"`},
	}
	for _, tt := range tests {
		network, addr, err := dialTarget(tt.ep)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("dialTarget(%q) error = %v, want %q", tt.ep, err, tt.err)
			}
			continue
		}
		if err != nil || network != tt.network || addr != tt.addr {
			t.Errorf("dialTarget(%q) = %q, %q, %v; want %q, %q", tt.ep, network, addr, err, tt.network, tt.addr)
		}
	}
}
