// Command tabby is the CNI plugin that container runtimes exec: it forwards
// each CNI request to the tabby-agent of the node and prints the answer.
package main

import (
	"github.com/tabbynet/tabby/cni"
	"github.com/tabbynet/tabby/internal/version"
)

func main() {
	cni.BuildVersion = version.String()
	cni.PluginMain()
}
