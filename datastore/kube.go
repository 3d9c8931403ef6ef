package datastore

import "net/url"

// Records that tabby-kube-controllers writes for the agents (api.KubePod,
// api.KubeNamespace as JSON). They are not resources: the agents' view
// (package syncer) leaves them out, and the agent reads a pod's record only
// at its CNI ADD.
const (
	// KubePrefix holds every record tabby-kube-controllers keeps.
	KubePrefix = "kube/"
	// KubePodsPrefix holds kube/pods/<namespace>/<name>.
	KubePodsPrefix = "kube/pods/"
	// KubeNamespacesPrefix holds kube/namespaces/<name>.
	KubeNamespacesPrefix = "kube/namespaces/"
)

// KubeNodePodsPrefix holds kube/nodepods/<node>/<namespace>/<name>: the
// record of each pod scheduled to a node, beside its kube/pods/ record,
// written with it in one transaction. An agent watches its own node's
// (KubeNodePodsPrefixOf), a few dozen keys, rather than every pod of the
// cluster: its CNI ADD then finds the pod's record in memory.
const KubeNodePodsPrefix = "kube/nodepods/"

// KubeNodePodsPrefixOf is the prefix of the records of node's pods.
func KubeNodePodsPrefixOf(node string) string { return KubeNodePodsPrefix + url.PathEscape(node) + "/" }

// KubeNodePodKey is where the record of pod namespace/name, scheduled to
// node, lives beside KubePodKey's.
func KubeNodePodKey(node, namespace, name string) string {
	return KubeNodePodsPrefixOf(node) + url.PathEscape(namespace) + "/" + url.PathEscape(name)
}

// KubePodKey is where the record of pod namespace/name lives.
func KubePodKey(namespace, name string) string {
	return KubePodsPrefix + url.PathEscape(namespace) + "/" + url.PathEscape(name)
}

// KubeNamespaceKey is where the record of namespace name lives.
func KubeNamespaceKey(name string) string { return KubeNamespacesPrefix + url.PathEscape(name) }

// KubeMarkerKey exists while tabby-kube-controllers manage this cluster:
// the leader writes it (api.KubeMarker). Agents then require a pod record
// at CNI ADD for every Kubernetes pod; without it they build endpoints from
// the CNI arguments alone, as outside Kubernetes.
const KubeMarkerKey = "kube/controllers"
