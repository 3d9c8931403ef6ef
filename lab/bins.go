package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// modulePath is the module whose commands the lab runs.
const modulePath = "github.com/tabbynet/tabby"

// Binaries of the lab.
const (
	BinAgent = "tabby-agent"
	BinCNI   = "tabby"
	BinLab   = "tabby-lab"
)

// resolveBinaries fills BinDir and LabBinary: from the options, from
// $TABBY_BIN, or by building the commands into buildDir.
func resolveBinaries(ctx context.Context, o *Options, buildDir string) error {
	if o.BinDir == "" {
		o.BinDir = os.Getenv("TABBY_BIN")
	}
	need := []string{}
	if o.LabBinary == "" {
		need = append(need, BinLab)
	}
	if !o.NoAgents {
		need = append(need, BinAgent, BinCNI)
	}
	if o.Relay {
		need = append(need, BinRelay)
	}
	if o.BinDir == "" {
		if len(need) > 0 {
			if err := BuildCommands(ctx, buildDir, need, o.Log); err != nil {
				return err
			}
		}
		o.BinDir = buildDir
	}
	var errs []error
	for _, b := range need {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			errs = append(errs, fmt.Errorf("%s not found in %s (run `make build`, or set TABBY_BIN)", b, o.BinDir))
		}
	}
	if o.LabBinary == "" {
		o.LabBinary = filepath.Join(o.BinDir, BinLab)
	}
	return errors.Join(errs...)
}

// BuildCommands builds ./cmd/<name> for each name into dir, from the module
// containing the working directory.
func BuildCommands(ctx context.Context, dir string, names []string, log io.Writer) error {
	root, err := moduleRoot()
	if err != nil {
		return fmt.Errorf("building %s: %w; pass a directory with the binaries (--bin-dir or TABBY_BIN)", strings.Join(names, ", "), err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	for _, n := range names {
		progress(log, "building %s into %s", n, dir)
		cmd := []string{"build", "-o", filepath.Join(dir, n), "./cmd/" + n}
		if _, err := runIn(ctx, root, []string{"CGO_ENABLED=0"}, "go", cmd...); err != nil {
			return fmt.Errorf("building %s: %w", n, err)
		}
	}
	return nil
}

// moduleRoot finds the directory of the tabby module, walking up from the
// working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if ok, err := isTabbyModule(filepath.Join(dir, "go.mod")); err == nil && ok {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no %s module above the working directory", modulePath)
		}
		dir = parent
	}
}

func isTabbyModule(gomod string) (bool, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) == 2 && fields[0] == "module" {
			return fields[1] == modulePath, nil
		}
	}
	return false, sc.Err()
}
