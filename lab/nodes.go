package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"
)

// AddNode adds a node to a running lab: its namespace on the fabric at the
// next free address and, unless the lab runs without agents, its agent
// (waiting until the agent serves).
func (l *Lab) AddNode(ctx context.Context, name string) error {
	if st := l.State(); !st.NoAgents {
		pods := 0
		if len(st.Nodes) > 0 {
			pods = (len(st.Pods) + len(st.Nodes) - 1) / len(st.Nodes)
		}
		if err := checkHostFits(l.log, len(st.Nodes)+1, st.RouteReflectors+st.AutoReflectors*st.Zones, pods); err != nil {
			return fmt.Errorf("adding node %s: %w", name, err)
		}
	}
	if err := l.addNodeNamespace(ctx, name); err != nil {
		return err
	}
	if l.State().NoAgents {
		return nil
	}
	if l.State().AutoReflectors > 0 {
		if err := l.registerZone(ctx, name); err != nil {
			return err
		}
	}
	if err := l.StartAgent(ctx, name); err != nil {
		return err
	}
	return l.waitAgentServing(ctx, name)
}

// RemoveNode takes a node out of the lab: it stops the agent gracefully,
// deletes the node's pods' namespaces (without CNI DEL: the node is going
// away), deletes its Node resource from etcd and its namespace.
func (l *Lab) RemoveNode(ctx context.Context, name string) error {
	st := l.State()
	n := st.Node(name)
	if n == nil {
		return fmt.Errorf("no node %q", name)
	}
	var errs []error
	if err := l.StopKubelet(ctx, name); err != nil {
		errs = append(errs, err)
	}
	if err := l.StopContainerd(ctx, name); err != nil {
		errs = append(errs, err)
	}
	if err := l.StopKubeProxy(ctx, name); err != nil {
		errs = append(errs, err)
	}
	if err := l.StopAgent(ctx, name, syscall.SIGTERM); err != nil {
		errs = append(errs, err)
	}
	var pods []string
	for _, p := range st.Pods {
		if p.Node == name {
			pods = append(pods, p.Name)
			if err := l.deleteNamespace(ctx, p.NetNS); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if !st.NoAgents {
		s, err := l.connect(ctx)
		if err == nil {
			err = removeNodeResource(ctx, s, name)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := l.deleteNamespace(ctx, n.NetNS); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing node %s: %w", name, err)
	}
	progress(l.log, "removed node %s", name)
	if err := l.Update(func(s *State) error {
		s.Nodes = slices.DeleteFunc(s.Nodes, func(x NodeState) bool { return x.Name == name })
		s.Pods = slices.DeleteFunc(s.Pods, func(p PodState) bool { return slices.Contains(pods, p.Name) })
		return nil
	}); err != nil {
		return err
	}
	if err := os.RemoveAll(l.NodeDir(name)); err != nil {
		return fmt.Errorf("removing node directory: %w", err)
	}
	return nil
}
