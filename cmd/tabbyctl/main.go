// Command tabbyctl is Tabby's operator CLI.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tabbyctl:", err)
		os.Exit(1)
	}
}
