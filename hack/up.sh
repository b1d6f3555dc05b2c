#!/usr/bin/env bash
# Brings up a standalone mizar-apiserver (embedded etcd, no cluster) in the
# background, applies the example network and shows it with kubectl.
set -o errexit -o nounset -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${MIZAR_APISERVER:-$ROOT/_output/bin/mizar-apiserver}
DATA=${MIZAR_DATA_DIR:-$ROOT/_output/local}
PORT=${MIZAR_PORT:-0}
pidfile=$DATA/mizar-apiserver.pid
log=$DATA/mizar-apiserver.log
export KUBECONFIG=$DATA/kubeconfig
# The Makefile exports the pinned kubectl (hack/kubectl-path.sh); else the one on PATH.
kubectl() { command "${KUBECTL:-kubectl}" "$@"; }

mkdir -p "$DATA"
if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  echo "mizar-apiserver is already running (pid $(cat "$pidfile")); 'make down' stops it."
else
  rm -f "$KUBECONFIG"
  "$BIN" --standalone --data-dir "$DATA" --secure-port "$PORT" >"$log" 2>&1 &
  echo $! >"$pidfile"
  echo "Starting mizar-apiserver (pid $!, log $log) ..."
  for _ in $(seq 1 120); do
    if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      echo "mizar-apiserver exited; last lines of $log:" >&2
      tail -20 "$log" >&2
      rm -f "$pidfile"
      exit 1
    fi
    [[ -f $KUBECONFIG ]] && kubectl get --raw /readyz >/dev/null 2>&1 && break
    sleep 0.5
  done
  kubectl get --raw /readyz >/dev/null || { echo "mizar-apiserver did not become ready; see $log" >&2; exit 1; }
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
'make down' stops it (the data in $DATA stays; 'make clean' removes it).
MSG
