package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// ReasonTabbyUp is the reason of the NetworkUnavailable=False condition
// the controller sets on a node whose agent runs.
const ReasonTabbyUp = "TabbyIsUp"

// syncNode marks the Tabby Node of a Kubernetes Node as belonging to it,
// deletes a marked Tabby Node whose Kubernetes Node is gone (the agents'
// node GC then releases its blocks and addresses), and clears
// NetworkUnavailable once the node's agent publishes its status.
func (c *controller) syncNode(ctx context.Context, name string) error {
	kn, err := c.nodes.Get(name)
	tn, tabbyHas := c.view.Node(name)
	if isNotFound(err) {
		if !tabbyHas || tn.Metadata.Annotations[api.AnnotationKubeNode] != name {
			return nil // not ours to delete: a node outside Kubernetes
		}
		// Ask the API server itself, not the cache, before deleting.
		if _, gerr := c.kc.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); !isNotFound(gerr) {
			return gerr
		}
		err := c.store.Delete(ctx, api.KindNode, "", name, tn.Metadata.ResourceVersion)
		if err != nil && !errors.Is(err, datastore.ErrNotFound) {
			return fmt.Errorf("deleting node %s: %w", name, err)
		}
		c.log.Info("deleted the Tabby node of a deleted Kubernetes node", "node", name)
		return nil
	}
	if err != nil {
		return err
	}
	if !tabbyHas {
		return nil
	}
	if tn.Metadata.Annotations[api.AnnotationKubeNode] != name {
		n := *tn
		n.Metadata.Annotations = maps.Clone(tn.Metadata.Annotations)
		if n.Metadata.Annotations == nil {
			n.Metadata.Annotations = map[string]string{}
		}
		n.Metadata.Annotations[api.AnnotationKubeNode] = name
		if _, err := datastore.UpdateAs(ctx, c.store, &n); err != nil && !errors.Is(err, datastore.ErrNotFound) {
			return fmt.Errorf("marking node %s: %w", name, err)
		}
	}
	if networkAvailable(kn) {
		return nil
	}
	if _, err := c.store.GetKV(ctx, datastore.NodeStatusKey(name)); errors.Is(err, datastore.ErrNotFound) {
		return nil // its agent does not run (yet): the GC tick looks again
	} else if err != nil {
		return err
	}
	return c.clearNetworkUnavailable(ctx, name)
}

func networkAvailable(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeNetworkUnavailable {
			return cond.Status == corev1.ConditionFalse
		}
	}
	return false
}

func (c *controller) clearNetworkUnavailable(ctx context.Context, name string) error {
	now := metav1.NewTime(time.Now())
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: ReasonTabbyUp,
		Message: "tabby-agent runs on this node", LastTransitionTime: now, LastHeartbeatTime: now,
	}}}})
	if err != nil {
		return err
	}
	if _, err := c.kc.CoreV1().Nodes().PatchStatus(ctx, name, patch); err != nil {
		return fmt.Errorf("clearing NetworkUnavailable of node %s: %w", name, err)
	}
	c.log.Info("cleared NetworkUnavailable", "node", name)
	return nil
}
