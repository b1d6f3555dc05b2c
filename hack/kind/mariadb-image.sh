#!/usr/bin/env bash
# Builds the broker's database image without a registry: Debian bookworm's
# mariadb-server and mariadb-client, installed with apt-get into a copy of the
# cached node rootfs (hack/kind/rootfs.sh), cut down to those packages and
# what they depend on (hack/kind/debian-subset.sh), plus an entrypoint that
# speaks the environment the broker's StatefulSet gives its container
# (pkg/broker/fulfillment/workload.go), as the official mysql/mariadb images do:
#
#   MYSQL_ROOT_PASSWORD  root's password (root@localhost and root@'%'); required on first start
#   MYSQL_DATABASE       a database created on first start
#   MYSQL_USER           a user with every privilege on MYSQL_DATABASE
#   MYSQL_PASSWORD       its password
#   MYSQL_DATADIR        the data directory (default /var/lib/mysql, the volume's mount)
#
# The first start (an empty data directory) runs mariadb-install-db and the
# SQL above against a server listening on its socket only, then starts the
# real server on port 3306 as the mysql user. `mysql`, `mysqladmin` and `sh`
# are on PATH (the StatefulSet's probes run them).
#
# Prints the OCI tarball's path; the image is mizar.dev/mariadb:10.11.
# Cached as ${MIZAR_CACHE:-~/.cache/mizar}/mariadb-<hash>/mariadb.tar, keyed by
# the rootfs, this script, debian-subset.sh and the image tool. Needs root
# (chroot apt-get). Cold: a minute or two (apt downloads); warm: nothing.
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${MIZAR_CACHE:-$HOME/.cache/mizar}
export GOWORK=off CGO_ENABLED=0
IMAGE=mizar.dev/mariadb:10.11

log() { echo "mariadb-image: $*" >&2; }

pkgs=(mariadb-server mariadb-client dash bash coreutils grep sed mawk findutils procps hostname libc-bin)
rootfs_tar=$("$ROOT/hack/kind/rootfs.sh")
# Contents only (not paths): every checkout of the same tree shares the cache.
key=$( { echo "$rootfs_tar"; printf '%s\n' "${pkgs[@]}"; cat "$0" "$ROOT/hack/kind/debian-subset.sh" "$ROOT/hack/tools/image/main.go"; } | sha256sum | cut -c1-12)
out=$CACHE/mariadb-$key/mariadb.tar
if [[ -s $out ]]; then
  echo "$out"
  exit 0
fi
((EUID == 0)) || { log "needs root (chroot apt-get)"; exit 1; }
mkdir -p "$CACHE"
tmp=$(mktemp -d "$CACHE/mariadb-build.XXXXXX")
R=$tmp/rootfs
# shellcheck disable=SC2064 # expand now: the paths of this build
trap "umount '$R/proc' 2>/dev/null || true; umount '$R/dev' 2>/dev/null || true; rm -rf '$tmp'" EXIT
log "Debian's mariadb-server into a copy of $rootfs_tar (cold: a minute or two)"
mkdir -p "$R"
tar -C "$R" -xf "$rootfs_tar"
mount -t proc proc "$R/proc"
mount --bind /dev "$R/dev"
cp /etc/resolv.conf "$R/etc/resolv.conf"
# Nothing is started in the chroot (the package's postinst would start a server).
printf '#!/bin/sh\nexit 101\n' >"$R/usr/sbin/policy-rc.d"
chmod +x "$R/usr/sbin/policy-rc.d"
if ! chroot "$R" sh -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mariadb-server mariadb-client" >"$tmp/apt.log" 2>&1; then
  tail -20 "$tmp/apt.log" >&2
  log "apt-get in the chroot failed"
  exit 1
fi
umount "$R/proc" "$R/dev"
version=$(chroot "$R" dpkg-query -W -f '${Version}' mariadb-server)
case $version in
*:10.11.*) ;;
*) log "mariadb-server is $version, not 10.11: update IMAGE ($IMAGE) and the tests that name it"; exit 1 ;;
esac

"$ROOT/hack/kind/debian-subset.sh" "$R" "$tmp/base.tar" "${pkgs[@]}"

# What no package lists but the server needs: its user, a writable /tmp and
# /run/mysqld, the data directory, a configuration and the entrypoint.
x=$tmp/extra
mkdir -p "$x/etc/mysql/mariadb.conf.d" "$x/tmp" "$x/run/mysqld" "$x/var/lib/mysql" "$x/usr/local/bin"
chmod 1777 "$x/tmp"
cp "$R/etc/passwd" "$R/etc/group" "$R/etc/nsswitch.conf" "$x/etc/"
uid=$(awk -F: '$1 == "mysql" {print $3}' "$R/etc/passwd")
gid=$(awk -F: '$1 == "mysql" {print $4}' "$R/etc/passwd")
[[ -n $uid && -n $gid ]] || { log "the package made no mysql user"; exit 1; }
chown "$uid:$gid" "$x/run/mysqld" "$x/var/lib/mysql"
# Read last (the package's my.cnf includes mariadb.conf.d/*.cnf in order):
# what a container needs over the package's 50-server.cnf (every address, not
# 127.0.0.1; no host name lookups).
cat >"$x/etc/mysql/mariadb.conf.d/99-mizar.cnf" <<'CNF'
[client-server]
socket = /run/mysqld/mysqld.sock

