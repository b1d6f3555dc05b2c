# mizar: `make up` brings a standalone mizar-apiserver up and shows it working;
# `make test` runs every test (root is needed for the dataplane's BPF and netns tests).

# bash with pipefail, so a failing command piped through a filter still fails the target.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c

GO ?= go
BIN := _output/bin
export MIZAR_APISERVER := $(abspath $(BIN)/mizar-apiserver)

.PHONY: all build test deps up down clean codegen verify verify-codegen verify-deps verify-fmt vet bench bench-apiserver bench-workflow

all: build

build:
	$(GO) build ./...
	$(GO) build -o $(BIN)/mizar-apiserver ./cmd/apiserver

# Debian packages the tests need (clang-19 for the BPF staleness check,
# iproute2/iperf3/tshark/... for the netns tests). Idempotent.
deps:
	hack/install-deps.sh

test: deps build verify
	$(GO) test -count=1 ./...

up: build
	hack/up.sh

down:
	hack/down.sh

clean: down
	rm -rf _output/local _output/bin

codegen:
	hack/update-codegen.sh

verify: vet verify-fmt verify-deps verify-codegen verify-bpf

vet:
	$(GO) vet ./...

verify-fmt:
	@out=$$(gofmt -l cmd pkg test); if [ -n "$$out" ]; then echo "gofmt needed:" >&2; echo "$$out" >&2; exit 1; fi

verify-deps:
	hack/verify-deps.sh

verify-codegen:
	hack/verify-codegen.sh

bench: bench-apiserver bench-workflow bench-dataplane

# The in-process server's klog lines are filtered out so the benchmark lines stand alone.
bench-apiserver:
	$(GO) test ./test/bench -run '^$$' -bench . -benchtime 10s -timeout 10m 2>&1 | grep -Ev '^[IWE][0-9]{4} '

# Endpoint Init->Provisioned at 10/100/1000 in-process agents; sizes and endpoint
# count via MIZAR_WF_BENCH_DROPLETS / MIZAR_WF_BENCH_ENDPOINTS.
bench-workflow:
	$(GO) test ./test/workflow -run '^$$' -bench . -benchtime 1x -timeout 30m 2>&1 | grep -Ev '^[IWE][0-9]{4} |etcd-client|^\{'

include hack/dataplane.mk
