#!/usr/bin/env bash
# Prints the kubectl mizar's tests and `make up` use: the pinned one that
# hack/kube-binaries.sh builds into the cache (hack/install-deps.sh does that),
# else a kubectl >= 1.30 on PATH, else nothing (callers then say what is missing).
set -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kube=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$ROOT/hack/tools/kube/go.mod")
pinned=${MIZAR_CACHE:-$HOME/.cache/mizar}/kube-$kube/bin/kubectl
if [[ -x $pinned ]]; then
  echo "$pinned"
  exit 0
fi
if sys=$(command -v kubectl); then
  minor=$("$sys" version --client -o json 2>/dev/null | sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p' | head -1)
  if [[ -n $minor ]] && ((minor >= 30)); then
    echo "$sys"
  fi
fi
