#!/bin/sh
# Builds the lab's CoreDNS (scripts/coredns-build: CoreDNS at the release its
# go.mod names, with only the plugins a cluster's DNS needs) from the module
# proxy into a cache outside the tree, next to the Kubernetes binaries
# (scripts/kube-bins.sh). The binary is stamped with a digest of the build
# module's files: a cached one counts only if it says this release and this
# digest, so that changing the plugin list rebuilds it. Niced.
#
#   COREDNS_CACHE (default /var/cache/tabby/coredns) — the cache root
#   prints the binary's directory on its last line.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
GO=${GO:-go}
mod=$here/coredns-build
version=$(sed -n 's/^require github.com\/coredns\/coredns \(v[0-9.]*\)$/\1/p' "$mod/go.mod")
[ -n "$version" ] || { echo "coredns-bins: no github.com/coredns/coredns version in $mod/go.mod" >&2; exit 1; }
dir=${COREDNS_CACHE:-/var/cache/tabby/coredns}/$version
stamp=tabby-$(cat "$mod/go.mod" "$mod/go.sum" "$mod/main.go" | sha256sum | cut -c1-12)
# -version prints "CoreDNS-1.15.0" and "linux/amd64, go…, <GitCommit>".
if [ -x "$dir/coredns" ] && out=$("$dir/coredns" -version 2>/dev/null) &&
	echo "$out" | grep -qx "CoreDNS-${version#v}" && echo "$out" | grep -q ", $stamp\$"; then
	echo "$dir"
	exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "coredns-bins: building CoreDNS $version ($stamp) into $dir" >&2
start=$(date +%s)
(cd "$mod" && CGO_ENABLED=0 nice -n 10 "$GO" build -trimpath \
	-ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$stamp" -o "$tmp/coredns" .)
mv "$tmp/coredns" "$dir/coredns"
echo "coredns-bins: built in $(( $(date +%s) - start )) s" >&2
echo "$dir"
