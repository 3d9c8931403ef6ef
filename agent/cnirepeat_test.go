package agent

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/agent/attach"
	"github.com/tabbynet/tabby/api"
)

// A repeated ADD for a live container that fails, at any step, leaves the
// pod as it was: its address, interfaces, routes and endpoint. Only a
// successful ADD replaces, only DEL removes.
func TestCNIFailedRepeatedAddKeepsLivePod(t *testing.T) {
	ctx := context.Background()
	for _, step := range []string{"request", "assign", "prior", "prepare", "dataplane-setup", "complete", "routes", "endpoint", "policy", "policy-gate", "endpoint-write"} {
		t.Run(step, func(t *testing.T) {
			e := newHandlerEnv(t)
			req, conf, args := addReq("c1")
			res, err := e.h.Add(ctx, req, conf, args)
			if err != nil {
				t.Fatalf("first ADD: %v", err)
			}
			before := struct {
				Links, Routes string
				Endpoint      api.WorkloadEndpointSpec
				Labels        map[string]string
			}{e.wl.String(), e.routes.String(), e.endpoints(t)[0].Spec, e.endpoints(t)[0].Metadata.Labels}

			injected := errors.New("injected failure at " + step)
			switch step {
			case "dataplane-setup":
				e.wl.SetFail("Setup", injected)
			case "policy-gate":
				e.h.policy = attach.PolicyFunc(func(context.Context, *api.WorkloadEndpoint, int64, int64) error { return injected })
			case "endpoint-write":
				// The repeat carries new labels, and fails after writing them.
				args.Labels = map[string]string{"app": "other"}
				e.h.policy = attach.PolicyFunc(func(context.Context, *api.WorkloadEndpoint, int64, int64) error { return injected })
			default:
				e.h.runner.Fault = func(s string) error {
					if s == step {
						return injected
					}
					return nil
				}
			}
			if _, err := e.h.Add(ctx, req, conf, args); err == nil {
				t.Fatal("repeated ADD succeeded despite the injected failure")
			}
			e.wl.SetFail("Setup", nil)
			e.h.runner.Fault, e.h.policy = nil, nil

			weps := e.endpoints(t)
			if len(weps) != 1 {
				t.Fatalf("%d endpoints after the failed repeat, want the live pod's", len(weps))
			}
			after := struct {
				Links, Routes string
				Endpoint      api.WorkloadEndpointSpec
				Labels        map[string]string
			}{e.wl.String(), e.routes.String(), weps[0].Spec, weps[0].Metadata.Labels}
			if d := cmp.Diff(before, after); d != "" {
				t.Errorf("the failed repeated ADD changed the live pod (-before +after):\n%s", d)
			}
			addrs, err := e.h.ipam.AddressesByHandle(ctx, ipamHandle(conf.Name, req.ContainerID))
			if err != nil || len(addrs) != 1 || addrs[0].String() != res.IPs[0].Address.IP.String() {
				t.Errorf("the live pod's handle holds %v (%v), want %v", addrs, err, res.IPs[0].Address.IP)
			}
			// DEL still removes everything.
			if err := e.h.Del(ctx, req, conf, args); err != nil {
				t.Fatal(err)
			}
			if n := len(e.endpoints(t)); n != 0 || e.wl.String() != "" {
				t.Errorf("after DEL: %d endpoints, links %q", n, e.wl.String())
			}
		})
	}
}
