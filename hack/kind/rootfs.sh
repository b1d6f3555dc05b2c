#!/usr/bin/env bash
# Builds the Debian bookworm root filesystem the kind node image (and the images
# that need Debian's iptables or busybox) start from, with debootstrap and
# Debian's packages only, and caches it as a tarball keyed by the package list:
#
#   ${MIZAR_CACHE:-$HOME/.cache/mizar}/debian-bookworm-<hash>/rootfs.tar
#
# Prints the tarball's path. Needs root (debootstrap, chroot). Cold: about
# 2-3 minutes (debootstrap plus apt); warm: nothing.
set -o errexit -o nounset -o pipefail

CACHE=${MIZAR_CACHE:-$HOME/.cache/mizar}
# The mirror this machine's apt sources name, so the build uses what apt-get can reach.
MIRROR=${DEBIAN_MIRROR:-$({ grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true; } | awk '{print $2}' | head -1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

# What a kind node runs (kind's images/base installs the same set, less the
# storage clients mizar's tests never use), plus Debian's containerd 1.6 and runc.
packages=(
  systemd systemd-sysv dbus
  containerd runc libseccomp2
  iptables nftables conntrack iproute2 ethtool socat ebtables kmod
  util-linux mount procps bash ca-certificates jq iputils-ping
  busybox-static   # the e2e test image's shell, ping, nc and nslookup
)

log() { echo "rootfs: $*" >&2; }

key=$(printf '%s\n' bookworm "${packages[@]}" | sha256sum | cut -c1-12)
dir=$CACHE/debian-bookworm-$key
out=$dir/rootfs.tar
if [[ -s $out ]]; then
  echo "$out"
  exit 0
fi
command -v debootstrap >/dev/null || { log "debootstrap is missing (hack/install-deps.sh installs it)"; exit 1; }
((EUID == 0)) || { log "needs root (debootstrap and chroot)"; exit 1; }

mkdir -p "$dir"
tmp=$(mktemp -d "$dir/build.XXXXXX")
cleanup() {
  umount "$tmp/rootfs/proc" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
start=$SECONDS
log "debootstrap bookworm from $MIRROR (cold: a few minutes)"
debootstrap --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" bookworm "$tmp/rootfs" "$MIRROR" >"$tmp/log" 2>&1 || {
  tail -20 "$tmp/log" >&2
  log "debootstrap failed"
  exit 1
}
# The nft backend: the kernel here has both, and kube-proxy's image uses the same.
chroot "$tmp/rootfs" update-alternatives --set iptables /usr/sbin/iptables-nft >/dev/null
chroot "$tmp/rootfs" update-alternatives --set ip6tables /usr/sbin/ip6tables-nft >/dev/null
rm -rf "$tmp/rootfs"/var/cache/apt/archives/*.deb "$tmp/rootfs"/var/lib/apt/lists/*
tar -C "$tmp/rootfs" --numeric-owner -cf "$tmp/rootfs.tar" .
mv "$tmp/rootfs.tar" "$out"
log "built $out in $((SECONDS - start)) s"
echo "$out"
