package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/kube"
	"github.com/tabbynet/tabby/kube/kubetest"
	"github.com/tabbynet/tabby/lab"
)

// TestKubeNodeDeletion: tabby-kube-controllers (against a real
// kube-apiserver) and a 3-node lab share the lab's etcd. Deleting the
// Kubernetes Node of a node whose agent is gone makes the controllers delete
// its Tabby Node, and the agents' node GC then releases its endpoint,
// addresses and blocks after the grace. Deleting the Kubernetes Node of a
// node whose agent still runs deletes its Tabby Node too, but node GC keeps
// everything while the agent's liveness record is there (no address is
// freed under a running agent, which would hand it out twice); once that
// agent stops, the node is released. docs/agent.md describes this gap.
func TestKubeNodeDeletion(t *testing.T) {
	testkit.RequirePrivileged(t, "ip", "nsenter", "ping")
	srv := kubetest.Start(t) // skips when kube-apiserver is not built
	l := upLab(t, lab.Options{Name: "c19kube", Nodes: 3, PodsPerNode: 1, AgentArgs: []string{"--node-gc-grace", churnGrace.String()}})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	kc := srv.Client
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tabby-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range l.State().Nodes {
		if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := kube.Default()
	cfg.Identity = "c19"
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 4*time.Second, 3*time.Second, 500*time.Millisecond
	// Address GC stays out of the way: the lab's pods are not
	// Kubernetes pods.
	cfg.GCInterval, cfg.GCGrace = time.Hour, 60*time.Second
	var log *slog.Logger
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	cctx, stopCtrl := context.WithCancel(ctx)
	ctrlDone := make(chan error, 1)
	go func() { ctrlDone <- kube.RunWith(cctx, cfg, kc, l.Store(), log) }()
	defer func() {
		stopCtrl()
		if err := <-ctrlDone; err != nil {
			t.Errorf("controllers: %v", err)
		}
	}()
	for _, n := range []string{"node2", "node3"} {
		testkit.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "the Tabby node "+n+" marked as the Kubernetes node's", func() error {
			tn, err := datastore.GetAs[*api.Node](ctx, l.Store(), api.KindNode, "", n)
			if err == nil && tn.Metadata.Annotations[api.AnnotationKubeNode] != n {
				err = fmt.Errorf("annotations %v", tn.Metadata.Annotations)
			}
			return err
		})
	}
	al := ipam.New(l.Store())
	holds := func(n string) bool {
		left, err := nodeLeftovers(ctx, l, al, n)
		return err == nil && len(left) > 0
	}
	if !holds("node2") || !holds("node3") {
		t.Fatal("node2 and node3 should hold a pod's endpoint, address and block")
	}

	// The path: node3's machine is gone (agent stopped), then its
	// Kubernetes Node is deleted.
	if err := l.StopAgent(ctx, "node3", syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := kc.CoreV1().Nodes().Delete(ctx, "node3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "the controllers to delete the Tabby node node3", func() error {
		if _, err := l.Store().Get(ctx, api.KindNode, "", "node3"); !errors.Is(err, datastore.ErrNotFound) {
			return fmt.Errorf("still there (err %v)", err)
		}
		return nil
	})
	at, err := waitReclaimed(ctx, l, "node3", churnGrace+2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node3 released %s after its Kubernetes Node was deleted (node gc grace %s)", at.Sub(start).Round(100*time.Millisecond), churnGrace)

	// The gap: node2's Kubernetes Node is deleted while its agent runs.
	if err := kc.CoreV1().Nodes().Delete(ctx, "node2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "the controllers to delete the Tabby node node2", func() error {
		if _, err := l.Store().Get(ctx, api.KindNode, "", "node2"); !errors.Is(err, datastore.ErrNotFound) {
			return fmt.Errorf("still there (err %v)", err)
		}
		return nil
	})
	time.Sleep(churnGrace + 5*time.Second) // past the grace: nothing may go
	if !holds("node2") {
		t.Fatal("node GC released a node whose agent still runs")
	}
	t.Logf("node2 (Kubernetes Node deleted, agent running) still holds its addresses 5s after the grace")
	start = time.Now()
	if err := l.StopAgent(ctx, "node2", syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if at, err = waitReclaimed(ctx, l, "node2", churnGrace+2*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("node2 released %s after its agent stopped", at.Sub(start).Round(100*time.Millisecond))
	if !holds("node1") {
		t.Error("node1 lost its pod's state")
	}
}
