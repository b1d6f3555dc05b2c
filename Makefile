# mizar: `make up` brings a local mizar cluster up (as root; else a standalone
# mizar-apiserver) and shows it working;
# `make test` runs every test (root is needed for the dataplane's BPF and netns tests).

# bash with pipefail, so a failing command piped through a filter still fails the target.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c

GO ?= go
BIN := _output/bin
export MIZAR_APISERVER := $(abspath $(BIN)/mizar-apiserver)
# Kubernetes binaries built from the module proxy are cached here, keyed by version.
export MIZAR_CACHE ?= $(HOME)/.cache/mizar
# The kubectl tests and `make up` use: the pinned one once `make deps` built it
# (recursively expanded, so recipes that run after deps see it).
export KUBECTL = $(shell hack/kubectl-path.sh)

.PHONY: all build test deps kube-binaries e2e-aggregated bench-aggregated images cluster up down clean codegen verify verify-codegen verify-deps verify-fmt verify-size vet bench bench-apiserver kubectl e2e-replay-watches bench-workflow bench-cni bench-broker bench-podnet e2e-broker cluster-up cluster-down e2e kind-up kind-down e2e-cluster bench-cluster conformance

all: build

# The CNI plugin is built as _output/bin/cni/mizar: runtimes look it up in
# CNI_PATH by its conflist "type". cnitool (the version go.mod pins) drives it
# in `make up`'s local cluster.
# -v names each package as it compiles (cached ones are silent): a cold build
# shows a running count instead of minutes of silence; errors pass through.
build:
	@echo "go build ./... (a cold build compiles ~1500 packages: a few minutes on 2 cores)"
	$(GO) build -v ./... 2>&1 | hack/build-progress.sh
	$(GO) build -v -o $(BIN)/mizar-apiserver ./cmd/apiserver 2>&1 | hack/build-progress.sh
	$(GO) build -o $(BIN)/mizar-nodeagent ./cmd/nodeagent
	$(GO) build -o $(BIN)/cni/mizar ./cmd/cni
	$(GO) build -o $(BIN)/mizarctl ./cmd/mizarctl
	ln -sf mizarctl $(BIN)/kubectl-mizar
	$(GO) build -o $(BIN)/cnitool github.com/containernetworking/cni/cnitool

# Debian packages the tests need (clang-19 for the BPF staleness check,
# iproute2/iperf3/tshark/... for the netns tests). Idempotent.
deps:
	hack/install-deps.sh

# kube-binaries first: a cold build takes minutes, longer than go test's timeout.
test: deps kube-binaries build verify
	$(GO) test -count=1 ./...
	cd hack/tools/image && $(GO) test -count=1 ./...

# OCI image tarballs in _output/images (no Docker needed).
images:
	hack/images.sh

# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, kubectl 1.35 and 1.33, helm
# (hack/kube-binaries.sh; a no-op once cached in $(MIZAR_CACHE)).
kube-binaries:
	hack/kube-binaries.sh etcd kube-apiserver kube-controller-manager kube-scheduler kwok kubectl kubectl-1.33 helm >/dev/null

# mizar-apiserver behind a real kube-apiserver, driven by kubectl 1.35 and 1.33 (needs root).
e2e-aggregated: kube-binaries build
	$(GO) test -count=1 -v ./test/aggregated

# As root: a 3-node local cluster (netns nodes, real agents, pods added with
# cnitool; MIZAR_NODES sets the count); otherwise the standalone apiserver.
# kubectl first: the one on PATH when it is >= 1.30, else the pinned one built
# from the module proxy into $(MIZAR_CACHE) (minutes the first time, then cached).
up: kubectl build
	hack/up.sh

kubectl:
	@[ -n "$$(hack/kubectl-path.sh)" ] || { echo "make: no kubectl >= 1.30 on PATH; building the pinned one (cached in $(MIZAR_CACHE))"; hack/kube-binaries.sh kubectl >/dev/null; }
	@hack/require-kubectl.sh

down:
	hack/down.sh

clean: down
	rm -rf _output/local _output/bin

codegen:
	hack/update-codegen.sh

verify: vet verify-fmt verify-deps verify-codegen verify-bpf verify-size

vet:
	$(GO) vet ./...

verify-fmt:
	@out=$$(gofmt -l cmd pkg test hack); if [ -n "$$out" ]; then echo "gofmt needed:" >&2; echo "$$out" >&2; exit 1; fi

verify-size:
	hack/verify-size.sh

verify-deps:
	hack/verify-deps.sh

verify-codegen:
	hack/verify-codegen.sh

bench: bench-apiserver bench-workflow bench-dataplane bench-cni bench-broker bench-podnet

# The e2e-aggregated control plane, kept running for kubectl by hand (Ctrl-C stops it; needs root).
cluster: kube-binaries build
	$(GO) run ./hack/local-cluster

