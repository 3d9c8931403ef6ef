// Package manifests holds Tabby's Kubernetes deployment: tabby-etcd.yaml
// (namespace, service account, configuration, etcd TLS secret and the
// tabby-node DaemonSet) and the route-reflector variant's Tabby resources
// in route-reflectors/. The package has no code; its tests decode every
// manifest strictly into the Kubernetes and Tabby API types and check the
// invariants the agent depends on, along with the image's Dockerfile.
package manifests
