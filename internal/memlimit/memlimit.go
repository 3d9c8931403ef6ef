// Package memlimit gives the Go runtime a soft memory limit derived from
// the memory limit of the process's cgroup, so that a container given a
// memory limit makes the garbage collector work harder as the limit nears
// instead of being killed for the heap's growth headroom (GOGC 100 lets
// the heap reach twice what is live). It sets nothing when GOMEMLIMIT is
// set (the runtime honours it) or when the cgroup has no limit.
package memlimit

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// Fraction of the cgroup's limit given to the runtime: the rest is for
// what the runtime does not count (the binary's pages, which the cgroup
// charges, and memory outside Go's heap).
const Fraction = 0.9

// FS is where to read: the process's cgroup file and the cgroup
// hierarchy's mount (normally /proc/self/cgroup and /sys/fs/cgroup).
type FS struct {
	ProcCgroup string
	CgroupRoot string
}

// Host is the running process's FS.
var Host = FS{ProcCgroup: "/proc/self/cgroup", CgroupRoot: "/sys/fs/cgroup"}

// Limit returns the memory limit of the process's cgroup in bytes (cgroup
// v2's memory.max, else v1's memory.limit_in_bytes), and false when there
// is none or it cannot be read.
func (fs FS) Limit() (int64, bool) {
	data, err := os.ReadFile(fs.ProcCgroup)
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			file = filepath.Join(fs.CgroupRoot, parts[2], "memory.max")
		case hasController(parts[1], "memory"):
			file = filepath.Join(fs.CgroupRoot, "memory", parts[2], "memory.limit_in_bytes")
		default:
			continue
		}
		if n, ok := readLimit(file); ok {
			return n, true
		}
	}
	return 0, false
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// readLimit reads a limit file: "max" (v2) or a value no host has (v1's
// "unlimited" is a page-rounded max int64) mean none.
func readLimit(file string) (int64, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n >= 1<<60 {
		return 0, false
	}
	return n, true
}

// Soft is the soft limit Apply sets, in bytes, and the cgroup's limit it
// comes from; false when GOMEMLIMIT is set or the cgroup has no limit.
func Soft(fs FS, getenv func(string) string) (soft, cgroup int64, ok bool) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, 0, false
	}
	n, ok := fs.Limit()
	if !ok {
		return 0, 0, false
	}
	return int64(float64(n) * Fraction), n, true
}

// Apply sets the runtime's soft memory limit to Soft's, when there is one.
func Apply(fs FS, getenv func(string) string) (soft, cgroup int64, ok bool) {
	soft, cgroup, ok = Soft(fs, getenv)
	if ok {
		debug.SetMemoryLimit(soft)
	}
	return soft, cgroup, ok
}