# Droplet creates direct, through the aggregator, and of an equivalent CRD (one run; ratios and CPU
# per create of each process in the log). MIZAR_BENCH_PROFILE=dir adds CPU profiles of both servers.
bench-aggregated: kube-binaries build
	$(GO) test ./test/aggregated -run '^$$' -bench Creates -benchtime 2000x -v -timeout 20m

# The in-process server's klog lines are filtered out so the benchmark lines stand alone.
bench-apiserver:
	$(GO) test ./test/bench -run '^$$' -bench . -benchtime 10s -timeout 30m 2>&1 | grep -Ev '^[IWE][0-9]{4} '

# The issue's full scale of test/e2e TestReplayingWatchesKeepMemoryBounded: 1,000 replaying
# watches from droplets on 20,000 endpoints (make test runs 200 on 2,000).
e2e-replay-watches:
	$(GO) build -o $(BIN)/mizar-apiserver ./cmd/apiserver
	MIZAR_REPLAY_ENDPOINTS=20000 MIZAR_REPLAY_WATCHERS=1000 \
		$(GO) test -count=1 -v ./test/e2e -run '^TestReplayingWatchesKeepMemoryBounded$$' -timeout 30m

# Endpoint Init->Provisioned at 10/100/1000 in-process agents; sizes and endpoint
# count via MIZAR_WF_BENCH_DROPLETS / MIZAR_WF_BENCH_ENDPOINTS.
bench-workflow:
	$(GO) test ./test/workflow -run '^$$' -bench . -benchtime 1x -timeout 60m 2>&1 | grep -Ev '^[IWE][0-9]{4} |etcd-client|^\{'

# OSB provision answers under 50 concurrent platforms (in-process facade, and the
# server's own listener with the loopback's old 50 QPS limit and with the broker's),
# beside a plain ServiceInstance create, and order -> StatefulSet (one run; ratios in the line).
bench-broker:
	$(GO) test ./test/integration/broker -run '^$$' -bench Provision -benchtime 1x -timeout 10m 2>&1 | grep -Ev '^[IWE][0-9]{4} |^\{'

# The broker end to end: kube-apiserver, kcm, scheduler and kwok nodes as the
# workload cluster, mizar-apiserver as a process killed mid-saga (no root needed).
e2e-broker: kube-binaries build
	$(GO) test -count=1 -v ./test/brokere2e

# CNI ADD latency through the plugin and libcni: sequential and 100 at once on
# one node, beside a bare veth create (needs root).
bench-cni:
	$(GO) test ./pkg/nodeagent -run '^$$' -bench CNIAdd -benchtime 1x -timeout 10m 2>&1 | grep -Ev '^[IWE][0-9]{4} |etcd-client|^\{'

# Pod-to-pod TCP Gbit/s and RTT across nodes through the real agents and plugin (same subnet,
# learned; across subnets), each as a ratio to kernel VXLAN on the same namespaces, wire mode (root).
bench-podnet: build
	$(GO) test ./test/podnet -run '^$$' -bench PodTCP -benchtime 1x -timeout 20m -v

# The pod network end to end: 3 netns nodes with real agents, pods through
# cnitool and libcni (needs root; also part of `make test`).
e2e: build
	$(GO) test -count=1 -v ./test/podnet

# A real 3-node cluster in kind (podman provider, node image and every image
# built here, cached in $(MIZAR_CACHE)) with mizar installed by its chart
# (MIZAR_KIND_CNI=reference: the reference bridge + host-local plugins instead).
# Needs root. KUBECONFIG=_output/kind/kubeconfig afterwards.
kind-up:
	hack/kind/up.sh

kind-down:
	hack/kind/down.sh

# The cluster end to end (test/e2ecluster): brings the kind cluster up, installs
# mizar with helm, checks pods, Services, DNS, NodePort, upgrades and uninstall,
# and removes the cluster (MIZAR_E2E_KEEP=1 keeps it). Fails under CI=true if
# it cannot run.
e2e-cluster:
	MIZAR_E2E_CLUSTER=1 $(GO) test -count=1 -v -timeout 55m ./test/e2ecluster

# Kubernetes' own [sig-network] [Conformance] specs (e2e.test of the pinned
# Kubernetes version and its test images, built here and cached) against the
# running kind cluster (make kind-up). JUnit report and log in
# _output/conformance/. Not in CI: e2e.test is a long build.
conformance:
	hack/kind/conformance.sh

# `make up` as root is the local multi-node cluster; these names stay as aliases.
cluster-up: up
cluster-down: down

include hack/dataplane.mk

# Pod startup (100 pods) and cross-node TCP/RTT of mizar as ratios to the
# reference bridge + host-local network, each on a fresh kind cluster in one
# run (test/e2ecluster BenchmarkCluster; needs root and podman).
bench-cluster:
	MIZAR_E2E_CLUSTER=1 $(GO) test ./test/e2ecluster -run '^$$' -bench Cluster -benchtime 1x -timeout 60m -v
