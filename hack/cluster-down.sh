#!/usr/bin/env bash
# Removes what hack/cluster-up.sh made: agents, apiserver, namespaces, pins.
set -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DATA=${MIZAR_CLUSTER_DIR:-$ROOT/_output/cluster}
[[ -d $DATA ]] || { echo "No cluster in $DATA."; exit 0; }
stop() {
  local pidfile=$1 pid
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  if kill -TERM "$pid" 2>/dev/null; then
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  fi
  rm -f "$pidfile"
}
for f in "$DATA"/node*/nodeagent.pid; do stop "$f"; done
stop "$DATA/apiserver.pid"
if [[ -f $DATA/netns ]]; then
  while read -r ns; do ip netns del "$ns" 2>/dev/null; done <"$DATA/netns"
fi
for d in "$DATA"/node*; do
  [[ -d $d ]] && rm -rf "/sys/fs/bpf/mizar-$(basename "$d")"
done
rm -rf "$DATA"
echo "Cluster removed."
