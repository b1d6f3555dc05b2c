#!/usr/bin/env bash
# make conformance: Kubernetes' own `[sig-network] [Conformance]` specs (the
# e2e suite of the version hack/tools/kube pins, built as e2e.test from the Go
# module proxy) against the running kind cluster (make kind-up).
#
#   1. builds e2e.test and the v1.35 kubectl (hack/kube-binaries.sh, cached);
#   2. builds the test images the specs run, under the names
#      `e2e.test --list-images` prints (hack/kind/e2e-images.sh, cached), and
#      loads them into every node (`kind load image-archive`): no registry is
#      reachable, and a tagged image already present is never pulled;
#   3. runs the focused specs serially and writes the suite's JUnit report to
#      _output/conformance/ (with the full log, e2e.log);
#   4. prints run / passed / failed / skipped and each failed spec.
#
# It creates nothing but what e2e.test does (its own namespaces) and the
# images it loads; the cluster is not changed otherwise.
#
# Environment:
#   KUBECONFIG                 default _output/kind/kubeconfig
#   KIND_CLUSTER               default mizar
#   MIZAR_CONFORMANCE_FOCUS    default '\[sig-network\].*\[Conformance\]'
#   MIZAR_CONFORMANCE_SKIP     ginkgo skip regexp (default none)
#   MIZAR_CONFORMANCE_ARGS     extra e2e.test flags, split on spaces
# Exit status: e2e.test's (non-zero when a spec failed).
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=podman-env.sh
source "$ROOT/hack/kind/podman-env.sh"
CLUSTER=${KIND_CLUSTER:-mizar}
export KUBECONFIG=${KUBECONFIG:-$ROOT/_output/kind/kubeconfig}
FOCUS=${MIZAR_CONFORMANCE_FOCUS:-'\[sig-network\].*\[Conformance\]'}
SKIP=${MIZAR_CONFORMANCE_SKIP:-}
OUT=$ROOT/_output/conformance

log() { echo "conformance: $(date -u +%T) $*" >&2; }

[[ -s $KUBECONFIG ]] || { log "no kubeconfig at $KUBECONFIG: bring the cluster up first (make kind-up)"; exit 1; }
mapfile -t tools < <("$ROOT/hack/kube-binaries.sh" e2e.test kubectl kind)
E2E=${tools[0]} KUBECTL=${tools[1]} KIND=${tools[2]}
"$KUBECTL" get nodes -o wide >&2 || { log "the cluster at $KUBECONFIG does not answer"; exit 1; }

# The images the network specs run their pods from (pause comes with the node).
mapfile -t names < <("$E2E" --list-images | grep -E '/e2e-test-images/(agnhost|jessie-dnsutils|nginx|busybox):' | sort -u)
((${#names[@]})) || { log "e2e.test --list-images named none of agnhost, jessie-dnsutils, nginx, busybox"; exit 1; }
log "test images: ${names[*]}"
mapfile -t tars < <("$ROOT/hack/kind/e2e-images.sh" "${names[@]}")
((${#tars[@]} == ${#names[@]})) || { log "hack/kind/e2e-images.sh built ${#tars[@]} of ${#names[@]} images"; exit 1; }
for t in "${tars[@]}"; do
  "$KIND" load image-archive --name "$CLUSTER" "$t"
done
log "images loaded into the nodes of $CLUSTER"

rm -rf "$OUT"
mkdir -p "$OUT"
log "running e2e.test --ginkgo.focus='$FOCUS'${SKIP:+ --ginkgo.skip='$SKIP'} (log: $OUT/e2e.log)"
rc=0
# --provider=skeleton: no cloud; --report-dir: the suite's junit_01.xml.
# shellcheck disable=SC2086 # MIZAR_CONFORMANCE_ARGS is split on purpose
"$E2E" --provider=skeleton --kubeconfig="$KUBECONFIG" --kubectl-path="$KUBECTL" \
  --ginkgo.focus="$FOCUS" ${SKIP:+--ginkgo.skip="$SKIP"} \
  --ginkgo.timeout=2h --ginkgo.no-color --ginkgo.v \
  --report-dir="$OUT" ${MIZAR_CONFORMANCE_ARGS:-} >"$OUT/e2e.log" 2>&1 || rc=$?

# Ginkgo's own summary line: "Ran 47 of 7000 Specs ... 45 Passed | 2 Failed | 0 Pending | 6953 Skipped".
summary=$(grep -aE '^Ran [0-9]+ of [0-9]+ Specs' "$OUT/e2e.log" | tail -1 || true)
counts=$(grep -aE '[0-9]+ Passed \| [0-9]+ Failed' "$OUT/e2e.log" | tail -1 || true)
if [[ -z $summary ]]; then
  tail -40 "$OUT/e2e.log" >&2
  log "e2e.test ended (rc=$rc) without a summary (log above)"
  exit $((rc ? rc : 1))
fi
run=$(sed -E 's/^Ran ([0-9]+) of.*/\1/' <<<"$summary")
passed=$(grep -oE '[0-9]+ Passed' <<<"$counts" | cut -d' ' -f1)
failed=$(grep -oE '[0-9]+ Failed' <<<"$counts" | cut -d' ' -f1)
# The focused specs that did not run (the rest of the suite is not counted).
junit=$OUT/junit_01.xml
skipped=
if [[ -s $junit ]]; then
  focused=$(grep -oE '<testcase name="[^"]*"' "$junit" | grep -cE "$FOCUS" || true)
  skipped=$((focused - run))
fi
echo "conformance: run $run, passed ${passed:-?}, failed ${failed:-?}, skipped ${skipped:-?} (of the specs matching the focus); $summary"
if ((${failed:-0} > 0)); then
  echo "failed specs:"
  # Ginkgo lists them after "Summarizing N Failures:".
  sed -n '/^Summarizing [0-9]* Failure/,$p' "$OUT/e2e.log" | grep -aE '^\s*\[(FAIL|TIMEDOUT|INTERRUPTED|PANICKED)\]' | sed 's/^/  /'
fi
log "JUnit report: $junit; log: $OUT/e2e.log"
exit "$rc"
