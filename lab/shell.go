package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
)

// NetNSDir is where `ip netns add` puts its namespace files.
const NetNSDir = "/run/netns"

// NetNSPath is the file of the named network namespace.
func NetNSPath(name string) string { return filepath.Join(NetNSDir, name) }

// Progress writes one progress line to the lab's log.
func (l *Lab) Progress(format string, args ...any) { progress(l.log, format, args...) }

// progress writes one progress line.
func progress(w io.Writer, format string, args ...any) {
	if w == nil {
		return
	}
	fmt.Fprintf(w, "lab: "+format+"\n", args...)
}

// run runs a command to completion and returns its standard output. The
// error carries the command line and what it wrote to standard error.
func run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		if msg != "" {
			return stdout.Bytes(), fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, msg)
		}
		return stdout.Bytes(), fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	}
	return stdout.Bytes(), nil
}

// ip runs the ip command.
func ip(ctx context.Context, args ...string) error {
	_, err := run(ctx, "ip", args...)
	return err
}

// nsExec runs argv in the network namespace nsName (and only there: nsenter
// --net leaves the mount namespace alone, unlike `ip netns exec`) and returns
// its standard output and standard error together.
func nsExec(ctx context.Context, nsName string, argv ...string) ([]byte, error) {
	if len(argv) == 0 {
		return nil, errors.New("exec: no command")
	}
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + NetNSPath(nsName), "--"}, argv...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s in %s: %w: %s", strings.Join(argv, " "), nsName, err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// setSysctl writes a /proc/sys/net value inside the named namespace. Files
// below /proc/sys/net belong to the namespace of the thread that opens them.
func setSysctl(nsName, key, value string) error {
	path := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
	err := ns.WithNetNSPath(NetNSPath(nsName), func(ns.NetNS) error {
		return os.WriteFile(path, []byte(value), 0o644)
	})
	if err != nil {
		return fmt.Errorf("setting %s=%s in %s: %w", key, value, nsName, err)
	}
	return nil
}

// checkHost reports why the lab cannot run here: not root, or a tool missing.
func checkHost() error {
	var errs []error
	if os.Geteuid() != 0 {
		errs = append(errs, errors.New("the lab needs root (network namespaces, veths, bridges): run it with sudo"))
	}
	for _, tool := range [][2]string{{"ip", "iproute2"}, {"nsenter", "util-linux"}} {
		if _, err := exec.LookPath(tool[0]); err != nil {
			errs = append(errs, fmt.Errorf("%s not found in PATH (install %s)", tool[0], tool[1]))
		}
	}
	return errors.Join(errs...)
}

// netnsExists reports whether /run/netns/<name> exists.
func netnsExists(name string) bool {
	_, err := os.Stat(NetNSPath(name))
	return err == nil
}

// runIn is run with a working directory and extra environment.
func runIn(ctx context.Context, dir string, env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}
