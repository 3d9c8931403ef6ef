#!/bin/bash
# make test: runs the test tiers one after another and ends with a summary
# of which ran and which were skipped, and why (internal/testreport).
#
#   unit        every package but ./e2e, with -race, TABBY_SKIP_PRIVILEGED=1
#   privileged  the TestPrivileged… tests, as root, each in namespaces of its own
#   e2e         ./e2e: the lab with real agents, as root
#
# Environment: GO, BIN (built binaries, given to tests as TABBY_BIN),
# TESTFLAGS, RACEFLAGS, TIERS (default "unit privileged e2e"), E2E_TIMEOUT
# (default 45m: the e2e package's deadline, after TESTFLAGS' -timeout).
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
BIN=${BIN:-$PWD/bin}
TESTFLAGS=${TESTFLAGS:--count=1 -timeout 20m -p 2}
RACEFLAGS=${RACEFLAGS:--race}
TIERS=${TIERS:-unit privileged e2e}
rec=$BIN/test-tiers
rm -rf "$rec" && mkdir -p "$rec"
report=$BIN/testreport
"$GO" build -o "$report" ./internal/cmd/testreport || exit 1

want() { [[ " $TIERS " == *" $1 "* ]]; }
status=0
# tier NAME N PKGS... : run go test -json for one tier into record N-NAME.
tier() {
	local name=$1 n=$2; shift 2
	echo "==== tier $name: go test $* ===="
	"$@" 2>&1 | "$report" run "$name" "$rec/$n-$name.json" || status=1
}
skip() { "$report" skip "$1" "$rec/$2-$1.json" "${@:3}"; }

mapfile -t all < <("$GO" list ./... | grep -v '/e2e$')
# Packages with privileged tests (outside ./e2e); the others have none to run.
mapfile -t priv < <(grep -rl --include='*_test.go' '^func TestPrivileged' . | grep -v '^\./e2e/[^/]*$' | xargs -r -n1 dirname | sort -u)

privReason=""
if [ "$(id -u)" != 0 ]; then
	privReason="not root (uid $(id -u)): these tests create network namespaces"
elif [ -n "${TABBY_SKIP_PRIVILEGED:-}" ]; then
	privReason="TABBY_SKIP_PRIVILEGED is set"
fi

if want unit; then
	tier unit 1 env TABBY_SKIP_PRIVILEGED=1 "$GO" test -json $RACEFLAGS $TESTFLAGS "${all[@]}"
	# The BGP tests that take a graceful-restart session down skip under
	# -race (a data race inside GoBGP v4.8.0 and v4.9.0, see bgp/harness_test.go): run
	# them without it.
	tier unit-gobgp 1b env TABBY_SKIP_PRIVILEGED=1 "$GO" test -json $TESTFLAGS -run '^(TestStop|TestGracefulRestart|TestHostilePeers|TestHostilePeersIPv6|TestReflectorPromotion)$' ./bgp
else
	skip unit 1 "not in TIERS ($TIERS)"
fi
if ! want privileged; then
	skip privileged 2 "not in TIERS ($TIERS)"
elif [ -n "$privReason" ]; then
	skip privileged 2 "$privReason"
else
	tier privileged 2 env TABBY_BIN="$BIN" "$GO" test -json $TESTFLAGS -run '^TestPrivileged' "${priv[@]}"
fi
if ! want e2e; then
	skip e2e 3 "not in TIERS ($TIERS)"
elif [ -n "$privReason" ]; then
	skip e2e 3 "$privReason"
else
	# One package of many labs: its own, longer deadline (the last -timeout wins).
	tier e2e 3 env TABBY_BIN="$BIN" "$GO" test -json $TESTFLAGS -timeout "${E2E_TIMEOUT:-45m}" ./e2e
fi
"$report" summary "$rec"/*.json || status=1
exit $status
