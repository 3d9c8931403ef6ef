// Package kube adds Kubernetes to a lab (package lab): a control plane in
// the etcd namespace (kube-apiserver on the lab's etcd, controller manager,
// scheduler, a certificate authority of its own), containerd and a kubelet
// on each node, and Tabby deployed from manifests/ the way its README says;
// the demo `tabby-lab demo --kubernetes` and the DaemonSet and pod-start
// tests run on it.
//
// Everything it starts is recorded in the lab's State (ControlPlane, a
// node's Containerd, Kubelet and CgroupRoot), so the lab's Down and
// Teardown remove it from any program, also after this one died.
package kube

import "github.com/tabbynet/tabby/lab"

// Cluster is a lab with Kubernetes parts. It holds no state of its own:
// whatever it starts is in the lab's State. Its methods are safe for
// concurrent use.
type Cluster struct {
	*lab.Lab
}

// New returns the Kubernetes side of l.
func New(l *lab.Lab) *Cluster { return &Cluster{Lab: l} }
