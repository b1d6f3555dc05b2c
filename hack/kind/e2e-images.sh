#!/usr/bin/env bash
# Builds the images Kubernetes' e2e suite runs its pods from, under the exact
# names `e2e.test --list-images` prints (registry.k8s.io/e2e-test-images/...),
# without a registry: the specs exec `sh -c` with curl, nc, dig, getent, seq,
# wget, ss in their pods, so each image is a Debian bookworm subset (the cached
# node rootfs, hack/kind/rootfs.sh, plus Debian's packages installed into a
# copy of it) rather than a bare static binary.
#
#   agnhost          tools root + the static agnhost (hack/kube-binaries.sh
#                    agnhost): ENTRYPOINT /agnhost, CMD pause (as upstream)
#   jessie-dnsutils  tools root (dig, getent, nc, curl), CMD /bin/sh
#   nginx            Debian's nginx-light on port 80, CMD nginx in the foreground
#   busybox          Debian's busybox-static and its applets, CMD sh
#
# tools root: bash, coreutils, grep, sed, mawk, findutils, libc-bin (getent),
# hostname, procps, iproute2 (ip, ss), iputils-ping, netcat-openbsd, curl,
# wget, bind9-dnsutils (dig, nslookup), ca-certificates.
#
# Usage: hack/kind/e2e-images.sh NAME...   e.g.
#   registry.k8s.io/e2e-test-images/agnhost:2.59
# Prints each image's OCI tarball, in order. Images are cached by a hash of
# their inputs (rootfs, package lists, agnhost binary, this script, the image
# tool) as ${MIZAR_CACHE:-~/.cache/mizar}/e2e-images/<image>-<tag>-<hash>.tar;
# the package roots under e2e-roots-<hash>/. Needs root (chroot apt-get). Cold: a few
# minutes (apt downloads); warm: nothing.
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${MIZAR_CACHE:-$HOME/.cache/mizar}
export GOWORK=off CGO_ENABLED=0

