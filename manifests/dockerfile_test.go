package manifests

import (
	"bufio"
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/tabbynet/tabby/agent/installcni"
	"github.com/tabbynet/tabby/internal/image"
)

// No container engine runs here, so the image is not built; these tests
// check what can go wrong in a Dockerfile without one: stages, sources,
// versions and where the binaries land.

type instruction struct {
	Cmd  string // upper case: FROM, RUN, COPY…
	Args string
}

type stage struct {
	Base, Name string
	Ins        []instruction
}

// parseDockerfile splits a Dockerfile into stages of instructions, joining
// continuation lines and dropping comments.
func parseDockerfile(t *testing.T, name string) []stage {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stages []stage
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := instruction{strings.ToUpper(cmd), strings.TrimSpace(args)}
		if in.Cmd == "FROM" {
			base, name, _ := strings.Cut(in.Args, " AS ")
			stages = append(stages, stage{Base: strings.TrimSpace(base), Name: strings.TrimSpace(name)})
			return
		}
		if len(stages) == 0 {
			t.Fatalf("%s: %s before the first FROM", name, in.Cmd)
		}
		s := &stages[len(stages)-1]
		s.Ins = append(s.Ins, in)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if l, ok := strings.CutSuffix(strings.TrimRight(line, " \t"), `\`); ok {
			cur.WriteString(l + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	flush()
	return stages
}

func (s stage) all(cmd string) []string {
	var out []string
	for _, in := range s.Ins {
		if in.Cmd == cmd {
			out = append(out, in.Args)
		}
	}
	return out
}

// goModVersion returns the go directive or the required version of mod.
func goModVersion(t *testing.T, mod string) string {
	t.Helper()
	b, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(mod) + `\s+(\S+)`)
	if mod == "go" {
		re = regexp.MustCompile(`(?m)^go\s+(\S+)`)
	}
	m := re.FindSubmatch(b)
	if m == nil {
		t.Fatalf("go.mod names no %s", mod)
	}
	return string(m[1])
}

func TestDockerfile(t *testing.T) {
	stages := parseDockerfile(t, "../Dockerfile")
	if len(stages) != 2 {
		t.Fatalf("%d stages, want a builder and a runtime", len(stages))
	}
	build, run := stages[0], stages[1]

	// The builder's Go is the one go.mod asks for.
	goVer := goModVersion(t, "go")
	parts := strings.SplitN(goVer, ".", 3)
	if want := "golang:" + parts[0] + "." + parts[1]; build.Base != want && !strings.HasPrefix(build.Base, want+"-") && !strings.HasPrefix(build.Base, want+".") {
		t.Errorf("builder image %s, want %s (go.mod: go %s)", build.Base, want, goVer)
	}
	if build.Name == "" {
		t.Error("the builder stage has no name for COPY --from")
	}
	if !slices.Contains(build.all("ENV"), "CGO_ENABLED=0") {
		t.Error("the builder does not set CGO_ENABLED=0: the shim, copied to the host, must be static")
	}

	// go build -o /out/X ./cmd/Y: every command exists in the repository.
	built := map[string]bool{}
	args := map[string]string{}
	for _, a := range build.all("ARG") {
		k, v, _ := strings.Cut(a, "=")
		args[k] = v
	}
	buildRe := regexp.MustCompile(`go build [^&;]*?-o (\S+) (\./cmd/[a-z-]+)`)
	for _, r := range build.all("RUN") {
		for _, m := range buildRe.FindAllStringSubmatch(r, -1) {
			out, pkg := m[1], m[2]
			if _, err := os.Stat(filepath.Join("..", pkg, "main.go")); err != nil {
				t.Errorf("go build %s: %v", pkg, err)
			}
			if path.Base(out) != path.Base(pkg) {
				t.Errorf("go build %s writes %s: the binary should keep its name", pkg, out)
			}
			built[out] = true
		}
		// portmap from the CNI plugins release go.mod pins.
		if strings.Contains(r, "plugins/meta/portmap@") {
			gobin := regexp.MustCompile(`GOBIN=(\S+)`).FindStringSubmatch(r)
			if gobin == nil {
				t.Errorf("portmap install without GOBIN: %s", r)
				continue
			}
			built[path.Join(gobin[1], "portmap")] = true
			want := goModVersion(t, "github.com/containernetworking/plugins")
			if !strings.Contains(r, "@${CNI_PLUGINS_VERSION}") || args["CNI_PLUGINS_VERSION"] != want {
				t.Errorf("portmap version %q, want go.mod's %s", args["CNI_PLUGINS_VERSION"], want)
			}
		}
	}

	// COPY --from=build SRC... DST: what lands where in the image.
	image := map[string]string{} // base name -> path in the image
	for _, c := range run.all("COPY") {
		from, rest, ok := strings.Cut(c, " ")
		if !ok || !strings.HasPrefix(from, "--from=") {
			t.Errorf("runtime stage copies from the build context: COPY %s", c)
			continue
		}
		if strings.TrimPrefix(from, "--from=") != build.Name {
			t.Errorf("COPY %s: not from the builder %q", c, build.Name)
		}
		f := strings.Fields(rest)
		srcs, dst := f[:len(f)-1], f[len(f)-1]
		for _, s := range srcs {
			if !built[s] {
				t.Errorf("COPY %s: the builder makes no %s (it makes %v)", c, s, built)
			}
			p := dst
			if strings.HasSuffix(dst, "/") {
				p = path.Join(dst, path.Base(s))
			}
			image[path.Base(s)] = p
		}
	}
	want := map[string]string{
		"tabby-agent": "/usr/local/bin/tabby-agent",
		"tabby":       "/usr/local/bin/tabby",
		"tabbyctl":    "/usr/local/bin/tabbyctl",
		"portmap":     path.Join(installcni.Default().PluginsDir, "portmap"),
		// tabby-kube-controllers' Deployment runs the same image.
		"tabby-kube-controllers": "/usr/local/bin/tabby-kube-controllers",
		// and manifests/relay's Deployment too.
		"tabby-relay": "/usr/local/bin/tabby-relay",
	}
	if diff := cmp.Diff(want, image); diff != "" {
		t.Errorf("files in the image (-want +got):\n%s", diff)
	}
	// install-cni's default --source-binary is the tabby next to it.
	if path.Dir(image["tabby"]) != path.Dir(image["tabby-agent"]) {
		t.Error("tabby is not next to tabby-agent")
	}

	// Nothing but the copied files: no package manager, no shell.
	if r := run.all("RUN"); len(r) > 0 {
		t.Errorf("the runtime stage runs %q: it has no shell (FROM scratch)", r)
	}
}

// TestImageMatchesDockerfile: the image `make images` assembles without
// Docker (internal/image) holds what the Dockerfile's runtime stage holds:
// the same files at the same paths from the same binaries, the same
// environment and command, and nothing from a base image.
func TestImageMatchesDockerfile(t *testing.T) {
	stages := parseDockerfile(t, "../Dockerfile")
	run := stages[len(stages)-1]
	if run.Base != "scratch" {
		t.Errorf("runtime stage FROM %s: internal/image starts from nothing, so should the Dockerfile", run.Base)
	}
	if add := run.all("ADD"); len(add) > 0 {
		t.Errorf("ADD %q in the runtime stage: internal/image has no counterpart", add)
	}
	docker := map[string]string{} // path in the image -> built file's name
	for _, c := range run.all("COPY") {
		f := strings.Fields(c)
		if len(f) < 3 || !strings.HasPrefix(f[0], "--from=") {
			t.Errorf("COPY %s: want COPY --from=<builder> SRC... DST", c)
			continue
		}
		srcs, dst := f[1:len(f)-1], f[len(f)-1]
		if len(srcs) > 1 && !strings.HasSuffix(dst, "/") {
			t.Errorf("COPY %s: several sources into a file", c)
		}
		for _, src := range srcs {
			p := dst
			if strings.HasSuffix(dst, "/") {
				p = path.Join(dst, path.Base(src))
			}
			docker[p] = path.Base(src)
		}
	}
	spec := image.Tabby("dev")
	ours := map[string]string{}
	for _, f := range spec.Files {
		ours[f.Dst] = f.Src
		if f.Mode != 0o755 {
			t.Errorf("%s has mode %o in internal/image; COPY keeps the builder's 0755", f.Dst, f.Mode)
		}
	}
	if diff := cmp.Diff(docker, ours); diff != "" {
		t.Errorf("image files: path -> binary (-Dockerfile +internal/image):\n%s", diff)
	}
	if diff := cmp.Diff(run.all("ENV"), spec.Env); diff != "" {
		t.Errorf("environment (-Dockerfile +internal/image):\n%s", diff)
	}
	cmds := run.all("CMD")
	var cmd []string
	if len(cmds) != 1 {
		t.Fatalf("CMD %q: want one, in JSON form", cmds)
	}
	if err := json.Unmarshal([]byte(cmds[0]), &cmd); err != nil {
		t.Fatalf("CMD %s: %v", cmds[0], err)
	}
	if diff := cmp.Diff(cmd, spec.Cmd); diff != "" {
		t.Errorf("command (-Dockerfile +internal/image):\n%s", diff)
	}
	if ep := run.all("ENTRYPOINT"); len(ep) > 0 {
		t.Errorf("ENTRYPOINT %q: internal/image sets none", ep)
	}
}

// dockerignored reports whether a context path matches .dockerignore
// patterns (the forms the file uses: plain paths from the root and **/).
func dockerignored(patterns []string, p string) bool {
	for _, pat := range patterns {
		pat = strings.TrimPrefix(pat, "/")
		candidates := []string{p}
		if rest, ok := strings.CutPrefix(pat, "**/"); ok {
			pat = rest
			candidates = nil
			parts := strings.Split(p, "/")
			for i := range parts {
				candidates = append(candidates, strings.Join(parts[i:], "/"))
			}
		}
		for _, c := range candidates {
			// A pattern matching a directory excludes what is below it.
			for d := c; d != "." && d != "/"; d = path.Dir(d) {
				if ok, _ := path.Match(pat, d); ok {
					return true
				}
			}
		}
	}
	return false
}

func TestDockerignore(t *testing.T) {
	b, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, "!") {
			t.Fatalf("exception %q: dockerignored does not model exceptions", l)
		}
		patterns = append(patterns, l)
	}
	for p, want := range map[string]bool{
		".git/config": true, "bin/tabby": true, "tabby-agent": true, "agent/agent.test": true,
		"go.mod": false, "go.sum": false, "cmd/tabby/main.go": false, "cmd/tabby-agent/main.go": false,
		"cmd/tabbyctl/main.go": false, "agent/installcni/install.go": false, "cni/testdata/x": false,
	} {
		if got := dockerignored(patterns, p); got != want {
			t.Errorf("%s ignored = %v, want %v", p, got, want)
		}
	}
	// Every Go source the build needs is in the context.
	err = filepath.WalkDir("..", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("..", p)
		if d.IsDir() && (rel == ".git" || rel == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() && (strings.HasSuffix(rel, ".go") || rel == "go.mod" || rel == "go.sum") && dockerignored(patterns, filepath.ToSlash(rel)) {
			t.Errorf("%s is excluded from the build context", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCommandsInImage: every container that runs the Tabby image runs a
// program the image holds (it has no shell and no coreutils), and every
// other container runs the pause image.
func TestCommandsInImage(t *testing.T) {
	spec := image.Tabby("dev")
	inImage := map[string]bool{}
	for _, f := range spec.Files {
		inImage[f.Dst] = true
		if path.Dir(f.Dst) == "/usr/local/bin" {
			inImage[path.Base(f.Dst)] = true // found through PATH
		}
	}
	o := loadManifests(t)
	uninstall, err := os.ReadFile("tabby-uninstall.yaml")
	if err != nil {
		t.Fatal(err)
	}
	more, err := decodeStrict(uninstall)
	if err != nil {
		t.Fatal(err)
	}
	o.all = append(o.all, more...)
	var pods []*corev1.PodSpec
	for _, ds := range all[*appsv1.DaemonSet](o) {
		pods = append(pods, &ds.Spec.Template.Spec)
	}
	for _, d := range all[*appsv1.Deployment](o) {
		pods = append(pods, &d.Spec.Template.Spec)
	}
	n := 0
	for _, pod := range pods {
		for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
			n++
			switch c.Image {
			case "tabby:dev":
				argv := slices.Concat(c.Command, c.Args)
				if len(argv) == 0 {
					argv = spec.Cmd
				}
				if !inImage[argv[0]] {
					t.Errorf("container %s runs %q, which the Tabby image does not hold", c.Name, argv[0])
				}
			case image.PauseName:
				if len(c.Command) > 0 {
					t.Errorf("container %s gives the pause image a command %q", c.Name, c.Command)
				}
			default:
				t.Errorf("container %s runs image %s", c.Name, c.Image)
			}
		}
	}
	if n < 4 {
		t.Errorf("found %d containers: the manifests did not load", n)
	}
}
