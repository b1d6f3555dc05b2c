#!/usr/bin/env bash
# Installs everything mizar's build and tests need on a fresh Debian 12 machine.
# Idempotent: packages already present are skipped, so a warm machine pays nothing.
set -euo pipefail

packages=(
  clang-19 llvm-19 libbpf-dev   # bpf/ programs (bpf2go); bookworm's default clang is 14
  iproute2 ethtool iperf3 tcpdump tshark bpftool  # dataplane tests and benchmarks
  iputils-ping                  # ping between pods in the dataplane netns test
  jq                            # make up reads cnitool's results
  protobuf-compiler             # protoc for go-to-protobuf in hack/update-codegen.sh (make codegen/verify)
  kmod                          # modprobe for the geneve/vxlan/veth modules in tests
  debootstrap                   # the kind node image's Debian root (hack/kind/rootfs.sh)
  podman runc conmon netavark aardvark-dns  # kind's node containers (hack/kind/podman-env.sh)
  nftables iptables             # the agent's host path rules (nft, via knftables); kube-proxy-like DNAT in its tests
  chromium                      # headless browser for the mizarctl ui page's tests (chromedp)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# kubectl pinned for the e2e tests and `make up` (hack/kubectl-path.sh picks it):
# built once from the Go module proxy into ~/.cache/mizar, a no-op afterwards.
"$(dirname "${BASH_SOURCE[0]}")/kube-binaries.sh" kubectl >/dev/null
