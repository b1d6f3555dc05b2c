#!/usr/bin/env bash
# Runs mizar's dataplane benchmarks in one go (needs root: loads BPF programs
# and builds network-namespace topologies, all removed afterwards):
#   BenchmarkPrograms  ns per packet of every program path (BPF_PROG_TEST_RUN)
#                      and its ratio to an empty program of its own hook
#                      (x-empty-hook), interleaved round by round; the pod's
#                      encap paths also to bpf_skb_adjust_room + bpf_redirect
#                      alone (x-encap-floor)
#   BenchmarkLiveBouncer the bouncer in BPF_PROG_RUN live-frames mode (frames
#                      really transmitted) vs an XDP_TX-only program
#   BenchmarkPodHook   pod -> host TCP over one veth with no hook, tcx, native
#                      and generic XDP on the host side: why the pod side is tcx
#   BenchmarkOverlay   pod-to-pod iperf3 throughput and TCP round trips across
#                      netns hosts in wire mode: plain routing, kernel VXLAN,
#                      pass-only XDP (the ceiling), mizar direct, bounced and
#                      learned (bounced first, then host to host), each with
#                      the underlay program in native and in generic XDP mode
#                      (mizar's mode on veth underlays), as ratios to plain
#                      routing and to kernel VXLAN; and mizar over the
#                      encrypted underlay (userspace wireguard-go over a TAP,
#                      the userspace figure, untuned) beside plain mode
#   BenchmarkNetworkPolicy per-packet cost of the pod (remote and same-host)
#                      and decapsulation paths with NetworkPolicy compiled in and
#                      0, 10 and 1,000 policies selecting the pod, established and
#                      re-checked after a policy change, as a ratio to the same
#                      path with policy compiled out (x-no-policy), interleaved
#   BenchmarkDropEvents per-packet cost of drop paths with drop events off
#                      (counter only), at their default budget, and with every
#                      drop reported, and of delivery paths the same way
#                      (x-no-events: the goal is <= 1.1 for drops, 1.0 for
#                      delivery), interleaved in rotating order
#   BenchmarkServices  per-packet cost of the pod paths with the Service
#                      translation compiled in (no Service, one Service) and of
#                      a connection to a Service, as a ratio to the same path
#                      with Services compiled out (x-off), interleaved
# Speeds are only meaningful as the ratios printed next to them, which come
# from one run on the same machine.
#
# Environment: BENCH (regexp, default all seven), COUNT (default 1),
# BENCHTIME (for BenchmarkPrograms, default 1s).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $EUID -ne 0 ]]; then
	echo "bench-dataplane: needs root (BPF, network namespaces)" >&2
	exit 1
fi
for tool in iperf3 ping; do
	command -v "$tool" >/dev/null || { echo "bench-dataplane: $tool missing: run hack/install-deps.sh" >&2; exit 1; }
done

exec go test ./pkg/dataplane/ -run '^$' \
	-bench "${BENCH:-^(BenchmarkPrograms|BenchmarkNetworkPolicy|BenchmarkLiveBouncer|BenchmarkPodHook|BenchmarkOverlay|BenchmarkDropEvents|BenchmarkServices)$}" \
	-benchtime "${BENCHTIME:-1s}" -count "${COUNT:-1}" -timeout 30m
