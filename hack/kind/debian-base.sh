#!/usr/bin/env bash
# debian-base.sh PACKAGE...: prints the path of a tarball holding the named
# Debian packages' files, their dependencies and the shared libraries they load
# (hack/kind/debian-subset.sh), taken from the cached bookworm root filesystem
# (hack/kind/rootfs.sh): the base layer of an image that runs Debian's tools,
# such as the node agent's nft. Cached beside the rootfs, keyed by the rootfs,
# the package list and debian-subset.sh; warm: nothing is built.
set -o errexit -o nounset -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
(($#)) || { echo "debian-base: name at least one package" >&2; exit 2; }
rootfs=$("$HERE/rootfs.sh")
key=$( { echo "$rootfs"; printf '%s\n' "$@"; sha256sum "$HERE/debian-subset.sh"; } | sha256sum | cut -c1-12)
out=$(dirname "$rootfs")/subset-$key.tar
if [[ -s $out ]]; then
  echo "$out"
  exit 0
fi
tmp=$(mktemp -d "$(dirname "$rootfs")/subset.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/rootfs"
tar -C "$tmp/rootfs" -xf "$rootfs"
"$HERE/debian-subset.sh" "$tmp/rootfs" "$tmp/subset.tar" "$@"
mv "$tmp/subset.tar" "$out"
echo "$out"
