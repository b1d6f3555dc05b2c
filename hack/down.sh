#!/usr/bin/env bash
# make down: removes the cluster 'make up' made as root (agents, apiserver,
# namespaces, pins, state), and stops the standalone server 'make up' started
# without root (its data directory is kept).
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# stop PIDFILE NAME: SIGTERM, then wait for the exit. A SIGKILL would leave
# etcd's leases behind, so a server that takes long is not forced.
stop() {
  local pidfile=$1 name=$2 pid i
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  if kill -TERM "$pid" 2>/dev/null; then
    for i in $(seq 1 180); do
      kill -0 "$pid" 2>/dev/null || break
      if ((i == 20)); then echo "Waiting for $name (pid $pid) to finish shutting down ..."; fi
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "$name (pid $pid) is still shutting down after 90 s; it was not killed ('kill -KILL $pid' forces it)." >&2
      return 1
    fi
  fi
  rm -f "$pidfile"
}

cluster=${MIZAR_CLUSTER_DIR:-$ROOT/_output/cluster}
removed=false
if [[ -d $cluster ]]; then
  if [[ $(id -u) != 0 ]]; then
    echo "make down: the cluster in $cluster needs root to remove (namespaces, BPF pins): run 'sudo make down'." >&2
    exit 1
  fi
  ok=true
  for f in "$cluster"/node*/nodeagent.pid; do stop "$f" mizar-nodeagent || ok=false; done
  stop "$cluster/apiserver.pid" mizar-apiserver || ok=false
  if [[ -f $cluster/netns ]]; then
    while read -r ns; do
      ip netns del "$ns" 2>/dev/null || true
      # cnitool's result cache (libcni's default directory), keyed by a hash
      # of the netns path, for pods never deleted.
      id=cnitool-$(printf %s "/run/netns/$ns" | sha512sum | cut -c1-20)
      rm -f /var/lib/cni/results/*-"$id"-*
    done <"$cluster/netns"
  fi
  if [[ -f $cluster/prefix ]]; then
    pfx=$(cat "$cluster/prefix")
    [[ $pfx =~ ^mzpn[0-9a-f]+$ ]] && rm -rf /sys/fs/bpf/"$pfx"-*
  fi
  if $ok; then
    rm -rf "$cluster"
    removed=true
    echo "Cluster removed."
  else
    echo "Some processes are still running; $cluster is kept." >&2
    exit 1
  fi
fi

data=${MIZAR_DATA_DIR:-$ROOT/_output/local}
pidfile=$data/mizar-apiserver.pid
if [[ ! -f $pidfile ]] || ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  rm -f "$pidfile"
  $removed || echo "mizar-apiserver is not running."
  exit 0
fi
stop "$pidfile" mizar-apiserver
echo "mizar-apiserver stopped (data kept in $data)."
