#!/usr/bin/env bash
# refcni.sh: installs the reference network in the kind cluster (KUBECONFIG,
# default _output/kind/kubeconfig): the
# containernetworking bridge + host-local plugins on each node's pod CIDR,
# portmap for hostPort, a route on every node to every other node's pod CIDR,
# and masquerade for traffic leaving the pod range (what kind's own kindnet
# does). The baseline bench-cluster measures mizar against, and a check of the
# kind harness that does not depend on mizar.
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=podman-env.sh
source "$ROOT/hack/kind/podman-env.sh"
export KUBECONFIG=${KUBECONFIG:-$ROOT/_output/kind/kubeconfig}
KUBECTL=${KUBECTL:-$("$ROOT/hack/kube-binaries.sh" kubectl)}
pods=$(awk '/podSubnet:/ {print $2}' "$ROOT/hack/kind/cluster.yaml")

declare -A cidr=() ip=()
for n in $("$KUBECTL" get nodes -o name); do
  n=${n#node/}
  cidr[$n]=$("$KUBECTL" get node "$n" -o jsonpath='{.spec.podCIDR}')
  ip[$n]=$("$KUBECTL" get node "$n" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')
  [[ -n ${cidr[$n]} && -n ${ip[$n]} ]] || { echo "refcni: node $n has no pod CIDR or address yet" >&2; exit 1; }
done
for n in "${!cidr[@]}"; do
  podman exec -i "$n" sh -c 'cat >/etc/cni/net.d/10-reference.conflist' <<CONF
{
  "cniVersion": "1.0.0",
  "name": "reference",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "${cidr[$n]}"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
CONF
  for m in "${!cidr[@]}"; do
    [[ $m == "$n" ]] || podman exec "$n" ip route replace "${cidr[$m]}" via "${ip[$m]}"
  done
  podman exec "$n" sh -c "iptables -t nat -C POSTROUTING -s $pods ! -d $pods -j MASQUERADE 2>/dev/null ||
    iptables -t nat -A POSTROUTING -s $pods ! -d $pods -j MASQUERADE"
  echo "refcni: $n ${cidr[$n]} via ${ip[$n]}" >&2
done
