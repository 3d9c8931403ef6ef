// Command tabbyctl is Tabby's operator CLI, in the manner of calicoctl: it
// reads and writes resources in etcd, reports and repairs IPAM, shows the
// BGP sessions the agents publish, and explains a pod's path.
package main

import (
	"context"

	"github.com/tabbynet/tabby/internal/cmdutil"
)

func main() {
	cmdutil.Main("tabbyctl", func(ctx context.Context) error {
		a := newApp()
		err := a.rootCmd().ExecuteContext(ctx)
		if cerr := a.close(); err == nil {
			err = cerr
		}
		return err
	})
}
