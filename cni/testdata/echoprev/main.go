// Command echoprev is a test CNI plugin for the second place of a chain: it
// records every invocation's stdin in record_dir/<COMMAND>.json, and on ADD
// passes the prevResult on with the DNS domain "echoprev.test" added, so a
// test can see that the chain ran and that the result flowed through it.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

type conf struct {
	types.PluginConf
	RecordDir string `json:"record_dir"`
}

func parse(cmd string, a *skel.CmdArgs) (*conf, error) {
	var c conf
	if err := json.Unmarshal(a.StdinData, &c); err != nil {
		return nil, fmt.Errorf("decoding config: %w", err)
	}
	if c.RecordDir != "" {
		if err := os.WriteFile(filepath.Join(c.RecordDir, cmd+".json"), a.StdinData, 0o600); err != nil {
			return nil, err
		}
	}
	if err := version.ParsePrevResult(&c.PluginConf); err != nil {
		return nil, err
	}
	return &c, nil
}

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add: func(a *skel.CmdArgs) error {
			c, err := parse("ADD", a)
			if err != nil {
				return err
			}
			if c.PrevResult == nil {
				return errors.New("echoprev must follow another plugin: no prevResult")
			}
			res, err := current.NewResultFromResult(c.PrevResult)
			if err != nil {
				return err
			}
			res.DNS.Domain = "echoprev.test"
			return types.PrintResult(res, c.CNIVersion)
		},
		Del:    func(a *skel.CmdArgs) error { _, err := parse("DEL", a); return err },
		Check:  func(a *skel.CmdArgs) error { _, err := parse("CHECK", a); return err },
		Status: func(a *skel.CmdArgs) error { _, err := parse("STATUS", a); return err },
		GC:     func(a *skel.CmdArgs) error { _, err := parse("GC", a); return err },
	}, version.All, "echoprev test plugin")
}