log() { echo "e2e-images: $*" >&2; }
(($#)) || { log "usage: $0 IMAGE-NAME... (as e2e.test --list-images prints them)"; exit 2; }

tools_pkgs=(bash dash coreutils grep sed mawk findutils libc-bin hostname procps iproute2 iputils-ping
  netcat-openbsd curl wget bind9-dnsutils ca-certificates)
nginx_pkgs=(nginx-light dash bash coreutils)
# What apt-get adds to the node rootfs (the rest of tools_pkgs is already there).
apt_pkgs=(netcat-openbsd curl wget bind9-dnsutils nginx-light)

rootfs_tar=$("$ROOT/hack/kind/rootfs.sh")
self=$(sha256sum "$0" "$ROOT/hack/kind/debian-subset.sh" | sha256sum | cut -c1-12)
rkey=$( { echo "$rootfs_tar $self"; printf '%s\n' "${tools_pkgs[@]}" -- "${nginx_pkgs[@]}" -- "${apt_pkgs[@]}"; } | sha256sum | cut -c1-12)
roots=$CACHE/e2e-roots-$rkey

# roots: tools.tar, nginx.tar, busybox.tar, each a root filesystem tarball.
build_roots() {
  [[ -s $roots/tools.tar && -s $roots/nginx.tar && -s $roots/busybox.tar ]] && return 0
  ((EUID == 0)) || { log "needs root (chroot apt-get)"; exit 1; }
  local tmp R
  mkdir -p "$roots"
  tmp=$(mktemp -d "$roots/build.XXXXXX")
  R=$tmp/rootfs
  # shellcheck disable=SC2064 # expand now: the paths of this build
  trap "umount '$R/proc' 2>/dev/null || true; umount '$R/dev' 2>/dev/null || true; rm -rf '$tmp'" EXIT
  log "Debian packages for the test images into a copy of $rootfs_tar (cold: a few minutes)"
  mkdir -p "$R"
  tar -C "$R" -xf "$rootfs_tar"
  mount -t proc proc "$R/proc"
  mount --bind /dev "$R/dev"
  cp /etc/resolv.conf "$R/etc/resolv.conf"
  # Nothing is started in the chroot (nginx's postinst would start the server).
  printf '#!/bin/sh\nexit 101\n' >"$R/usr/sbin/policy-rc.d"
  chmod +x "$R/usr/sbin/policy-rc.d"
  if ! chroot "$R" sh -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ${apt_pkgs[*]}" >"$tmp/apt.log" 2>&1; then
    tail -20 "$tmp/apt.log" >&2
    log "apt-get in the chroot failed"
    exit 1
  fi
  umount "$R/proc" "$R/dev"

  # What no package lists but a container needs: users, name service order,
  # a writable /tmp, the DNS specs' /results mount point.
  extras() {
    local out=$1
    shift
    mkdir -p "$tmp/extra/tmp" "$tmp/extra/results" "$tmp/extra/etc" "$tmp/extra/run"
    chmod 1777 "$tmp/extra/tmp"
    cp "$R/etc/passwd" "$R/etc/group" "$R/etc/nsswitch.conf" "$tmp/extra/etc/"
    tar -C "$tmp/extra" --numeric-owner -rf "$out" ./tmp ./results ./run ./etc/passwd ./etc/group ./etc/nsswitch.conf "$@"
  }
  "$ROOT/hack/kind/debian-subset.sh" "$R" "$tmp/tools.tar" "${tools_pkgs[@]}"
  extras "$tmp/tools.tar"
  "$ROOT/hack/kind/debian-subset.sh" "$R" "$tmp/nginx.tar" "${nginx_pkgs[@]}"
  # Debian's default site also listens on [::]:80, which fails in a pod
  # without IPv6; this one serves the default page on port 80 alone.
  mkdir -p "$tmp/extra/etc/nginx" "$tmp/extra/var/lib/nginx" "$tmp/extra/var/log/nginx" "$tmp/extra/usr/share/nginx/e2e"
  cat >"$tmp/extra/etc/nginx/e2e.conf" <<'CONF'
user www-data www-data;
worker_processes 1;
pid /run/nginx.pid;
error_log stderr;
events { worker_connections 256; }
http {
  access_log off;
  server {
    listen 80 default_server;
    root /usr/share/nginx/e2e;
  }
}
CONF
  echo "nginx" >"$tmp/extra/usr/share/nginx/e2e/index.html"
  extras "$tmp/nginx.tar" ./etc/nginx/e2e.conf ./var/lib/nginx ./var/log/nginx ./usr/share/nginx/e2e

  # busybox: the static binary and a link per applet, as hack/kind/test-image.sh.
  mkdir -p "$tmp/bb/bin" "$tmp/bb/etc" "$tmp/bb/tmp"
  chmod 1777 "$tmp/bb/tmp"
  cp "$R/usr/bin/busybox" "$tmp/bb/bin/busybox"
  for applet in $("$tmp/bb/bin/busybox" --list); do
    [[ $applet == busybox ]] || ln -s busybox "$tmp/bb/bin/$applet"
  done
  echo "root:x:0:0:root:/root:/bin/sh" >"$tmp/bb/etc/passwd"
  echo "root:x:0:" >"$tmp/bb/etc/group"
  tar -C "$tmp/bb" --numeric-owner -cf "$tmp/busybox.tar" .

  mv "$tmp/tools.tar" "$tmp/nginx.tar" "$tmp/busybox.tar" "$roots/"
  rm -rf "$tmp"
  trap - EXIT
  log "package roots in $roots: $(du -h "$roots"/*.tar | awk '{printf "%s %s  ", $2, $1}')"
}

agnhost= porter=
for name in "$@"; do
  [[ $name == */agnhost:* ]] || continue
  agnhost=$("$ROOT/hack/kube-binaries.sh" agnhost)
  # The test certificate upstream's image carries in / (porter's TLS
  # ports, served by "agnhost porter" in the Proxy specs), from the same
  # module as the binary.
  porter=$(cd "$ROOT/hack/tools/kube" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images/agnhost/porter
  [[ -s $porter/localhost.crt && -s $porter/localhost.key ]] || { log "no localhost.crt/key in $porter"; exit 1; }
done
toolkey=$(sha256sum "$ROOT/hack/tools/image/main.go" | cut -c1-12)
tool=$CACHE/e2e-images/image-$toolkey

PATHENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
for name in "$@"; do
  repo=${name%:*}
  # Each image's key: the roots', the image tool's, and agnhost's for agnhost.
  ikey=$( { echo "$rkey $toolkey $name"; [[ $name != */agnhost:* ]] || sha256sum "$agnhost" "$porter"/localhost.*; } | sha256sum | cut -c1-12)
  out=$CACHE/e2e-images/${repo##*/}-${name##*:}-$ikey.tar
  if [[ ! -s $out ]]; then
    build_roots
    if [[ ! -x $tool ]]; then
      mkdir -p "$CACHE/e2e-images"
      (cd "$ROOT/hack/tools/image" && go build -trimpath -o "$tool.tmp" . && mv "$tool.tmp" "$tool")
    fi
    # Root, as upstream's images: the specs bind low ports and ping.
    case ${repo##*/} in
    agnhost)
      args=(--base "$roots/tools.tar" --binary "$agnhost" --path /agnhost --cmd pause
        --extra "$porter/localhost.crt=/localhost.crt,$porter/localhost.key=/localhost.key") ;;
    jessie-dnsutils)
      args=(--base "$roots/tools.tar" --cmd /bin/sh) ;;
    nginx)
      args=(--base "$roots/nginx.tar" --entrypoint /usr/sbin/nginx --cmd "-c,/etc/nginx/e2e.conf,-g,daemon off;") ;;
    busybox)
      args=(--base "$roots/busybox.tar" --cmd sh) ;;
    *)
      log "no recipe for $name (known: agnhost, jessie-dnsutils, nginx, busybox)"
      exit 2 ;;
    esac
    "$tool" "${args[@]}" --name "$name" --user 0:0 --env "$PATHENV" --out "$out.tmp"
    mv "$out.tmp" "$out"
    log "built $name ($(du -h "$out" | cut -f1))"
  fi
  echo "$out"
done
