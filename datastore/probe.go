package datastore

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
)

// probeTimeout bounds each diagnostic dial of probeEndpoints.
const probeTimeout = time.Second

// probeEndpoints dials each endpoint directly (TCP, TLS handshake where the
// endpoint is https) and describes the failures, "" when every dial works.
func probeEndpoints(endpoints []string, tlsCfg *tls.Config) string {
	var out []string
	for _, ep := range endpoints {
		if err := probe(ep, tlsCfg); err != nil {
			out = append(out, fmt.Sprintf("%s: %v", ep, err))
		}
	}
	return strings.Join(out, "; ")
}

func probe(ep string, tlsCfg *tls.Config) error {
	u, err := url.Parse(ep)
	if err != nil {
		return err
	}
	network, addr := "tcp", u.Host
	if u.Scheme == "unix" || u.Scheme == "unixs" {
		network, addr = "unix", u.Host+u.Path
	}
	d := &net.Dialer{Timeout: probeTimeout}
	if tlsCfg == nil || u.Scheme == "http" || u.Scheme == "unix" {
		conn, err := d.Dial(network, addr)
		if err != nil {
			return err
		}
		return conn.Close()
	}
	c := tlsCfg.Clone()
	if c.ServerName == "" && network == "tcp" {
		c.ServerName = u.Hostname()
	}
	conn, err := tls.DialWithDialer(d, network, addr, c)
	if err != nil {
		return err
	}
	return conn.Close()
}
