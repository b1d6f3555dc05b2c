#!/usr/bin/env bash
# make kind-down: deletes the kind cluster and its podman network. Podman runs
# no daemon, so nothing else is left running; the node image stays cached.
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=podman-env.sh
source "$ROOT/hack/kind/podman-env.sh"
CLUSTER=${KIND_CLUSTER:-mizar}
command -v podman >/dev/null || exit 0
KIND=$("$ROOT/hack/kube-binaries.sh" kind)
if ! "$KIND" delete cluster --name "$CLUSTER" --kubeconfig "$ROOT/_output/kind/kubeconfig"; then
  # Podman can refuse to kill a node that stopped while kind asked
  # ("container state improper: stopped"): remove what is left by kind's
  # label, then let kind finish (kubeconfig, nothing else to remove).
  echo "kind-down: kind delete failed; removing cluster $CLUSTER's containers with podman rm -f" >&2
  podman ps -aq --filter "label=io.x-k8s.kind.cluster=$CLUSTER" | xargs -r podman rm -f >/dev/null
  "$KIND" delete cluster --name "$CLUSTER" --kubeconfig "$ROOT/_output/kind/kubeconfig"
fi
# kind leaves its network for the next cluster; remove it when no other kind
# cluster uses it (and with it the aardvark-dns netavark started for it).
if [[ -z $("$KIND" get clusters 2>/dev/null) ]]; then
  podman network rm -f kind >/dev/null 2>&1 || true
  rm -f "$ROOT/_output/kind/kubeconfig"
fi
