#!/bin/sh
# Builds kube-apiserver for the Kubernetes test tier from the module proxy
# (scripts/kube-build: k8s.io/kubernetes at one release, staging modules
# pinned to the matching v0.x) into a cache outside the tree, and does nothing
# when the binary is already there. About 8 minutes cold on 2 cores; niced,
# since the machine is shared.
#
#   KUBE_CACHE (default /var/cache/tabby/kube) — the cache root
#   prints the binary's path on its last line.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
GO=${GO:-go}
version=$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$here/kube-build/go.mod")
[ -n "$version" ] || { echo "kube-bins: no k8s.io/kubernetes version in $here/kube-build/go.mod" >&2; exit 1; }
dir=${KUBE_CACHE:-/var/cache/tabby/kube}/$version
bin=$dir/kube-apiserver
if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi
mkdir -p "$dir"
echo "kube-bins: building kube-apiserver $version into $dir (several minutes)" >&2
start=$(date +%s)
(cd "$here/kube-build" && CGO_ENABLED=0 nice -n 10 "$GO" build -trimpath -ldflags "-s -w" \
	-o "$bin.tmp.$$" k8s.io/kubernetes/cmd/kube-apiserver)
mv "$bin.tmp.$$" "$bin"
echo "kube-bins: built in $(( $(date +%s) - start )) s" >&2
echo "$bin"
