#!/usr/bin/env bash
# Stops the server 'make up' started; its data directory is kept.
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DATA=${MIZAR_DATA_DIR:-$ROOT/_output/local}
pidfile=$DATA/mizar-apiserver.pid
if [[ ! -f $pidfile ]] || ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  echo "mizar-apiserver is not running."
  rm -f "$pidfile"
  exit 0
fi
pid=$(cat "$pidfile")
# SIGTERM is a graceful stop: open watches end at once and the embedded etcd
# closes cleanly, normally within a second or two. A SIGKILL would leave etcd's
# leases behind, so wait for the exit rather than forcing it.
kill -TERM "$pid"
for i in $(seq 1 180); do
  kill -0 "$pid" 2>/dev/null || break
  if ((i == 20)); then echo "Waiting for mizar-apiserver (pid $pid) to finish shutting down ..."; fi
  sleep 0.5
done
if kill -0 "$pid" 2>/dev/null; then
  echo "mizar-apiserver (pid $pid) is still shutting down after 90 s; see $DATA/mizar-apiserver.log." >&2
  echo "It was not killed; 'kill -KILL $pid' forces it (the next start may then wait for stale etcd leases)." >&2
  exit 1
fi
rm -f "$pidfile"
echo "mizar-apiserver stopped (data kept in $DATA)."
