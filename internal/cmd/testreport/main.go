// Command testreport is make test's reporter (not shipped): it turns each
// tier's `go test -json` stream into a readable report and a record, and
// prints the summary of all tiers at the end.
//
//	go test -json … | testreport run TIER RECORD.json
//	testreport skip TIER RECORD.json REASON…
//	testreport summary RECORD.json…
package main

import (
	"fmt"
	"os"

	"github.com/tabbynet/tabby/internal/testreport"
)

func main() {
	code, err := testreport.Main(os.Args[1:], os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
	}
	os.Exit(code)
}
