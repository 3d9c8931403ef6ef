#!/bin/sh
# Installs the Debian packages Tabby needs at run and test time. A no-op when
# they are all present; only acts as root on a Debian-like system.
set -eu
PKGS="iptables ipset nftables iproute2 iputils-ping conntrack procps util-linux bird2 containernetworking-plugins containerd bash-static chromium"
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
	echo "deps: all present"
	exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	echo "deps: missing:$missing (run 'make deps' as root on Debian to install them)" >&2
	exit 0
fi
echo "deps: installing$missing"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
