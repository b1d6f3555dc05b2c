#!/usr/bin/env bash
# Builds mizar's container images without Docker: static binaries (CGO off,
# -trimpath) on an empty base, written as OCI image tarballs that
# `kind load image-archive` and `ctr -n k8s.io images import` accept.
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

# image NAME CMD-PACKAGE [extra src=dst]: one image per command that exists.
image() {
  local name=$1 pkg=$2 extra=${3:-}
  if [[ ! -d $ROOT/$pkg ]]; then
    echo "images: $pkg does not exist yet; skipping $name" >&2
    return
  fi
  echo "images: $name from $pkg" >&2
  (cd "$ROOT" && go build -trimpath -ldflags=-s -o "$BIN/$name" "./$pkg")
  "$BIN/image" --binary "$BIN/$name" --path "/$name" --name "mizar.dev/$name:$TAG" --out "$OUT/$name.tar" ${extra:+--extra "$extra"}
  echo "$OUT/$name.tar"
}

image mizar-apiserver cmd/apiserver
# The agent image carries the CNI plugin its DaemonSet installs on each node.
if [[ -d $ROOT/cmd/cni ]]; then
  (cd "$ROOT" && go build -trimpath -ldflags=-s -o "$BIN/mizar-cni" ./cmd/cni)
  image mizar-agent cmd/agent "$BIN/mizar-cni=/mizar-cni"
else
  image mizar-agent cmd/agent
fi
