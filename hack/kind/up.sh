#!/usr/bin/env bash
# Creates a kind cluster without a default CNI, loads mizar's images (built
# without Docker by hack/images.sh) and installs the Helm chart.
# kind needs a running Docker (or podman) daemon; without one this script says
# so and stops before changing anything.
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=${KIND_CLUSTER:-mizar}

if ! docker info >/dev/null 2>&1; then
  echo "hack/kind/up.sh: no Docker daemon is reachable ('docker info' fails), and kind runs its nodes as" >&2
  echo "Docker containers. Start Docker (or set KIND_EXPERIMENTAL_PROVIDER=podman) and re-run." >&2
  echo "Without Docker, 'make e2e-aggregated' runs mizar behind a real kube-apiserver locally instead." >&2
  exit 1
fi
if ! command -v kind >/dev/null; then
  echo "hack/kind/up.sh: kind is not installed (https://kind.sigs.k8s.io/docs/user/quick-start/#installation)." >&2
  exit 1
fi

KUBECTL=${KUBECTL:-$("$ROOT/hack/kubectl-path.sh")}
HELM=$("$ROOT/hack/kube-binaries.sh" helm)
mapfile -t images < <("$ROOT/hack/images.sh" dev)

kind get clusters 2>/dev/null | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --config "$ROOT/hack/kind/cluster.yaml"
for img in "${images[@]}"; do
  kind load image-archive --name "$CLUSTER" "$img"
done
"$HELM" upgrade --install mizar "$ROOT/artifacts/charts/mizar" --namespace mizar-system --create-namespace \
  --kube-context "kind-$CLUSTER" --set image.pullPolicy=Never --set agent.image.pullPolicy=Never
"$KUBECTL" --context "kind-$CLUSTER" wait --for=condition=Available --timeout=180s apiservice/v1alpha1.networking.mizar.dev
"$KUBECTL" --context "kind-$CLUSTER" apply -f "$ROOT/artifacts/examples/network.yaml"
"$KUBECTL" --context "kind-$CLUSTER" get mizar -A
