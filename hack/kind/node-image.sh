#!/usr/bin/env bash
# Builds the kind node image for mizar's e2e cluster on this machine, from the
# Go module proxy and Debian packages only (no registry is reachable), and
# keeps it in podman's storage under ${MIZAR_CACHE}, tagged by a hash of its
# inputs, so a warm run builds nothing. Prints the image name.
#
# The node: Debian bookworm (hack/kind/rootfs.sh) with Debian's containerd 1.6
# and runc, the node files in hack/kind/node (entrypoint, units, containerd's
# config), kubelet/kubeadm/kubectl, crictl, the CNI plugins, /kind/version,
# and every image `kubeadm init` uses imported into containerd and pinned,
# because kind runs kubeadm with preflight (and so image pulls) skipped.
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=podman-env.sh
source "$ROOT/hack/kind/podman-env.sh"
export GOWORK=off CGO_ENABLED=0

log() { echo "node-image: $*" >&2; }
((EUID == 0)) || { log "needs root (chroot, mounts)"; exit 1; }

kube=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$ROOT/hack/tools/kube/go.mod")
etcdv=$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' "$ROOT/hack/tools/kube/go.mod")
corednsv=$(awk '$1 == "github.com/coredns/coredns" {print $2; exit}' "$ROOT/hack/tools/node/go.mod")

bins=(kubelet kubeadm kubectl kube-proxy kube-apiserver kube-controller-manager kube-scheduler etcd
  crictl coredns loopback portmap bridge host-local ptp)
mapfile -t paths < <("$ROOT/hack/kube-binaries.sh" "${bins[@]}")
declare -A bin=()
for i in "${!bins[@]}"; do bin[${bins[$i]}]=${paths[$i]}; done

# Everything the image is made of: the binaries' versioned paths, the node
# files, and the sources of this script, the pause command and the image tool.
key=$( {
  printf '%s\n' "${paths[@]}"
  "$ROOT/hack/kind/rootfs.sh"
  cd "$ROOT" && find hack/kind/node hack/kind/pause hack/tools/image/main.go hack/kind/node-image.sh hack/kind/debian-subset.sh -type f -print0 | sort -z | xargs -0 sha256sum
} | sha256sum | cut -c1-12)
IMAGE=localhost/mizar/kind-node:$kube-$key
if podman image exists "$IMAGE"; then
  echo "$IMAGE"
  exit 0
fi
rootfs_tar=$("$ROOT/hack/kind/rootfs.sh")
start=$SECONDS

