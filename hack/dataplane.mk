# Dataplane targets, written to be included from the top-level Makefile
# (`include hack/dataplane.mk`) or run as `make -f hack/dataplane.mk <target>`
# from the repository root.

GO ?= go

.PHONY: bpf verify-bpf bench-dataplane bench-dataplane-ab

# Regenerate the BPF objects (clang-19) and their bpf2go Go bindings.
bpf:
	$(GO) generate ./pkg/dataplane/...

# Fail when the committed objects or bindings differ from what bpf/ compiles
# to (the build is reproducible: same clang-19, byte-identical output).
verify-bpf: bpf
	@if ! git diff --quiet -- pkg/dataplane bpf || \
	   [ -n "$$(git status --porcelain --untracked-files=all -- pkg/dataplane bpf)" ]; then \
		git status --short -- pkg/dataplane bpf >&2; \
		echo "verify-bpf: the committed BPF objects/bindings are stale: run 'make bpf' and commit the result" >&2; \
		exit 1; \
	fi
	@echo "verify-bpf: BPF objects and bindings are up to date"

# Throughput, latency and per-packet benchmarks (root).
bench-dataplane:
	hack/bench-dataplane.sh

# Every program path's per-packet cost at BASE (default: main before issue
# 18's trust checks) beside the working tree, interleaved in one run (root).
bench-dataplane-ab:
	hack/bench-dataplane-ab.sh
