package memlimit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSoft(t *testing.T) {
	type want struct {
		Soft, Cgroup int64
		OK           bool
	}
	const mib = 1 << 20
	for _, c := range []struct {
		name   string
		cgroup string            // /proc/self/cgroup
		files  map[string]string // under the cgroup root
		env    string            // GOMEMLIMIT
		want   want
	}{
		{"v2 limit", "0::/kubepods/pod1/c1\n", map[string]string{"kubepods/pod1/c1/memory.max": "209715200\n"}, "", want{180 * mib, 200 * mib, true}},
		{"v2 namespaced", "0::/\n", map[string]string{"memory.max": "104857600\n"}, "", want{90 * mib, 100 * mib, true}},
		{"v2 no limit", "0::/c1\n", map[string]string{"c1/memory.max": "max\n"}, "", want{}},
		{"v1 limit", "12:pids:/x\n4:cpu,memory:/kubepods/c1\n", map[string]string{"memory/kubepods/c1/memory.limit_in_bytes": "104857600"}, "", want{90 * mib, 100 * mib, true}},
		{"v1 unlimited", "4:memory:/c1\n", map[string]string{"memory/c1/memory.limit_in_bytes": "9223372036854771712"}, "", want{}},
		{"GOMEMLIMIT wins", "0::/\n", map[string]string{"memory.max": "104857600"}, "64MiB", want{}},
		{"no cgroup file", "", nil, "", want{}},
		{"unreadable limit", "0::/c1\n", map[string]string{"c1/memory.max": "lots"}, "", want{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			fs := FS{ProcCgroup: filepath.Join(dir, "cgroup"), CgroupRoot: filepath.Join(dir, "root")}
			if c.cgroup != "" {
				write(t, fs.ProcCgroup, c.cgroup)
			}
			for name, data := range c.files {
				write(t, filepath.Join(fs.CgroupRoot, name), data)
			}
			env := map[string]string{"GOMEMLIMIT": c.env}
			var got want
			got.Soft, got.Cgroup, got.OK = Soft(fs, func(k string) string { return env[k] })
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("Soft (-want +got):\n%s", diff)
			}
		})
	}
}

func write(t *testing.T, name, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
