#!/usr/bin/env bash
# make up. As root: a local mizar cluster on this machine, no Docker: a
# standalone mizar-apiserver, an underlay bridge and MIZAR_NODES (3) nodes,
# each a network namespace with its own mizar-nodeagent (running in the host,
# programming its node's netns through --host-netns) and droplet identity;
# then a VPC with two subnets, pods added with the real cnitool (per-node
# NETCONFPATH and CNI_PATH, as a runtime invokes the plugin), `kubectl get
# mizar -o wide` and pings across nodes. Every netns, link and pin of a run
# starts with a random prefix (mzpnXXXX), so tests and a demo coexist.
# Without root (namespaces and BPF need it): the standalone mizar-apiserver
# alone, with an example network applied. hack/down.sh undoes either.
set -o errexit -o nounset -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/_output/bin
APISERVER=${MIZAR_APISERVER:-$BIN/mizar-apiserver}
KUBECTL=${KUBECTL:-kubectl}
# Without kubectl nothing below can talk to the server: say so before starting it.
"$ROOT/hack/require-kubectl.sh"
kubectl() { command "$KUBECTL" "$@"; }

# start_apiserver DATA PORT LOG PIDFILE: a standalone mizar-apiserver, ready.
start_apiserver() {
  local data=$1 port=$2 log=$3 pidfile=$4
  mkdir -p "$data"
  rm -f "$data/kubeconfig"
  "$APISERVER" --standalone --data-dir "$data" --secure-port "$port" >"$log" 2>&1 &
  echo $! >"$pidfile"
  echo "Starting mizar-apiserver (pid $!, log $log) ..."
  for _ in $(seq 1 120); do
    if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      echo "mizar-apiserver exited; last lines of $log:" >&2
      tail -20 "$log" >&2
      rm -f "$pidfile"
      return 1
    fi
    [[ -f $data/kubeconfig ]] && kubectl --kubeconfig "$data/kubeconfig" get --raw /readyz >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "mizar-apiserver did not become ready within 60 s; last lines of $log:" >&2
  tail -20 "$log" >&2
  return 1
}

standalone() {
  local data=${MIZAR_DATA_DIR:-$ROOT/_output/local}
  local pidfile=$data/mizar-apiserver.pid log=$data/mizar-apiserver.log
  export KUBECONFIG=$data/kubeconfig
  if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "mizar-apiserver is already running (pid $(cat "$pidfile")); 'make down' stops it."
  elif ! start_apiserver "$data" "${MIZAR_PORT:-0}" "$log" "$pidfile"; then
    "$ROOT/hack/down.sh" >&2
    exit 1
  fi
  echo
  echo "== kubectl apply -f artifacts/examples/network.yaml"
  kubectl apply -f "$ROOT/artifacts/examples/network.yaml"
  echo
  echo "== kubectl get mizar"
  kubectl get mizar
  echo
  echo "== kubectl get mep -A -o wide"
  kubectl get mep -A -o wide
  cat <<MSG

mizar-apiserver is serving on $(kubectl config view -o jsonpath='{.clusters[0].cluster.server}').
Try:  export KUBECONFIG=$KUBECONFIG
      kubectl explain subnet.spec
'make down' stops it (the data in $data stays; 'make clean' removes it).
MSG
}

