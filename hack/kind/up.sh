#!/usr/bin/env bash
# make kind-up: a 3-node kind cluster (stock kind, podman provider, the node
# image hack/kind/node-image.sh builds here) whose network is mizar, installed
# by `helm install` of artifacts/charts/mizar with the images hack/images.sh
# builds. MIZAR_KIND_CNI=reference installs the reference bridge + host-local
# plugins instead (hack/kind/refcni.sh): the baseline, and a check of the
# harness without mizar. MIZAR_KIND_CNI=none leaves the cluster without one.
#
# Idempotent: an existing cluster is kept. Everything it builds is cached by
# version under ${MIZAR_CACHE:-~/.cache/mizar}. The kubeconfig is written to
# _output/kind/kubeconfig (KUBECONFIG for kubectl and helm); `make kind-down`
# removes the cluster.
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=podman-env.sh
source "$ROOT/hack/kind/podman-env.sh"
CLUSTER=${KIND_CLUSTER:-mizar}
CNI=${MIZAR_KIND_CNI:-mizar}
export KUBECONFIG=$ROOT/_output/kind/kubeconfig

log() { echo "kind-up: $(date -u +%T) $*" >&2; }
t0=$SECONDS
step() { log "$* ($((SECONDS - t0)) s)"; }

((EUID == 0)) || { log "needs root (podman runs kind's privileged nodes; the node image is built with chroot)"; exit 1; }
command -v podman >/dev/null || { log "podman is missing: hack/install-deps.sh installs it"; exit 1; }
case $CNI in mizar | reference | none) ;; *) log "MIZAR_KIND_CNI=$CNI: want mizar, reference or none"; exit 2 ;; esac

# The etcd image the node carries is the one hack/tools/kube pins; kubeadm
# must be told its tag (cluster.yaml).
etcdv=$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' "$ROOT/hack/tools/kube/go.mod")
grep -q "imageTag: ${etcdv#v}-0" "$ROOT/hack/kind/cluster.yaml" || {
  log "hack/kind/cluster.yaml's etcd imageTag is not ${etcdv#v}-0 (hack/tools/kube/go.mod's etcd): update it"
  exit 1
}

# kind's podman provider mounts the host's /lib/modules into every node; a host
# without loadable modules (this sandbox) has no such directory.
[[ -d /lib/modules ]] || mkdir -p /lib/modules

mapfile -t tools < <("$ROOT/hack/kube-binaries.sh" kind kubectl helm)
KIND=${tools[0]} KUBECTL=${tools[1]} HELM=${tools[2]}
step "building the node image (cached)"
IMAGE=$("$ROOT/hack/kind/node-image.sh")
step "node image $IMAGE"

mkdir -p "$(dirname "$KUBECONFIG")"
# A cluster whose node containers were stopped with the run that made them
# (podman keeps them) is listed but dead: it is made anew.
if "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  "$KIND" export kubeconfig --name "$CLUSTER" --kubeconfig "$KUBECONFIG" >/dev/null || true
  if "$KUBECTL" --request-timeout=10s get nodes >/dev/null 2>&1; then
    log "cluster $CLUSTER exists; keeping it"
  else
    log "cluster $CLUSTER exists but its API does not answer (left by a stopped run?): making it anew"
    "$KIND" delete cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG"
  fi
fi
if ! "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  "$KIND" create cluster --name "$CLUSTER" --config "$ROOT/hack/kind/cluster.yaml" --image "$IMAGE" \
    --kubeconfig "$KUBECONFIG" --retain=false
fi
step "cluster $CLUSTER created"
nodes=$("$KIND" get nodes --name "$CLUSTER")

# The sandbox this runs in has a default gateway that accepts any outbound TCP
# connection (a transparent proxy): a ClusterIP port kube-proxy does not serve
# would look open. In each node, reject what is still addressed to the Service
# range after kube-proxy's DNAT, as a real network would.
svc=$(awk '/serviceSubnet:/ {print $2}' "$ROOT/hack/kind/cluster.yaml")
for n in $nodes; do
  for chain in FORWARD OUTPUT; do
    podman exec "$n" sh -c "iptables -C $chain -d $svc -j REJECT 2>/dev/null || iptables -A $chain -d $svc -j REJECT"
  done
done

# CoreDNS forwards names outside the cluster to the node's resolver, which
# under podman is aardvark-dns: it answers no TCP, so a client asking CoreDNS
# over TCP (the DNS conformance specs do) got SERVFAIL for every name that
# walks the node's search domain. Ask upstream over UDP whatever the client used.
corefile=$("$KUBECTL" -n kube-system get configmap coredns -o jsonpath='{.data.Corefile}')
if ! grep -q prefer_udp <<<"$corefile"; then
  "$KUBECTL" -n kube-system get configmap coredns -o json |
    jq '.data.Corefile |= sub("forward \\. /etc/resolv.conf \\{"; "forward . /etc/resolv.conf {\n           prefer_udp")' |
    "$KUBECTL" apply -f - >/dev/null
  "$KUBECTL" -n kube-system get configmap coredns -o jsonpath='{.data.Corefile}' | grep -q prefer_udp ||
    { log "could not set prefer_udp in CoreDNS's Corefile"; exit 1; }
fi

case $CNI in
reference)
  "$ROOT/hack/kind/refcni.sh"
  ;;
mizar)
  step "building mizar's images"
  mapfile -t images < <("$ROOT/hack/images.sh" dev)
  for want in mizar-apiserver "mizar-(node)?agent"; do
    printf '%s\n' "${images[@]}" | grep -Eq "/$want.tar$" || {
      log "hack/images.sh built no $want image (see its messages above): the chart cannot run without it"
      exit 1
    }
  done
  for img in "${images[@]}"; do
    "$KIND" load image-archive --name "$CLUSTER" "$img"
  done
  step "images loaded; helm install"
  # pullPolicy Never: the images exist only in the nodes (no registry).
  # MIZAR_HELM_ARGS: extra helm flags, split on spaces.
  # shellcheck disable=SC2086
  "$HELM" upgrade --install mizar "$ROOT/artifacts/charts/mizar" --namespace mizar-system --create-namespace \
    --set image.pullPolicy=Never --set agent.image.pullPolicy=Never ${MIZAR_HELM_ARGS:-}
  ;;
none) ;;
esac

# What keeps nodes NotReady: their condition, and the network's pods and events.
diagnose() {
  "$KUBECTL" get nodes -o 'custom-columns=NODE:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,WHY:.status.conditions[?(@.type=="Ready")].message' >&2 || true
  if [[ $CNI == mizar ]]; then
    "$KUBECTL" get pods -n mizar-system -o wide >&2 || true
    "$KUBECTL" get events -n mizar-system --field-selector type=Warning --sort-by=.lastTimestamp 2>/dev/null | tail -15 >&2 || true
  fi
}
if [[ $CNI != none ]]; then
  step "waiting for every node to be Ready"
  if ! "$KUBECTL" wait --for=condition=Ready node --all --timeout="${MIZAR_KIND_READY_TIMEOUT:-300s}"; then
    log "nodes are not Ready with the $CNI network:"
    diagnose
    exit 1
  fi
fi
"$KUBECTL" get nodes -o wide
step "done; export KUBECONFIG=$KUBECONFIG"
