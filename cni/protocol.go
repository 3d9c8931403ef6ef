package cni

import (
	"context"
	"encoding/json"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// maxMessageSize bounds one request or response on the socket.
const maxMessageSize = 4 << 20

// AddSteps are the steps of the agent's ADD whose times its "workload
// added" log record carries, each under its own name, in the plan's order
// (tabby-lab bench cni reads them; the agent's TestAddStepsLogged keeps
// the list and the plan together).
var AddSteps = []string{"request", "assign", "prepare", "view", "complete", "routes", "endpoint", "prime", "policy"}

// Request is what the shim sends the agent: one CNI invocation, as the
// runtime gave it to the plugin. One Request per connection.
type Request struct {
	Command     string `json:"command"` // ADD, DEL, CHECK, STATUS or GC
	ContainerID string `json:"containerID,omitempty"`
	Netns       string `json:"netns,omitempty"`
	IfName      string `json:"ifName,omitempty"`
	Args        string `json:"args,omitempty"` // CNI_ARGS
	Path        string `json:"path,omitempty"` // CNI_PATH
	StdinData   []byte `json:"stdinData"`      // the network configuration
	// Deadline is when the shim stops waiting; the agent gives the Handler
	// the same deadline. Zero means the configuration's timeout from now.
	Deadline time.Time `json:"deadline,omitzero"`
}

// Response is the agent's answer: the result (ADD only), already encoded in
// the cniVersion of the request, or a CNI error.
type Response struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *types.Error    `json:"error,omitempty"`
}

// Handler carries out CNI commands in the agent. The Server calls ADD, DEL
// and CHECK of one container ID one at a time, and those of different
// containers concurrently; STATUS and GC are not serialised. ctx carries the
// request's deadline. A returned *types.Error reaches the runtime unchanged;
// any other error becomes a CNI error with its message.
type Handler interface {
	// Add attaches the workload and returns its result in any version; the
	// server converts it to the request's version.
	Add(ctx context.Context, req *Request, conf *NetConf, args *Args) (*current.Result, error)
	// Del detaches the workload; it must be idempotent. conf.PrevResult is
	// the cached result converted to the current version, or nil.
	Del(ctx context.Context, req *Request, conf *NetConf, args *Args) error
	// Check verifies the attachment described by prev (never nil).
	Check(ctx context.Context, req *Request, conf *NetConf, args *Args, prev *current.Result) error
	// Status reports whether the plugin can serve ADD requests.
	Status(ctx context.Context, conf *NetConf) error
	// GC removes attachments of this network other than valid.
	GC(ctx context.Context, conf *NetConf, valid []types.GCAttachment) error
}
