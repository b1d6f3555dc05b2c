# shellcheck shell=bash
# Sourced by hack/kind/*.sh: podman with its own configuration and storage, so
# the node images it holds stay cached by version under ${MIZAR_CACHE} and the
# machine's own podman setup (if any) is left alone.
#
# Why podman (not Docker) for kind here: podman is daemonless (nothing to start
# or stop), and Debian's podman 4.3 runs kind's --privileged nodes once the
# rlimits it asks for are ones this machine grants. Debian's Docker 20.10 asks
# for every capability on --privileged, including the CAP_SYS_RESOURCE this
# sandbox lacks, and needs a shim in front of kind (../shared/notes/kind.md).
MIZAR_CACHE=${MIZAR_CACHE:-$HOME/.cache/mizar}
PODMAN_DIR=$MIZAR_CACHE/podman
mkdir -p "$PODMAN_DIR"
# Limits this machine can grant (hard nofile is 20000 here; podman's default
# of 1048576 fails with "error setting rlimit type 7"); cgroupfs and file
# events because the host may run no systemd. nproc is counted over every
# uid-0 task of the machine (threads too); 32768 leaves room for three nodes'
# control planes and pods beside a busy host (runc here refuses 65536 and
# above with EPERM), and never more than the host's own hard limit.
nofile=$(ulimit -Hn) nproc=$(ulimit -Hu)
[[ $nofile == unlimited || $nofile -gt 1048576 ]] && nofile=1048576
[[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
cat >"$PODMAN_DIR/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
# runc: Debian's crun 1.8 refuses this host's cgroup layout ("cgroups in
# hybrid mode not supported").
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
[network]
network_backend = "netavark"
CONF
cat >"$PODMAN_DIR/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$PODMAN_DIR/storage"
runroot = "/run/mizar-podman"
CONF
export CONTAINERS_CONF=$PODMAN_DIR/containers.conf CONTAINERS_STORAGE_CONF=$PODMAN_DIR/storage.conf
export KIND_EXPERIMENTAL_PROVIDER=podman
