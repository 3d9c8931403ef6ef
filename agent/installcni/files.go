package installcni

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// tempPrefix starts the name of every temporary file Install creates, so
// that Uninstall can find what an interrupted run left. The ".tmp" suffix
// keeps a runtime from reading one as a network configuration.
const tempPrefix = ".tabby-install-"

// ensureFile makes path a regular file holding exactly data with mode perm.
// A file already so is not touched (changed = false). Otherwise the data is
// written to a temporary file in the same directory, synced and renamed
// over path: readers see the old file or the new one, never a part, and a
// process executing the old binary keeps its inode.
func ensureFile(path string, data []byte, perm fs.FileMode) (changed bool, err error) {
	if same, err := hasContent(path, data, perm); err != nil {
		return false, err
	} else if same {
		return false, nil
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, tempPrefix+filepath.Base(path)+"-*.tmp")
	if err != nil {
		return false, fmt.Errorf("writing %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			// The temporary file is ours alone; nothing else to undo.
			err = errors.Join(err, ignoreNotExist(os.Remove(tmp.Name())))
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return false, fmt.Errorf("writing %s: %w", path, err)
	}
	// CreateTemp made it 0600 (and the umask does not apply to chmod).
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return false, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return false, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return false, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return false, fmt.Errorf("writing %s: %w", path, err)
	}
	// Make the rename itself durable: a node that loses power right after
	// install-cni should not come back with no configuration.
	if err := syncDir(dir); err != nil {
		return true, fmt.Errorf("writing %s: %w", path, err)
	}
	return true, nil
}

// hasContent tells whether path is a regular file with exactly data and
// mode perm. A missing file is simply not so.
func hasContent(path string, data []byte, perm fs.FileMode) (bool, error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("checking %s: %w", path, err)
	case !fi.Mode().IsRegular() || fi.Mode().Perm() != perm || fi.Size() != int64(len(data)):
		return false, nil
	}
	got, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("checking %s: %w", path, err)
	}
	return bytes.Equal(got, data), nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

func ignoreNotExist(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
