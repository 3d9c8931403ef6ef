// Command pause is the lab's pod sandbox process (the image
// registry.k8s.io/pause:3.10 that internal/cmd/mkimage builds, since no
// registry is reachable): it holds the pod's namespaces open by doing
// nothing until SIGTERM or SIGINT, and as PID 1 of a pod that shares its PID
// namespace it reaps the orphans re-parented to it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() { run(nil) }

// run returns on SIGTERM or SIGINT (then pause exits 0); ready, if not nil,
// is called once the signals are caught.
func run(ready func()) {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	if ready != nil {
		ready()
	}
	for s := range sigs {
		if s != syscall.SIGCHLD {
			return
		}
		reap()
	}
}

// reap waits for every child that has exited: signals coalesce, so one
// SIGCHLD may stand for several.
func reap() {
	for {
		pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
