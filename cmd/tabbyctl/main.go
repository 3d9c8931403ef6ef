// Command tabbyctl is Tabby's operator CLI, in the manner of calicoctl: it
// reads and writes resources in etcd, reports and repairs IPAM, shows the
// BGP sessions the agents publish, and explains a pod's path.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	a := newApp()
	err := a.rootCmd().ExecuteContext(ctx)
	if cerr := a.close(); err == nil {
		err = cerr
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tabbyctl:", err)
		os.Exit(1)
	}
}