cluster() {
  local data=${MIZAR_CLUSTER_DIR:-$ROOT/_output/cluster} nodes=${MIZAR_NODES:-3}
  export KUBECONFIG=$data/kubeconfig
  if [[ -f $data/prefix ]]; then
    echo "make up: a cluster is already up in $data; 'make down' removes it." >&2
    exit 1
  fi
  for b in "$APISERVER" "$BIN/mizar-nodeagent" "$BIN/cni/mizar" "$BIN/cnitool"; do
    [[ -x $b ]] || { echo "make up: $b is missing; 'make build' builds it." >&2; exit 1; }
  done
  command -v jq >/dev/null || { echo "make up: jq is missing; 'make deps' installs it." >&2; exit 1; }
  mkdir -p "$data"
  local pfx
  pfx=mzpn$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')
  echo "$pfx" >"$data/prefix"
  trap 'echo "make up failed; logs are in $data; '"'"'make down'"'"' cleans up." >&2' ERR

  echo "== mizar-apiserver (standalone, embedded etcd, operators on); names start with $pfx"
  start_apiserver "$data" 0 "$data/apiserver.log" "$data/apiserver.pid"

  echo "== underlay bridge (netns $pfx-ul, 198.19.0.0/24)"
  ip netns add "$pfx-ul"
  echo "$pfx-ul" >>"$data/netns"
  ip -n "$pfx-ul" link add br0 type bridge
  ip -n "$pfx-ul" link set br0 up

  local i
  for i in $(seq 1 "$nodes"); do
    local node=node$i ns=$pfx-node$i dir=$data/node$i port=$pfx-n$i
    echo "== $node: netns $ns, underlay 198.19.0.$i, mizar-nodeagent"
    mkdir -p "$dir/net.d"
    ip netns add "$ns"
    echo "$ns" >>"$data/netns"
    ip link add eth0 netns "$ns" type veth peer name "$port" netns "$pfx-ul"
    ip -n "$ns" addr add "198.19.0.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$pfx-ul" link set "$port" master br0 up
    # The underlay veths act as a NIC on a wire: segmentation and checksums
    # are done before a frame leaves (a veth would hand them to the peer undone).
    local side
    for side in "$ns eth0" "$pfx-ul $port"; do
      set -- $side
      ip netns exec "$1" ethtool -K "$2" tx-checksum-ip-generic off tx-tcp-segmentation off tx-tcp6-segmentation off \
        tx-generic-segmentation off tx-udp_tnl-segmentation off tx-udp_tnl-csum-segmentation off >/dev/null
    done
    "$APISERVER" droplet-kubeconfig --data-dir "$data" --droplet "$node" --out "$dir/kubeconfig"
    "$BIN/mizar-nodeagent" --kubeconfig "$dir/kubeconfig" --droplet "$node" --node-name "$node" \
      --host-netns "/run/netns/$ns" --underlay eth0 --xdp-generic --pin-root "/sys/fs/bpf/$pfx-$node" \
      --cni-socket "$dir/cni.sock" --cni-delete-queue "$dir/delete-queue" --cni-state-dir "$dir/state" \
      --health-addr "127.0.0.1:$((9100 + i))" >"$dir/nodeagent.log" 2>&1 &
    echo $! >"$dir/nodeagent.pid"
    local subnet
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
    local node=$1 name=$pfx-$2 subnet=$3 dir=$data/$1 try
    ip netns add "$name"
    echo "$name" >>"$data/netns"
    for try in $(seq 1 60); do
      if NETCONFPATH=$dir/net.d CNI_PATH=$BIN/cni CNI_ARGS="K8S_POD_NAMESPACE=default;K8S_POD_NAME=$2" \
        "$BIN/cnitool" add "$subnet" "/run/netns/$name" >"$data/$2.result" 2>&1; then
        echo "  $name on $node in $subnet: $(jq -r '.ips[0].address' "$data/$2.result")"
        return 0
      fi
      # The agent may still be starting: the plugin answers "try again later" (11).
      grep -q '"code": 11' "$data/$2.result" || break
      sleep 0.5
    done
    cat "$data/$2.result" >&2
    return 1
  }
  echo "== pods (cnitool add)"
  for i in $(seq 1 "$nodes"); do
    add_pod "node$i" "pod-f$i" frontend
  done
  add_pod node1 pod-b1 backend

  ip_of() { jq -r '.ips[0].address' "$data/$1.result" | cut -d/ -f1; }
  echo
  echo "== kubectl get mizar -o wide"
  kubectl get mizar -o wide
  echo
  echo "== ping $pfx-pod-f1 (node1) -> pod-f2 (node2), same subnet across nodes"
  ip netns exec "$pfx-pod-f1" ping -c3 -W2 "$(ip_of pod-f2)"
  echo
  echo "== ping $pfx-pod-f$nodes (node$nodes) -> pod-b1 (node1), across subnets through the divider"
  ip netns exec "$pfx-pod-f$nodes" ping -c3 -W2 "$(ip_of pod-b1)"
  trap - ERR
  cat <<MSG

The cluster is up ($nodes nodes, names prefixed $pfx; state, logs and results in $data).
  export KUBECONFIG=$KUBECONFIG; kubectl get mizar -o wide
  Add a pod by hand:
    ip netns add $pfx-mypod
    echo $pfx-mypod >>$data/netns      # so 'make down' removes it
    NETCONFPATH=$data/node2/net.d CNI_PATH=$BIN/cni $BIN/cnitool add frontend /run/netns/$pfx-mypod
    ip netns exec $pfx-mypod ping $(ip_of pod-f1)
  Metrics: curl -s 127.0.0.1:9101/metrics | grep mizar_
'make down' removes every namespace, pin and process it made.
MSG
}

if [[ $(id -u) == 0 ]]; then
  cluster
else
  echo "make up: not root, so no nodes (network namespaces and BPF need root);"
  echo "starting the standalone mizar-apiserver demo instead. Run 'sudo make up' for the 3-node cluster."
  standalone
fi
