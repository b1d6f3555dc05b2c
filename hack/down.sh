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
kill -TERM "$pid"
for _ in $(seq 1 60); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.5
done
if kill -0 "$pid" 2>/dev/null; then
  echo "mizar-apiserver (pid $pid) ignored SIGTERM for 30 s; killing it." >&2
  kill -KILL "$pid"
fi
rm -f "$pidfile"
echo "mizar-apiserver stopped (data kept in $DATA)."