tmp=$(mktemp -d "$MIZAR_CACHE/kind-node-build.XXXXXX")
R=$tmp/rootfs
ctrd=
cleanup() {
  [[ -n $ctrd ]] && kill "$ctrd" 2>/dev/null && wait "$ctrd" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$R" "$tmp/images" "$tmp/bin"
tar -C "$R" -xf "$rootfs_tar"

log "node files and binaries"
cp -a "$ROOT/hack/kind/node/." "$R/"
install -m 755 "${bin[kubelet]}" "${bin[kubeadm]}" "${bin[kubectl]}" "$R/usr/bin/"
install -m 755 "${bin[crictl]}" "$R/usr/local/bin/"
mkdir -p "$R/opt/cni/bin" "$R/etc/cni/net.d" "$R/etc/kubernetes/manifests" "$R/kind"
for p in loopback portmap bridge host-local ptp; do install -m 755 "${bin[$p]}" "$R/opt/cni/bin/"; done
echo "$kube" >"$R/kind/version"
rm -f "$R/etc/machine-id" "$R/var/lib/dbus/machine-id"  # each node makes its own (entrypoint)
# containerd's default spec without its rlimits (1024 open files), so
# containers inherit containerd's, as kind's base image does.
chroot "$R" ctr oci spec | jq 'del(.process.rlimits)' >"$R/etc/containerd/cri-base.json"
# systemd in a container: only what a node needs starts (as kind's base image).
rm -f "$R"/lib/systemd/system/multi-user.target.wants/* "$R"/etc/systemd/system/*.wants/* \
  "$R"/lib/systemd/system/local-fs.target.wants/* "$R"/lib/systemd/system/sockets.target.wants/*udev* \
  "$R"/lib/systemd/system/sockets.target.wants/*initctl* "$R"/lib/systemd/system/basic.target.wants/*
find "$R/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
echo "ReadKMsg=no" >>"$R/etc/systemd/journald.conf"
chroot "$R" systemctl enable containerd.service kubelet.service undo-mount-hacks.service 2>/dev/null
chroot "$R" systemctl mask systemd-binfmt.service 2>/dev/null

log "control-plane, kube-proxy, CoreDNS, etcd and pause images"
(cd "$ROOT/hack/tools/image" && go build -trimpath -o "$tmp/bin/image" .)
(cd "$ROOT" && go build -trimpath -ldflags=-s -o "$tmp/bin/pause" ./hack/kind/pause)
img() { "$tmp/bin/image" "$@"; }
rootpath=PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin
# kubeadm's static pods run these by bare name, as root (they read the keys
# kubeadm writes 0600), and set no runAsUser.
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  img --binary "${bin[$c]}" --path "/usr/local/bin/$c" --name "registry.k8s.io/$c:$kube" --user 0:0 --env "$rootpath" --out "$tmp/images/$c.tar"
done
# etcd is the one the kube tools module builds (kubeadm's own pick is given to
# kind's kubeadm config as etcd.local.imageTag, hack/kind/cluster.yaml).
img --binary "${bin[etcd]}" --path /usr/local/bin/etcd --name "registry.k8s.io/etcd:${etcdv#v}-0" --user 0:0 --env "$rootpath" --out "$tmp/images/etcd.tar"
img --binary "${bin[coredns]}" --path /coredns --name "registry.k8s.io/coredns/coredns:$corednsv" --user 0:0 --out "$tmp/images/coredns.tar"
img --binary "$tmp/bin/pause" --path /pause --name registry.k8s.io/pause:3.10.1 --out "$tmp/images/pause.tar"
# kube-proxy runs iptables-nft, iptables-restore, conntrack and (in nftables
# mode) nft: their files and the shared libraries they load, taken from the
# node's own Debian rootfs.
"$ROOT/hack/kind/debian-subset.sh" "$R" "$tmp/kube-proxy-base.tar" iptables conntrack nftables
img --binary "${bin[kube-proxy]}" --path /usr/local/bin/kube-proxy --name "registry.k8s.io/kube-proxy:$kube" --user 0:0 --env "$rootpath" \
  --base "$tmp/kube-proxy-base.tar" --out "$tmp/images/kube-proxy.tar"

# Every image kubeadm will ask for must be one of these (etcd by its tag).
want=$(chroot "$R" kubeadm config images list --kubernetes-version "$kube" 2>/dev/null | sed 's|^registry.k8s.io/etcd:.*|registry.k8s.io/etcd|')
have="registry.k8s.io/kube-apiserver:$kube registry.k8s.io/kube-controller-manager:$kube registry.k8s.io/kube-scheduler:$kube
registry.k8s.io/kube-proxy:$kube registry.k8s.io/coredns/coredns:$corednsv registry.k8s.io/pause:3.10.1 registry.k8s.io/etcd"
for w in $want; do
  grep -qxF "$w" <<<"$(tr ' ' '\n' <<<"$have")" || { log "kubeadm $kube wants $w, which this script does not build"; exit 1; }
done

log "importing the images into the node's containerd"
mkdir -p "$R/run/containerd"
# A private mount namespace: containerd's unpack mounts stay out of the host's.
unshare -m --propagation private bash -c '
  set -e
  mount -t proc proc "$1/proc"
  mount --rbind /dev "$1/dev"
  exec chroot "$1" containerd --address /run/containerd/build.sock' _ "$R" >"$tmp/containerd.log" 2>&1 &
ctrd=$!
for _ in $(seq 100); do [[ -S $R/run/containerd/build.sock ]] && break; sleep 0.1; done
ctr() { ctr_bin=$R/usr/bin/ctr; "$ctr_bin" --address "$R/run/containerd/build.sock" --namespace k8s.io "$@"; }
for t in "$tmp"/images/*.tar; do
  ctr images import --snapshotter overlayfs "$t" >/dev/null || { tail -20 "$tmp/containerd.log" >&2; exit 1; }
done
for name in $(ctr images ls -q); do ctr images label "$name" io.cri-containerd.pinned=pinned >/dev/null; done
ctr images ls -q | sed 's/^/node-image:   /' >&2
kill "$ctrd"; wait "$ctrd" 2>/dev/null || true; ctrd=
rm -rf "$R/run/containerd"

log "podman import (about 1 GB)"
tar -C "$R" --numeric-owner -c . | podman import \
  --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
  --change 'ENV container=docker' --change 'STOPSIGNAL SIGRTMIN+3' --quiet - "$IMAGE" >/dev/null
log "built $IMAGE in $((SECONDS - start)) s"
echo "$IMAGE"
