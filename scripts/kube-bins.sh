#!/bin/sh
# Builds the Kubernetes binaries for the Kubernetes test tier and the lab
# (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kube-proxy, and the kubectl the lab and its tests drive them with) from the
# module proxy (scripts/kube-build: k8s.io/kubernetes at one release, staging
# modules pinned to the matching v0.x) into a cache outside the tree. Only the
# missing ones are built, in one `go build`, so the four share their compiled
# packages; with all four there it does nothing. Niced, since the machine is
# shared. Cold on 2 cores: about 8 minutes for kube-apiserver alone, see
# docs/kubernetes-lab.md for all four.
#
#   KUBE_CACHE (default /var/cache/tabby/kube) — the cache root
#   KUBE_BINS (default all six) — which binaries to make sure of
#   prints the binaries' directory on its last line.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
GO=${GO:-go}
version=$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$here/kube-build/go.mod")
[ -n "$version" ] || { echo "kube-bins: no k8s.io/kubernetes version in $here/kube-build/go.mod" >&2; exit 1; }
dir=${KUBE_CACHE:-/var/cache/tabby/kube}/$version
missing=
for b in ${KUBE_BINS:-kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl}; do
	case $b in
	kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kube-proxy) want="Kubernetes $version"; ask=--version ;;
	kubectl) want="Client Version: $version"; ask="version --client" ;;
	*) echo "kube-bins: unknown binary $b" >&2; exit 1 ;;
	esac
	# A binary counts only if it says it is this release: builds from
	# before the version was stamped say v0.0.0-master.
	# shellcheck disable=SC2086
	if [ -x "$dir/$b" ] && "$dir/$b" $ask 2>/dev/null | grep -qx "$want"; then
		continue
	fi
	missing="$missing $b"
done
if [ -z "$missing" ]; then
	echo "$dir"
	exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pkgs=
for b in $missing; do pkgs="$pkgs k8s.io/kubernetes/cmd/$b"; done
echo "kube-bins: building$missing $version into $dir (several minutes)" >&2
start=$(date +%s)
# -o a directory: go build writes one binary per main package into it.
# shellcheck disable=SC2086
# The version is stamped as Kubernetes' own build does (hack/lib/version.sh),
# so that the binaries report it: a kubelet's node shows it, kubectl checks skew.
major=${version#v}; minor=${major#*.}; major=${major%%.*}; minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags="$ldflags -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
(cd "$here/kube-build" && CGO_ENABLED=0 nice -n 10 "$GO" build -trimpath -ldflags "$ldflags" -o "$tmp/" $pkgs)
# Renamed into place one by one: a binary in the cache is always complete.
for b in $missing; do mv "$tmp/$b" "$dir/$b"; done
echo "kube-bins: built$missing in $(( $(date +%s) - start )) s" >&2
echo "$dir"
