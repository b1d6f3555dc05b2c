#!/usr/bin/env bash
# Builds the e2e test pods' image: Kubernetes' agnhost (netexec serves HTTP and
# UDP, /dial reaches other pods, /shell runs commands) on busybox from the
# node's Debian rootfs (the shell, wget, nc, ping, nslookup the checks run).
# Cached by version; prints the OCI tarball's path. Image name:
# mizar.dev/e2e-agnhost:<kubernetes version>.
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${MIZAR_CACHE:-$HOME/.cache/mizar}
export GOWORK=off CGO_ENABLED=0

agnhost=$("$ROOT/hack/kube-binaries.sh" agnhost)
rootfs_tar=$("$ROOT/hack/kind/rootfs.sh")
kube=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$ROOT/hack/tools/kube/go.mod")
key=$( { echo "$agnhost $rootfs_tar"; sha256sum "$0" "$ROOT/hack/tools/image/main.go"; } | sha256sum | cut -c1-12)
out=$CACHE/e2e-agnhost-$kube-$key/e2e-agnhost.tar
if [[ -s $out ]]; then
  echo "$out"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/root/bin" "$tmp/root/tmp" "$tmp/root/etc"
tar -C "$tmp" -xf "$rootfs_tar" ./usr/bin/busybox
mv "$tmp/usr/bin/busybox" "$tmp/root/bin/busybox"
for applet in $("$tmp/root/bin/busybox" --list); do
  [[ $applet == busybox ]] || ln -s busybox "$tmp/root/bin/$applet"
done
echo "root:x:0:0:root:/:/bin/sh" >"$tmp/root/etc/passwd"
tar -C "$tmp/root" --numeric-owner -cf "$tmp/base.tar" .
(cd "$ROOT/hack/tools/image" && go build -trimpath -o "$tmp/image" .)
mkdir -p "$(dirname "$out")"
# Root: the checks ping (raw sockets) and bind low ports.
"$tmp/image" --binary "$agnhost" --path /agnhost --name "mizar.dev/e2e-agnhost:$kube" --user 0:0 \
  --env PATH=/bin --base "$tmp/base.tar" --out "$out.tmp"
mv "$out.tmp" "$out"
echo "$out"
