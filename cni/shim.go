package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// BuildVersion is printed by the plugin when run without CNI_COMMAND;
// cmd/tabby sets it from internal/version before calling PluginMain.
var BuildVersion = "dev"

// PluginMain runs the tabby CNI plugin: it reads the CNI request from the
// environment and stdin, forwards it to tabby-agent and prints the result or
// a CNI error (then exits non-zero). It is all of cmd/tabby's main.
func PluginMain() {
	s := &shim{stdout: os.Stdout}
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    s.handler("ADD"),
		Del:    s.handler("DEL"),
		Check:  s.handler("CHECK"),
		Status: s.handler("STATUS"),
		GC:     s.handler("GC"),
	}, version.PluginSupports(SupportedVersions...), "CNI plugin tabby "+BuildVersion+" (forwards to tabby-agent)")
}

// shim turns one skel invocation into one request to the agent.
type shim struct {
	stdout io.Writer
}

func (s *shim) handler(cmd string) func(*skel.CmdArgs) error {
	return func(a *skel.CmdArgs) error { return s.run(context.Background(), cmd, a) }
}

// run forwards one command. Every error it returns is a *types.Error.
func (s *shim) run(ctx context.Context, cmd string, a *skel.CmdArgs) error {
	req := &Request{
		Command:     cmd,
		ContainerID: a.ContainerID,
		Netns:       a.Netns,
		IfName:      a.IfName,
		Args:        a.Args,
		Path:        a.Path,
		StdinData:   a.StdinData,
	}
	// Validate locally so that a broken configuration is reported as such
	// even when the agent is down.
	conf, _, _, err := parseRequest(req)
	if err != nil {
		return err
	}
	timeout := conf.Timeout(cmd)
	req.Deadline = time.Now().Add(timeout)
	ctx, cancel := context.WithDeadline(ctx, req.Deadline)
	defer cancel()

	resp, err := roundTrip(ctx, conf.AgentSocket, req, timeout)
	if err != nil {
		return err
	}
	if resp.Error != nil {
		return resp.Error
	}
	if cmd != "ADD" {
		return nil
	}
	if len(resp.Result) == 0 {
		return types.NewError(types.ErrInternal, "tabby-agent answered ADD without a result", "")
	}
	var out bytes.Buffer
	if err := json.Indent(&out, resp.Result, "", "    "); err != nil {
		return types.NewError(types.ErrDecodingFailure, "tabby-agent sent a malformed result", err.Error())
	}
	out.WriteByte('\n')
	if _, err := out.WriteTo(s.stdout); err != nil {
		return types.NewError(types.ErrIOFailure, "writing the result", err.Error())
	}
	return nil
}

// roundTrip sends req to the agent at path and reads its response. Errors
// are *types.Error that tell the operator what to look at.
func roundTrip(ctx context.Context, path string, req *Request, timeout time.Duration) (*Response, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		code := types.ErrTryAgainLater
		if req.Command == "STATUS" {
			code = types.ErrPluginNotAvailable
		}
		return nil, types.NewError(code, fmt.Sprintf("cannot reach tabby-agent at %s", path), fmt.Sprintf(
			"%v. Is the tabby-node pod running on this node "+
				"(kubectl get pods -A -o wide | grep tabby-node)? Is the socket path right (agent_socket in the CNI network "+
				"configuration, default %s)? The plugin must run as root to open the socket.",
			err, DefaultAgentSocket))
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			return nil, types.NewError(types.ErrIOFailure, "setting the socket deadline", err.Error())
		}
	}

	ioErr := func(what string, err error) error {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return types.NewError(types.ErrTryAgainLater,
				fmt.Sprintf("tabby-agent at %s did not finish %s within %s", path, req.Command, timeout),
				"the agent accepted the request but did not answer in time; see the tabby-node pod's log "+
					"for this container ID, or raise timeout_seconds in the CNI network configuration")
		}
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("%s tabby-agent at %s", what, path),
			fmt.Sprintf("%v; the agent may have restarted, see the tabby-node pod's log", err))
	}
	payload, err := json.Marshal(req)
	if err != nil {
		return nil, types.NewError(types.ErrInternal, "encoding the request", err.Error())
	}
	if _, err := conn.Write(payload); err != nil {
		return nil, ioErr("sending the request to", err)
	}
	if uc, ok := conn.(*net.UnixConn); ok {
		// Tell the agent the request is complete; a failure here is harmless.
		_ = uc.CloseWrite()
	}
	raw, err := io.ReadAll(io.LimitReader(conn, maxMessageSize+1))
	if err != nil {
		return nil, ioErr("reading the answer of", err)
	}
	if len(raw) == 0 {
		return nil, types.NewError(types.ErrIOFailure,
			fmt.Sprintf("tabby-agent at %s closed the connection without answering %s", path, req.Command),
			"the agent may have restarted or crashed; see the tabby-node pod's log")
	}
	if len(raw) > maxMessageSize {
		return nil, types.NewError(types.ErrDecodingFailure, "the answer of tabby-agent is too large",
			fmt.Sprintf("more than %d bytes", maxMessageSize))
	}
	var resp Response
	if err := json.Unmarshal(raw, &resp); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decoding the answer of tabby-agent", err.Error())
	}
	return &resp, nil
}
