package dataplane

import (
	"fmt"
	"strconv"
)

// The kernel keeps a TCP-MD5 key per signed peer on the BGP listening
// socket and charges each to the socket's option memory, which
// net.core.optmem_max (a per-namespace sysctl since Linux 6.9; 128 KiB by
// default) caps: a route reflector stopped taking keys at 960 signed
// clients ("failed to set md5 … cannot allocate memory" from GoBGP, the
// clients' SYNs then dropped; docs/scale.md). The kernel charges ≈ 136 bytes
// per IPv4 key on 6.x; md5KeyOptmem leaves room for larger ones.
const (
	optmemPath     = "net/core/optmem_max"
	md5KeyOptmem   = 256
	optmemHeadroom = 64 << 10
)

// OptmemFor is the net.core.optmem_max that fits keys TCP-MD5 keys on one
// socket plus the socket's other options.
func OptmemFor(keys int) int {
	return max(keys, 0)*md5KeyOptmem + optmemHeadroom
}

// EnsureMD5KeyRoom raises net.core.optmem_max in the network namespace at
// netnsPath ("" = the calling thread's) to OptmemFor(keys) when it is
// lower; it never lowers it. It returns the value in force.
func EnsureMD5KeyRoom(netnsPath string, keys int) (int, error) {
	nsh, err := openNetNS(netnsPath)
	if err != nil {
		return 0, err
	}
	defer nsh.Close()
	var cur int
	err = withNetNS(nsh, func() error {
		s, err := readSysctl(optmemPath)
		if err != nil {
			return err
		}
		if cur, err = strconv.Atoi(s); err != nil {
			return fmt.Errorf("sysctl net.core.optmem_max: %q: %w", s, err)
		}
		if want := OptmemFor(keys); cur < want {
			if err := writeSysctl(optmemPath, strconv.Itoa(want)); err != nil {
				return err
			}
			cur = want
		}
		return nil
	})
	return cur, err
}
