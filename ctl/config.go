package ctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/cmdutil"
)

// Environment variables tabbyctl reads, and the default config file.
const (
	EnvEndpoints     = "TABBY_ETCD_ENDPOINTS"
	EnvCAFile        = "TABBY_ETCD_CA_FILE"
	EnvCertFile      = "TABBY_ETCD_CERT_FILE"
	EnvKeyFile       = "TABBY_ETCD_KEY_FILE"
	DefaultConfig    = "/etc/tabby/tabbyctl.yaml"
	DefaultEndpoint  = "http://127.0.0.1:2379"
	DefaultTimeout   = 5 * time.Second
	probeDialTimeout = 2 * time.Second
)

// Config is how tabbyctl reaches etcd. It is read from a YAML file with the
// same keys as the command-line flags.
type Config struct {
	Endpoints StringList `json:"etcd-endpoints,omitempty"`
	CAFile    string     `json:"etcd-ca-file,omitempty"`
	CertFile  string     `json:"etcd-cert-file,omitempty"`
	KeyFile   string     `json:"etcd-key-file,omitempty"`
}

// StringList is a list written either as a YAML list or as one
// comma-separated string.
type StringList []string

// UnmarshalJSON implements json.Unmarshaler.
func (l *StringList) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*l = SplitList(s)
		return nil
	}
	var list []string
	if err := json.Unmarshal(b, &list); err != nil {
		return errors.New("want a list of strings or one comma-separated string")
	}
	*l = list
	return nil
}

// SplitList splits a comma-separated list, dropping empty items and spaces
// (the commands' one rule: cmdutil.SplitList).
func SplitList(s string) []string { return cmdutil.SplitList(s) }

// LoadConfigFile reads a config file. Unknown keys are errors.
func LoadConfigFile(path string) (Config, error) {
	var c Config
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("reading config file: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return c, fmt.Errorf("config file %s: %w", path, err)
	}
	return c, nil
}

// ConfigSources are the places a setting can come from, highest precedence
// first: flags the user set, the environment, the config file.
type ConfigSources struct {
	// Flags holds the values of the flags the user set; empty fields were
	// not set.
	Flags Config
	// Getenv reads the environment (os.Getenv).
	Getenv func(string) string
	// File is the config file; "" = DefaultFile if it exists.
	File string
	// DefaultFile is the config file read when File is "" and it exists;
	// "" = DefaultConfig.
	DefaultFile string
}

// Resolve merges the sources into a datastore configuration.
func (src ConfigSources) Resolve() (datastore.Config, error) {
	var file Config
	path, explicit := src.File, src.File != ""
	if !explicit {
		path = src.DefaultFile
		if path == "" {
			path = DefaultConfig
		}
	}
	if _, err := os.Stat(path); err == nil || explicit {
		c, err := LoadConfigFile(path)
		if err != nil {
			return datastore.Config{}, err
		}
		file = c
	}
	getenv := src.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	env := Config{
		Endpoints: SplitList(getenv(EnvEndpoints)),
		CAFile:    getenv(EnvCAFile),
		CertFile:  getenv(EnvCertFile),
		KeyFile:   getenv(EnvKeyFile),
	}
	pick := func(vals ...string) string {
		for _, v := range vals {
			if v != "" {
				return v
			}
		}
		return ""
	}
	cfg := datastore.Config{
		CAFile:   pick(src.Flags.CAFile, env.CAFile, file.CAFile),
		CertFile: pick(src.Flags.CertFile, env.CertFile, file.CertFile),
		KeyFile:  pick(src.Flags.KeyFile, env.KeyFile, file.KeyFile),
	}
	for _, eps := range [][]string{src.Flags.Endpoints, env.Endpoints, file.Endpoints, {DefaultEndpoint}} {
		if len(eps) > 0 {
			cfg.Endpoints = append([]string(nil), eps...)
			break
		}
	}
	return cfg, nil
}

// Probe checks that at least one endpoint accepts a connection, so that an
// unreachable etcd is reported at once with the cause for each endpoint
// instead of after the client's dial timeout. It returns nil as soon as
// one endpoint answers.
func Probe(endpoints []string, timeout time.Duration) error {
	var errs []error
	for _, ep := range endpoints {
		network, addr, err := dialTarget(ep)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ep, err))
			continue
		}
		c, err := net.DialTimeout(network, addr, timeout)
		if err != nil {
			errs = append(errs, fmt.Errorf("cannot reach etcd at %s: %w", ep, err))
			continue
		}
		return c.Close()
	}
	return errors.Join(errs...)
}

// dialTarget turns an etcd endpoint URL into what net.Dial takes.
func dialTarget(ep string) (network, addr string, err error) {
	u, err := url.Parse(ep)
	if err != nil {
		return "", "", fmt.Errorf("invalid endpoint: %w", err)
	}
	switch u.Scheme {
	case "unix", "unixs":
		p := u.Path
		if p == "" {
			p = u.Host + u.Opaque
		}
		return "unix", p, nil
	case "http", "https":
		host := u.Host
		if u.Port() == "" {
			host = net.JoinHostPort(u.Hostname(), "2379")
		}
		return "tcp", host, nil
	}
	return "", "", fmt.Errorf("invalid endpoint: unsupported scheme %q (want http, https or unix)", u.Scheme)
}
