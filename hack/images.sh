#!/usr/bin/env bash
# Builds mizar's container images without Docker: static binaries (CGO off,
# -trimpath) on an empty base, written as OCI image tarballs that
# `kind load image-archive` and `ctr -n k8s.io images import` accept.
#
#   mizar.dev/mizar-apiserver:<tag>  /mizar-apiserver (uid 65532)
#   mizar.dev/mizar-nodeagent:<tag>  /mizar-nodeagent (root: it loads BPF and
#                                    makes pods' links), with the CNI plugin
#                                    /opt/mizar/bin/mizar (cmd/cni), on Debian's
#                                    nft and its libraries (the host path's
#                                    rules go through knftables, which runs
#                                    nft); portmap, which the conflist chains,
#                                    comes with the node
#
# Every image is required: a command directory that is missing fails the build.
#
# Usage: hack/images.sh [tag]      (default tag: dev)
# Output: _output/images/<name>.tar, image names mizar.dev/<name>:<tag>.
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TAG=${1:-dev}
OUT=$ROOT/_output/images
BIN=$ROOT/_output/image-bin
mkdir -p "$OUT" "$BIN"
export CGO_ENABLED=0 GOWORK=off

echo "images: building the image tool (hack/tools/image)" >&2
(cd "$ROOT/hack/tools/image" && go build -trimpath -o "$BIN/image" .)

# build NAME PACKAGE: a static binary, or a failure if the package is missing.
build() {
  local name=$1 pkg=$2
  if [[ $pkg == ./* && ! -d $ROOT/$pkg ]]; then
    echo "images: $pkg does not exist: cannot build $name" >&2
    exit 1
  fi
  (cd "$ROOT" && go build -trimpath -ldflags=-s -o "$BIN/$name" "$pkg")
}

# image NAME USER [extra src=dst,...] [base.tar]: pack $BIN/NAME as /NAME.
image() {
  local name=$1 user=$2 extra=${3:-} base=${4:-}
  "$BIN/image" --binary "$BIN/$name" --path "/$name" --name "mizar.dev/$name:$TAG" --out "$OUT/$name.tar" \
    --user "$user" ${extra:+--extra "$extra"} ${base:+--base "$base" --env PATH=/usr/sbin:/usr/bin:/sbin:/bin}
  echo "$OUT/$name.tar"
}

echo "images: mizar-apiserver from cmd/apiserver" >&2
build mizar-apiserver ./cmd/apiserver
image mizar-apiserver 65532:65532

echo "images: mizar-nodeagent from cmd/nodeagent, with cmd/cni" >&2
build mizar-nodeagent ./cmd/nodeagent
build mizar ./cmd/cni
# portmap (chained by the conflist) comes from the node image: building it here
# needs go.sum entries for its dependencies (github.com/mattn/go-shellwords).
# nft and its libraries from Debian (needs root once: debootstrap; then cached).
echo "images: the agent's base layer (Debian's nftables)" >&2
nftbase=$("$ROOT/hack/kind/debian-base.sh" nftables)
image mizar-nodeagent 0:0 "$BIN/mizar=/opt/mizar/bin/mizar" "$nftbase"
