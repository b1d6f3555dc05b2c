#!/usr/bin/env bash
# Per-packet cost of every program path (BenchmarkPrograms) at a base commit
# and at the working tree, in one run: both test binaries are built first,
# then take turns, ROUNDS times each (base first in odd rounds, head first in
# even ones), so the machine's load from minute to minute falls on both.
# benchstat compares them per path: ns/op, and x-empty-hook (the path's cost
# over an empty program of its hook, measured beside it), the steadier one.
#
# BASE defaults to main right before issue 18's trust checks (f01345d: no
# self-source, droplet-MAC, learned-path vouching, VLAN or flood checks), the
# baseline of that issue's "<= 5% per path" goal. Needs root (BPF).
#
# Environment: BASE (a commit), ROUNDS (default 6), BENCHTIME (default 1s).
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=${BASE:-f01345d}
ROUNDS=${ROUNDS:-6}
BENCHTIME=${BENCHTIME:-1s}
BENCHSTAT=golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da

if [[ $EUID -ne 0 ]]; then
	echo "bench-dataplane-ab: needs root (BPF)" >&2
	exit 1
fi
work=$(mktemp -d)
cleanup() {
	git worktree remove --force "$work/base" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

git worktree add --detach --quiet "$work/base" "$BASE"
echo "bench-dataplane-ab: building the test binaries of $BASE and of the working tree"
(cd "$work/base" && go test -c -o "$work/base.test" ./pkg/dataplane)
go test -c -o "$work/head.test" ./pkg/dataplane

# A test binary runs in its package's directory (its testdata).
run() {
	local side=$1 dir=$2
	(cd "$dir/pkg/dataplane" && "$work/$side.test" -test.run '^$' -test.bench '^BenchmarkPrograms$' \
		-test.benchtime "$BENCHTIME" -test.timeout 20m) | grep -E '^(Benchmark|goos|goarch|pkg|cpu)' >>"$work/$side.txt"
}
for ((i = 1; i <= ROUNDS; i++)); do
	echo "bench-dataplane-ab: round $i of $ROUNDS"
	if ((i % 2)); then
		run base "$work/base"; run head "$PWD"
	else
		run head "$PWD"; run base "$work/base"
	fi
done
go run "$BENCHSTAT" -filter '.unit:(ns/op OR x-empty-hook)' "base=$work/base.txt" "head=$work/head.txt"