[mariadbd]
user = mysql
datadir = /var/lib/mysql
bind-address = 0.0.0.0
port = 3306
skip-name-resolve
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
CNF
cat >"$x/usr/local/bin/mariadb-entrypoint" <<'SH'
#!/bin/sh
# The broker's MariaDB: initializes an empty data directory from the
# MYSQL_* environment, then runs the server in the foreground.
set -eu
DATADIR=${MYSQL_DATADIR:-/var/lib/mysql}
SOCKET=/run/mysqld/mysqld.sock
mkdir -p /run/mysqld "$DATADIR"
chown mysql:mysql /run/mysqld "$DATADIR"
# A string as an SQL literal: quotes and backslashes doubled.
lit() { printf "'%s'" "$(printf '%s' "$1" | sed -e "s/\\\\/\\\\\\\\/g" -e "s/'/''/g")"; }
if [ ! -d "$DATADIR/mysql" ]; then
  if [ -z "${MYSQL_ROOT_PASSWORD:-}" ]; then
    echo "mariadb-entrypoint: the data directory $DATADIR is empty and MYSQL_ROOT_PASSWORD is not set" >&2
    exit 1
  fi
  echo "mariadb-entrypoint: initializing $DATADIR" >&2
  # Into a fresh directory beside it first: a pod killed half way through
  # leaves no half-made "mysql" schema that would skip this next time.
  rm -rf "$DATADIR/.init"
  mkdir -p "$DATADIR/.init"
  chown mysql:mysql "$DATADIR/.init"
  mariadb-install-db --user=mysql --datadir="$DATADIR/.init" --skip-test-db --auth-root-authentication-method=socket >/dev/null
  mariadbd --user=mysql --datadir="$DATADIR/.init" --skip-networking --socket="$SOCKET.init" &
  pid=$!
  i=0
  until mariadb-admin --socket="$SOCKET.init" -uroot ping >/dev/null 2>&1; do
    i=$((i + 1))
    if [ $i -gt 120 ] || ! kill -0 $pid 2>/dev/null; then
      echo "mariadb-entrypoint: the initializing server did not start" >&2
      exit 1
    fi
    sleep 0.5
  done
  pw=$(lit "$MYSQL_ROOT_PASSWORD")
  {
    echo "SET @@SESSION.SQL_LOG_BIN=0;"
    echo "DELETE FROM mysql.global_priv WHERE User='' OR (User='root' AND Host NOT IN ('localhost'));"
    echo "ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD($pw);"
    echo "CREATE USER 'root'@'%' IDENTIFIED BY $pw;"
    echo "GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION;"
    if [ -n "${MYSQL_DATABASE:-}" ]; then
      db=$(printf '%s' "$MYSQL_DATABASE" | sed 's/`/``/g')
      echo "CREATE DATABASE IF NOT EXISTS \`$db\`;"
    fi
    if [ -n "${MYSQL_USER:-}" ] && [ "$MYSQL_USER" != root ]; then
      echo "CREATE USER $(lit "$MYSQL_USER")@'%' IDENTIFIED BY $(lit "${MYSQL_PASSWORD:-}");"
      if [ -n "${MYSQL_DATABASE:-}" ]; then
        echo "GRANT ALL PRIVILEGES ON \`$db\`.* TO $(lit "$MYSQL_USER")@'%';"
      fi
    fi
    echo "FLUSH PRIVILEGES;"
  } | mariadb --socket="$SOCKET.init" -uroot
  mariadb-admin --socket="$SOCKET.init" -uroot shutdown
  wait $pid || true
  for f in "$DATADIR/.init"/* "$DATADIR/.init"/.[!.]*; do
    [ -e "$f" ] && mv "$f" "$DATADIR/"
  done
  rmdir "$DATADIR/.init"
  echo "mariadb-entrypoint: $DATADIR initialized" >&2
fi
exec mariadbd --user=mysql --datadir="$DATADIR" "$@"
SH
chmod 755 "$x/usr/local/bin/mariadb-entrypoint"
tar -C "$x" --numeric-owner -rf "$tmp/base.tar" ./tmp ./run ./var/lib/mysql ./etc/passwd ./etc/group ./etc/nsswitch.conf ./etc/mysql/mariadb.conf.d/99-mizar.cnf ./usr/local/bin/mariadb-entrypoint

toolkey=$(sha256sum "$ROOT/hack/tools/image/main.go" | cut -c1-12)
tool=$CACHE/e2e-images/image-$toolkey
if [[ ! -x $tool ]]; then
  mkdir -p "$CACHE/e2e-images"
  (cd "$ROOT/hack/tools/image" && go build -trimpath -o "$tool.tmp" . && mv "$tool.tmp" "$tool")
fi
mkdir -p "$(dirname "$out")"
# Root: the entrypoint hands the volume to the mysql user, and mariadbd
# drops to it (user = mysql).
"$tool" --base "$tmp/base.tar" --name "$IMAGE" --user 0:0 \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --entrypoint /usr/local/bin/mariadb-entrypoint --out "$out.tmp"
mv "$out.tmp" "$out"
log "built $IMAGE (mariadb-server $version, $(du -h "$out" | cut -f1))"
echo "$out"
