#!/usr/bin/env bash
# A local mizar cluster on one machine, no Docker: a standalone mizar-apiserver,
# an underlay bridge, and MIZAR_NODES (3) nodes, each a network namespace with
# its own mizar-nodeagent (running in the host, programming its node's netns
# through --host-netns) and its own droplet identity. Pods are network
# namespaces added through the real cnitool with a per-node NETCONFPATH and
# CNI_PATH, exactly as a runtime invokes the plugin. Needs root.
# hack/cluster-down.sh removes every namespace, pin and process it made.
set -o errexit -o nounset -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/_output/bin
DATA=${MIZAR_CLUSTER_DIR:-$ROOT/_output/cluster}
NODES=${MIZAR_NODES:-3}
export KUBECONFIG=$DATA/kubeconfig
KUBECTL=${KUBECTL:-kubectl}
kubectl() { command "$KUBECTL" "$@"; }

[[ $(id -u) == 0 ]] || { echo "cluster-up: needs root (network namespaces, BPF)" >&2; exit 1; }
if [[ -f $DATA/apiserver.pid ]]; then
  echo "cluster-up: a cluster is already up in $DATA; 'make cluster-down' removes it." >&2
  exit 1
fi
mkdir -p "$DATA"
on_error() { echo "cluster-up failed; logs are in $DATA; 'make cluster-down' cleans up." >&2; }
trap on_error ERR

echo "== mizar-apiserver (standalone, embedded etcd, operators on)"
"$BIN/mizar-apiserver" --standalone --data-dir "$DATA" --secure-port 0 >"$DATA/apiserver.log" 2>&1 &
echo $! >"$DATA/apiserver.pid"
for _ in $(seq 1 120); do
  [[ -f $KUBECONFIG ]] && kubectl get --raw /readyz >/dev/null 2>&1 && break
  kill -0 "$(cat "$DATA/apiserver.pid")" 2>/dev/null || { tail -20 "$DATA/apiserver.log" >&2; exit 1; }
  sleep 0.5
done
kubectl get --raw /readyz >/dev/null

echo "== underlay bridge (netns mizar-ul, 198.19.0.0/24)"
ip netns add mizar-ul
echo mizar-ul >>"$DATA/netns"
ip -n mizar-ul link add br0 type bridge
ip -n mizar-ul link set br0 up

for i in $(seq 1 "$NODES"); do
  node=node$i ns=mizar-node$i dir=$DATA/node$i
  echo "== $node: netns $ns, underlay 198.19.0.$i, mizar-nodeagent"
  mkdir -p "$dir/net.d"
  ip netns add "$ns"
  echo "$ns" >>"$DATA/netns"
  ip link add eth0 netns "$ns" type veth peer name "$node" netns mizar-ul
  ip -n "$ns" addr add "198.19.0.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n mizar-ul link set "$node" master br0 up
  # The underlay veths act as a NIC on a wire: segmentation and checksums are
  # done before a frame leaves (a veth would hand them to the peer undone).
  for side in "$ns eth0" "mizar-ul $node"; do
    set -- $side
    ip netns exec "$1" ethtool -K "$2" tx-checksum-ip-generic off tx-tcp-segmentation off tx-tcp6-segmentation off \
      tx-generic-segmentation off tx-udp_tnl-segmentation off tx-udp_tnl-csum-segmentation off >/dev/null
  done
  "$BIN/mizar-apiserver" droplet-kubeconfig --data-dir "$DATA" --droplet "$node" --out "$dir/kubeconfig"
  "$BIN/mizar-nodeagent" --kubeconfig "$dir/kubeconfig" --droplet "$node" --node "$node" \
    --host-netns "/run/netns/$ns" --underlay eth0 --xdp-generic --pin-root "/sys/fs/bpf/mizar-$node" \
    --cni-socket "$dir/cni.sock" --cni-delete-queue "$dir/delete-queue" --cni-state-dir "$dir/state" \
    --health-addr "127.0.0.1:$((9100 + i))" >"$dir/nodeagent.log" 2>&1 &
  echo $! >"$dir/nodeagent.pid"
  for subnet in frontend backend; do
    cat >"$dir/net.d/10-$subnet.conflist" <<CONF
{"cniVersion": "1.1.0", "name": "$subnet", "plugins": [{"type": "mizar", "vpc": "demo", "subnet": "demo-$subnet",
  "agentSocket": "$dir/cni.sock", "deleteQueue": "$dir/delete-queue"}]}
CONF
  done
done

echo "== VPC demo (10.100.0.0/16) with subnets demo-frontend and demo-backend"
kubectl apply -f - <<'YAML'
apiVersion: networking.mizar.dev/v1alpha1
kind: Vpc
metadata: {name: demo}
spec: {cidr: 10.100.0.0/16}
---
apiVersion: networking.mizar.dev/v1alpha1
kind: Subnet
metadata: {name: demo-frontend}
spec: {vpc: demo, cidr: 10.100.1.0/24}
---
apiVersion: networking.mizar.dev/v1alpha1
kind: Subnet
metadata: {name: demo-backend}
spec: {vpc: demo, cidr: 10.100.2.0/24}
YAML

# add_pod NODE NAME SUBNET: a pod netns wired by cnitool as a runtime would.
add_pod() {
  local node=$1 name=$2 subnet=$3 dir=$DATA/$1
  ip netns add "$name"
  echo "$name" >>"$DATA/netns"
  for try in $(seq 1 60); do
    if NETCONFPATH=$dir/net.d CNI_PATH=$BIN/cni CNI_ARGS="K8S_POD_NAMESPACE=default;K8S_POD_NAME=$name" \
      "$BIN/cnitool" add "$subnet" "/run/netns/$name" >"$DATA/$name.result" 2>&1; then
      echo "  $name on $node in $subnet: $(jq -r '.ips[0].address' "$DATA/$name.result")"
      return 0
    fi
    # The agent may still be starting: the plugin answers "try again later" (11).
    grep -q '"code": 11' "$DATA/$name.result" || break
    sleep 0.5
  done
  cat "$DATA/$name.result" >&2
  return 1
}
echo "== pods (cnitool add)"
for i in $(seq 1 "$NODES"); do
  add_pod "node$i" "pod-f$i" frontend
done
add_pod node1 pod-b1 backend

ip_of() { jq -r '.ips[0].address' "$DATA/$1.result" | cut -d/ -f1; }
echo
echo "== kubectl get mizar -o wide"
kubectl get mizar -o wide
echo
echo "== ping pod-f1 (node1) -> pod-f2 (node2), same subnet across nodes"
ip netns exec pod-f1 ping -c3 -W2 "$(ip_of pod-f2)"
echo
echo "== ping pod-f$NODES (node$NODES) -> pod-b1 (node1), across subnets through the divider"
ip netns exec "pod-f$NODES" ping -c3 -W2 "$(ip_of pod-b1)"
trap - ERR
cat <<MSG

The cluster is up ($NODES nodes; state, logs and results in $DATA).
  export KUBECONFIG=$KUBECONFIG; kubectl get mizar -o wide
  Add a pod by hand:
    ip netns add mypod
    echo mypod >>$DATA/netns
    NETCONFPATH=$DATA/node2/net.d CNI_PATH=$BIN/cni $BIN/cnitool add frontend /run/netns/mypod
    ip netns exec mypod ping $(ip_of pod-f1)
  Metrics: curl -s 127.0.0.1:9101/metrics | grep mizar_
'make cluster-down' removes every namespace, pin and process it made.
MSG
