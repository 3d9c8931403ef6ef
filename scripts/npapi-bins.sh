#!/bin/sh
# Builds what `make conformance-npapi` needs, from the module proxy, into a
# cache outside the tree (like scripts/kube-bins.sh):
#   - the network-policy-api conformance suite (scripts/npapi-conformance: the
#     module's conformance package at the release its go.mod names, base
#     manifests without the SCTP servers the lab's kernel cannot run, see
#     that package's doc) as a test binary, npapi-conformance.test;
#   - agnhost, the suite's pod image's program, from k8s.io/kubernetes at the
#     release scripts/kube-build names (the same Kubernetes as the lab), and
#     a static bash (Debian's bash-static), the two files its pods use
#     (`/bin/bash -c "/agnhost ..."`), for `mkimage -agnhost`.
# Only what is missing is built. Niced, since the machine is shared.
#
#   NPAPI_CACHE (default /var/cache/tabby/npapi) — the cache root
#   prints the directory holding npapi-conformance.test, agnhost and bash on
#   its last line.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
GO=${GO:-go}
npv=$(awk '$1=="sigs.k8s.io/network-policy-api"{print $2}' "$here/npapi-conformance/go.mod")
kv=$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$here/kube-build/go.mod")
[ -n "$npv" ] && [ -n "$kv" ] || { echo "npapi-bins: no versions in the go.mod files" >&2; exit 1; }
dir=${NPAPI_CACHE:-/var/cache/tabby/npapi}/$npv-k8s$kv
mkdir -p "$dir"
if [ ! -x "$dir/npapi-conformance.test" ]; then
	tmp=$(mktemp -d "$dir/.build.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	cp "$here/npapi-conformance/go.mod" "$here/npapi-conformance/go.sum" "$here/npapi-conformance/conformance_test.go" "$tmp/"
	src=$(cd "$tmp" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/network-policy-api)
	cp -r "$src/conformance/base" "$tmp/base"
	chmod -R u+w "$tmp/base"
	# Drop each container whose command is agnhost porter (the SCTP servers).
	awk '
		function flush() { if (buf != "" && buf !~ /agnhost porter/) printf "%s", buf; buf = "" }
		/^        - name: / { flush(); item = 1; buf = $0 "\n"; next }
		item && /^          / { buf = buf $0 "\n"; next }
		{ flush(); item = 0; print }
		END { flush() }
	' "$src/conformance/base/manifests.yaml" >"$tmp/base/manifests.yaml"
	if grep -q 'agnhost porter' "$tmp/base/manifests.yaml"; then
		echo "npapi-bins: SCTP servers still in the base manifests" >&2
		exit 1
	fi
	echo "npapi-bins: building the network-policy-api $npv conformance suite into $dir" >&2
	(cd "$tmp" && CGO_ENABLED=0 nice -n 10 "$GO" test -c -trimpath -o "$dir/npapi-conformance.test" .)
	rm -rf "$tmp"
	trap - EXIT
fi
if [ ! -x "$dir/agnhost" ]; then
	echo "npapi-bins: building agnhost of Kubernetes $kv into $dir" >&2
	(cd "$here/kube-build" && CGO_ENABLED=0 nice -n 10 "$GO" build -trimpath -ldflags "-s -w" -o "$dir/agnhost.tmp" k8s.io/kubernetes/test/images/agnhost)
	mv "$dir/agnhost.tmp" "$dir/agnhost"
fi
bash=${BASH_STATIC:-/bin/bash-static}
[ -x "$bash" ] || { echo "npapi-bins: no static bash at $bash (apt-get install bash-static)" >&2; exit 1; }
cp "$bash" "$dir/bash"
echo "$dir"
