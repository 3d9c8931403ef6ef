package installcni

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Report says what Install or Uninstall did, by host-side path as mounted.
type Report struct {
	// Written are files created or replaced.
	Written []string
	// Unchanged are files that already had the right content and mode.
	Unchanged []string
	// Removed are files Uninstall deleted (or stale temporary files).
	Removed []string
	// Shadowed are network configuration files in ConfDir that sort before
	// ours: a runtime uses the lexically first one, so while any is there
	// pods do not get Tabby's network.
	Shadowed []string
}

// Install copies the shim (and any chained plugin the host lacks) into
// BinDir and writes the rendered configuration list into ConfDir. It is
// idempotent: files already right are left as they are. On an error it
// keeps going with the other files and returns every error; a file is
// either fully replaced or not touched.
func Install(cfg Config) (*Report, error) {
	if err := cfg.validateInstall(); err != nil {
		return nil, fmt.Errorf("install-cni config: %w", err)
	}
	conf, cl, err := Render(cfg.template(), cfg.MTU, cfg.AgentSocket)
	if err != nil {
		return nil, err
	}
	shim, err := os.ReadFile(cfg.SourceBinary)
	if err != nil {
		return nil, fmt.Errorf("reading the tabby binary: %w", err)
	}
	for _, d := range []string{cfg.BinDir, cfg.ConfDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	rep := &Report{}
	var errs []error
	record := func(path string, changed bool, err error) {
		switch {
		case err != nil:
			errs = append(errs, err)
		case changed:
			rep.Written = append(rep.Written, path)
		default:
			rep.Unchanged = append(rep.Unchanged, path)
		}
	}

	// Binaries first: a configuration naming a plugin that is not there yet
	// would fail every pod created in between.
	dst := filepath.Join(cfg.BinDir, PluginName)
	changed, err := ensureFile(dst, shim, 0o755)
	record(dst, changed, err)
	for _, typ := range cl.PluginTypes[1:] {
		path, changed, err := ensureChained(cfg, typ)
		if path != "" || err != nil {
			record(path, changed, err)
		}
	}
	if len(errs) > 0 {
		return rep, errors.Join(errs...)
	}
	dst = filepath.Join(cfg.ConfDir, cfg.ConflistName)
	changed, err = ensureFile(dst, conf, 0o644)
	record(dst, changed, err)

	sh, err := shadowing(cfg.ConfDir, cfg.ConflistName)
	if err != nil {
		errs = append(errs, err)
	}
	rep.Shadowed = sh
	return rep, errors.Join(errs...)
}

// ensureChained makes sure BinDir has the chained plugin typ. A plugin the
// host already has is left alone whatever its version, because other
// networks on the node may use it; a missing one is copied from PluginsDir.
// Uninstall does not remove it, for the same reason. path is "" when the
// host already had the plugin.
func ensureChained(cfg Config, typ string) (path string, changed bool, err error) {
	if typ == "" || strings.ContainsAny(typ, `/\`) || strings.HasPrefix(typ, ".") {
		return "", false, fmt.Errorf("chained plugin %q: not a plain file name", typ)
	}
	dst := filepath.Join(cfg.BinDir, typ)
	if fi, err := os.Stat(dst); err == nil && fi.Mode().IsRegular() {
		return "", false, nil
	}
	if cfg.PluginsDir == "" {
		return "", false, fmt.Errorf("chained plugin %q: not in %s and no plugins dir to copy it from", typ, cfg.BinDir)
	}
	b, err := os.ReadFile(filepath.Join(cfg.PluginsDir, typ))
	if err != nil {
		return "", false, fmt.Errorf("chained plugin %q: not in %s, and reading it from the plugins dir: %w", typ, cfg.BinDir, err)
	}
	changed, err = ensureFile(dst, b, 0o755)
	return dst, changed, err
}

// Uninstall removes the shim, the configuration list and any temporary file
// an interrupted Install left, and nothing else: chained plugins stay (see
// ensureChained), and so do other networks' files. Missing files are not
// an error, so Uninstall is idempotent.
func Uninstall(cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("install-cni config: %w", err)
	}
	rep := &Report{}
	var errs []error
	for _, path := range []string{filepath.Join(cfg.ConfDir, cfg.ConflistName), filepath.Join(cfg.BinDir, PluginName)} {
		err := os.Remove(path)
		switch {
		case err == nil:
			rep.Removed = append(rep.Removed, path)
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, fmt.Errorf("removing %s: %w", path, err))
		}
	}
	for _, d := range []string{cfg.ConfDir, cfg.BinDir} {
		stale, err := filepath.Glob(filepath.Join(d, tempPrefix+"*"))
		if err != nil {
			errs = append(errs, fmt.Errorf("listing %s: %w", d, err))
			continue
		}
		for _, path := range stale {
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("removing %s: %w", path, err))
				continue
			}
			rep.Removed = append(rep.Removed, path)
		}
	}
	return rep, errors.Join(errs...)
}

// confExtensions are the files a runtime considers in the configuration
// directory (libcni.ConfFiles with containerd's and CRI-O's extensions).
var confExtensions = []string{".conf", ".conflist", ".json"}

// shadowing lists the configuration files in dir that sort before ours.
func shadowing(dir, ours string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	var out []string
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || name >= ours || !slices.Contains(confExtensions, filepath.Ext(name)) {
			continue
		}
		out = append(out, filepath.Join(dir, name))
	}
	return out, nil
}
