package testkit

import (
	"syscall"
	"time"
)

// ProcessCPU is this process's CPU time so far, user and system (system
// time includes the kernel's work in the process's own system calls, such
// as a netlink dump).
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
