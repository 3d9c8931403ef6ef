// Package installcni installs Tabby's CNI plugin on a Kubernetes node: it is
// the logic of `tabby-agent install-cni`, which the tabby-node DaemonSet runs
// as an init container with the host's CNI directories mounted.
//
// It copies the `tabby` shim into the host's CNI bin directory, copies the
// chained plugins the network configuration names (portmap) when the host
// lacks them, and writes the network configuration list rendered from a
// template. Every file is written through a temporary file in the same
// directory and a rename, so that the container runtime never sees a partly
// written file and a running plugin binary is never truncated under an exec.
// Install is idempotent: a file whose content and mode are already right is
// not touched (same inode, same mtime). Uninstall removes exactly the files
// Install owns.
package installcni

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/tabbynet/tabby/cni"
)

// Placeholders of the network configuration template.
const (
	// PlaceholderMTU is replaced by the pod interface MTU (a JSON number,
	// so the template writes it without quotes: "mtu": __CNI_MTU__).
	PlaceholderMTU = "__CNI_MTU__"
	// PlaceholderAgentSocket is replaced by the agent's CNI socket path (a
	// JSON string body: "agent_socket": "__AGENT_SOCKET__").
	PlaceholderAgentSocket = "__AGENT_SOCKET__"
)

// DefaultTemplate is the network configuration list written when Config
// names no template: Tabby first, then portmap for hostPort mappings.
const DefaultTemplate = `{
  "name": "k8s-pod-network",
  "cniVersion": "1.0.0",
  "plugins": [
    {
      "type": "tabby",
      "agent_socket": "__AGENT_SOCKET__",
      "mtu": __CNI_MTU__
    },
    {
      "type": "portmap",
      "snat": true,
      "capabilities": {"portMappings": true}
    }
  ]
}
`

// Config says what to install where. The directories are the host's, as
// mounted into the container (/host/opt/cni/bin for the host's /opt/cni/bin).
type Config struct {
	// BinDir is the host's CNI plugin directory.
	BinDir string
	// ConfDir is the host's CNI network configuration directory.
	ConfDir string
	// ConflistName is the file name of the configuration list in ConfDir.
	// The runtime uses the lexically first file there, hence the "10-".
	ConflistName string
	// SourceBinary is the tabby shim to copy into BinDir.
	SourceBinary string
	// PluginsDir holds chained plugins (portmap) to copy into BinDir when
	// the host lacks them; "" = none.
	PluginsDir string
	// Template is the network configuration list with placeholders;
	// "" = DefaultTemplate.
	Template string
	// MTU of pod interfaces, substituted for PlaceholderMTU; 0 lets the
	// agent choose (the underlay's minus the VXLAN overhead while a pool
	// encapsulates, else 1500; docs/vxlan.md).
	MTU int
	// AgentSocket is the agent's CNI socket as the host sees it,
	// substituted for PlaceholderAgentSocket.
	AgentSocket string
}

// PluginName is the file name of the shim in BinDir.
const PluginName = cni.PluginType

// Default returns the configuration of the DaemonSet's init container.
// SourceBinary is left empty: the command fills it in from its executable.
func Default() Config {
	return Config{
		BinDir:       "/host/opt/cni/bin",
		ConfDir:      "/host/etc/cni/net.d",
		ConflistName: "10-tabby.conflist",
		PluginsDir:   "/opt/tabby/cni-plugins",
		MTU:          0,
		AgentSocket:  cni.DefaultAgentSocket,
	}
}

// Validate reports every problem with the configuration for Install and
// Uninstall; Install also needs SourceBinary (see validateInstall).
func (c *Config) Validate() error {
	var errs []error
	for _, d := range []struct{ name, val string }{
		{"cni bin dir", c.BinDir},
		{"cni conf dir", c.ConfDir},
	} {
		if d.val == "" || !filepath.IsAbs(d.val) {
			errs = append(errs, fmt.Errorf("%s: %q must be an absolute path", d.name, d.val))
		}
	}
	if c.ConflistName == "" || strings.ContainsRune(c.ConflistName, '/') || strings.HasPrefix(c.ConflistName, ".") {
		errs = append(errs, fmt.Errorf("conflist name: %q must be a plain file name", c.ConflistName))
	} else if filepath.Ext(c.ConflistName) != ".conflist" {
		// A runtime reads *.conf as a single plugin, not a list.
		errs = append(errs, fmt.Errorf("conflist name: %q must end in .conflist", c.ConflistName))
	}
	if c.PluginsDir != "" && !filepath.IsAbs(c.PluginsDir) {
		errs = append(errs, fmt.Errorf("plugins dir: %q must be an absolute path", c.PluginsDir))
	}
	if c.MTU != 0 && (c.MTU < 68 || c.MTU > 65535) {
		errs = append(errs, fmt.Errorf("mtu: %d is outside 68..65535 (0: the agent chooses)", c.MTU))
	}
	if c.AgentSocket == "" || !filepath.IsAbs(c.AgentSocket) {
		errs = append(errs, fmt.Errorf("agent socket: %q must be an absolute path", c.AgentSocket))
	}
	return errors.Join(errs...)
}

// validateInstall is Validate plus what only Install needs.
func (c *Config) validateInstall() error {
	err := c.Validate()
	if c.SourceBinary == "" {
		err = errors.Join(err, errors.New("source binary: empty"))
	}
	return err
}

func (c *Config) template() string {
	if c.Template == "" {
		return DefaultTemplate
	}
	return c.Template
}

// AddFlags registers the flags of `tabby-agent install-cni` that set c,
// with c's current values as defaults. SourceBinary's default is left to
// the command (the tabby next to its executable).
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.BinDir, "cni-bin-dir", c.BinDir, "the host's CNI plugin directory, as mounted")
	fs.StringVar(&c.ConfDir, "cni-conf-dir", c.ConfDir, "the host's CNI configuration directory, as mounted")
	fs.StringVar(&c.ConflistName, "conflist-name", c.ConflistName, "file name of the configuration list (env CNI_CONF_NAME)")
	fs.IntVar(&c.MTU, "mtu", c.MTU, "MTU of pod interfaces, 0 = the agent chooses: the VXLAN tunnel's while a pool encapsulates, else 1500 (env CNI_MTU)")
	fs.StringVar(&c.AgentSocket, "agent-socket", c.AgentSocket, "the agent's CNI socket as the host sees it")
	fs.StringVar(&c.SourceBinary, "source-binary", c.SourceBinary, "the tabby binary to install (default: tabby next to this executable)")
	fs.StringVar(&c.PluginsDir, "plugins-dir", c.PluginsDir, "chained plugins to copy when the host lacks them (\"\" = none)")
	fs.StringVar(&c.Template, "cni-network-config", c.Template, "configuration list template (env CNI_NETWORK_CONFIG; default: tabby then portmap)")
}
