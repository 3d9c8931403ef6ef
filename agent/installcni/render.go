package installcni

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/libcni"

	"github.com/tabbynet/tabby/cni"
)

// Conflist is what the installer needs to know of a network configuration
// list.
type Conflist struct {
	Name       string
	CNIVersion string
	// PluginTypes are the plugins of the chain in order; the first is tabby.
	PluginTypes []string
	// Tabby is Tabby's entry as the shim will parse it.
	Tabby *cni.NetConf
}

var leftover = regexp.MustCompile(`__[A-Z0-9_]+__`)

// Render substitutes the placeholders of a network configuration list
// template and checks the result with ParseConflist. A placeholder it does
// not know is an error rather than a broken file on the node.
func Render(template string, mtu int, agentSocket string) ([]byte, *Conflist, error) {
	sock, err := json.Marshal(agentSocket)
	if err != nil {
		return nil, nil, fmt.Errorf("rendering network configuration: %w", err)
	}
	out := strings.NewReplacer(
		PlaceholderMTU, strconv.Itoa(mtu),
		// The placeholder sits inside a JSON string: insert the escaped
		// body without its quotes.
		PlaceholderAgentSocket, string(sock[1:len(sock)-1]),
	).Replace(template)
	if m := leftover.FindAllString(out, -1); len(m) > 0 {
		return nil, nil, fmt.Errorf("rendering network configuration: unknown placeholders %s (known: %s, %s)",
			strings.Join(m, ", "), PlaceholderMTU, PlaceholderAgentSocket)
	}
	if !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	cl, err := ParseConflist([]byte(out))
	if err != nil {
		return nil, nil, fmt.Errorf("rendering network configuration: %w", err)
	}
	return []byte(out), cl, nil
}

// ParseConflist checks a network configuration list the way a container
// runtime loads it (libcni) and requires Tabby as the first plugin, with a
// configuration the shim accepts.
func ParseConflist(data []byte) (*Conflist, error) {
	list, err := libcni.ConfListFromBytes(data)
	if err != nil {
		return nil, fmt.Errorf("parsing conflist: %w", err)
	}
	if len(list.Plugins) == 0 {
		return nil, errors.New("parsing conflist: no plugins")
	}
	cl := &Conflist{Name: list.Name, CNIVersion: list.CNIVersion}
	for i, p := range list.Plugins {
		if p.Network.Type == "" {
			return nil, fmt.Errorf("parsing conflist: plugin %d has no type", i+1)
		}
		cl.PluginTypes = append(cl.PluginTypes, p.Network.Type)
	}
	if cl.PluginTypes[0] != cni.PluginType {
		return nil, fmt.Errorf("parsing conflist: the first plugin is %q, want %q (the chain starts with the plugin that creates the interface)",
			cl.PluginTypes[0], cni.PluginType)
	}
	// The runtime hands each plugin its own entry plus the list's name and
	// cniVersion; parse Tabby's entry exactly so.
	var entry map[string]any
	if err := json.Unmarshal(list.Plugins[0].Bytes, &entry); err != nil {
		return nil, fmt.Errorf("parsing conflist: tabby entry: %w", err)
	}
	entry["name"], entry["cniVersion"] = list.Name, list.CNIVersion
	b, err := json.Marshal(entry)
	if err != nil {
		return nil, fmt.Errorf("parsing conflist: tabby entry: %w", err)
	}
	nc, err := cni.ParseNetConf(b)
	if err != nil {
		return nil, fmt.Errorf("parsing conflist: tabby entry: %w", err)
	}
	cl.Tabby = nc
	return cl, nil
}
