#!/usr/bin/env bash
# Builds the Kubernetes-side binaries mizar's tests drive, from the Go module
# proxy only (no release downloads, no container engine), and caches them
# outside the clone, keyed by version, so a warm run builds nothing:
#
#   ${MIZAR_CACHE:-$HOME/.cache/mizar}/<tool>-<version>/bin/<name>
#
# Usage: hack/kube-binaries.sh [name...]
#   names: kubectl kube-apiserver kube-controller-manager kube-scheduler etcd
#          kubectl-1.33 kwok helm        (default: the first five)
#          kubelet kubeadm kube-proxy agnhost (the kind node image, hack/kind/)
#          kind crictl coredns loopback portmap bridge host-local ptp
#          e2e.test (Kubernetes' e2e suite, `go test -c` of test/e2e: make conformance)
# Prints the absolute path of each requested binary on stdout, one per line,
# in the order asked; progress goes to stderr.
#
# Versions come from the tools modules under hack/tools/ (their go.mod/go.sum
# are committed): kube/ pins k8s.io/kubernetes v1.35.x and the etcd server it is
# tested with, kubectl-1.33/ the old kubectl for the skew test, kwok/ and helm/
# their own commands. etcd is built from go.etcd.io/etcd/server/v3 (etcdmain)
# rather than taken from Debian, whose etcd-server 3.4 is too old for
# kube-apiserver 1.35's consistent reads from the watch cache.
set -o errexit -o nounset -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=$ROOT/hack/tools
CACHE=${MIZAR_CACHE:-$HOME/.cache/mizar}
export GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0

log() { echo "kube-binaries: $*" >&2; }

# modver DIR MODULE: the version DIR/go.mod requires of MODULE (no network).
modver() {
  local v
  v=$(awk -v m="$2" '$1 == m {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' "$1/go.mod")
  [[ -n $v ]] || { log "cannot find $2 in $1/go.mod"; exit 1; }
  echo "$v"
}

# spec NAME -> "moduledir package cachedir ldflags"
spec() {
  local kube133 kube etcd
  case $1 in
  kubectl | kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kubeadm | kube-proxy)
    # kubeadm derives the control-plane image tags from its own version: the ldflags are required.
    kube=$(modver "$TOOLS/kube" k8s.io/kubernetes)
    echo "$TOOLS/kube k8s.io/kubernetes/cmd/$1 $CACHE/kube-$kube $(kubeldflags "$kube")" ;;
  e2e.test)
    # The same version flags as kubectl: the suite logs and checks them.
    kube=$(modver "$TOOLS/kube" k8s.io/kubernetes)
    echo "$TOOLS/kube k8s.io/kubernetes/test/e2e $CACHE/kube-$kube $(kubeldflags "$kube")" ;;
  agnhost)
    kube=$(modver "$TOOLS/kube" k8s.io/kubernetes)
    echo "$TOOLS/kube k8s.io/kubernetes/test/images/agnhost $CACHE/kube-$kube -s" ;;
  kind)
    echo "$TOOLS/kind sigs.k8s.io/kind $CACHE/kind-$(modver "$TOOLS/kind" sigs.k8s.io/kind) -s" ;;
  crictl)
    echo "$TOOLS/node sigs.k8s.io/cri-tools/cmd/crictl $CACHE/crictl-$(modver "$TOOLS/node" sigs.k8s.io/cri-tools) -s" ;;
  coredns)
    echo "$TOOLS/node github.com/coredns/coredns $CACHE/coredns-$(modver "$TOOLS/node" github.com/coredns/coredns) -s" ;;
  loopback | portmap | bridge | host-local | ptp)
    local d=main
    case $1 in portmap) d=meta ;; host-local) d=ipam ;; esac
    echo "$TOOLS/node github.com/containernetworking/plugins/plugins/$d/$1 $CACHE/cni-plugins-$(modver "$TOOLS/node" github.com/containernetworking/plugins) -s" ;;
  etcd)
    etcd=$(modver "$TOOLS/kube" go.etcd.io/etcd/server/v3)
    echo "$TOOLS/kube ./etcd $CACHE/etcd-$etcd -s" ;;
  kubectl-1.33)
    kube133=$(modver "$TOOLS/kubectl-1.33" k8s.io/kubernetes)
    echo "$TOOLS/kubectl-1.33 k8s.io/kubernetes/cmd/kubectl $CACHE/kube-$kube133 $(kubeldflags "$kube133")" ;;
  kwok)
    echo "$TOOLS/kwok sigs.k8s.io/kwok/cmd/kwok $CACHE/kwok-$(modver "$TOOLS/kwok" sigs.k8s.io/kwok) -s" ;;
  helm)
    local h k minor f
    h=$(modver "$TOOLS/helm" helm.sh/helm/v3)
    # As helm's Makefile does: the Kubernetes version it assumes offline (helm
    # template, lint) is that of its client-go, not the library default 1.20.
    k=$(modver "$TOOLS/helm" k8s.io/client-go)
    minor=${k#v0.}; minor=${minor%%.*}
    f="-s,-X,helm.sh/helm/v3/internal/version.version=$h"
    for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
      f+=",-X,$pkg.k8sVersionMajor=1,-X,$pkg.k8sVersionMinor=$minor"
    done
    echo "$TOOLS/helm helm.sh/helm/v3/cmd/helm $CACHE/helm-$h $f" ;;
  *)
    log "unknown binary '$1' (known: kubectl kube-apiserver kube-controller-manager kube-scheduler etcd kubectl-1.33 kwok helm kubelet kubeadm kube-proxy agnhost kind crictl coredns loopback portmap bridge host-local ptp e2e.test)"
    exit 2 ;;
  esac
}

# kubeldflags VERSION: the -X flags Kubernetes' own build sets (hack/lib/version.sh),
# so `kubectl version` and /version report the real release, comma-joined for spec.
kubeldflags() {
  local v=$1 major minor f=-s
  major=${v#v}; major=${major%%.*}
  minor=${v#v*.}; minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=",-X,$pkg.gitVersion=$v,-X,$pkg.gitMajor=$major,-X,$pkg.gitMinor=$minor,-X,$pkg.gitTreeState=clean"
  done
  echo "$f"
}

names=("$@")
((${#names[@]})) || names=(kubectl kube-apiserver kube-controller-manager kube-scheduler etcd)

# Group the missing binaries by (module, cache dir, ldflags) so one `go build`
# compiles shared packages once (kube-apiserver and kube-controller-manager share most).
declare -A groups=()
paths=()
for n in "${names[@]}"; do
  read -r moddir pkg dir ldflags <<<"$(spec "$n")"
  bin=$dir/bin/${n%-1.33}
  paths+=("$bin")
  [[ -x $bin ]] && continue
  # A test binary is built alone, by `go test -c`; commands share one `go build`.
  mode=build
  [[ $n == *.test ]] && mode=test
  key="$mode $moddir $dir $ldflags"
  groups[$key]+=" $pkg"
done

for key in "${!groups[@]}"; do
  read -r mode moddir dir ldflags <<<"$key"
  read -r -a pkgs <<<"${groups[$key]}"
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/kube-binaries.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  suffix=
  [[ $mode == test ]] && suffix=.test
  log "building ${pkgs[*]##*/}$suffix into $dir/bin (cold: several minutes on 2 cores; cached afterwards)"
  start=$SECONDS
  # -v lists each compiled package: a count every 30 s shows progress without a flood.
  # CGO_ENABLED=0 and -trimpath as for the commands, so the packages they share
  # come from the build cache. -vet=off: go test would vet all of test/e2e's
  # packages first, minutes of work that checks nothing mizar owns.
  if [[ $mode == test ]]; then
    # go test -c has no package list (-v is the test's flag): -x's compile lines are counted instead.
    (cd "$moddir" && exec nice -n 10 go test -c -vet=off -x -trimpath -ldflags="${ldflags//,/ }" -o "$tmp/${pkgs[0]##*/}.test" "${pkgs[0]}") 2>"$tmp/log" &
  else
    (cd "$moddir" && exec nice -n 10 go build -v -trimpath -ldflags="${ldflags//,/ }" -o "$tmp/" "${pkgs[@]}") 2>"$tmp/log" &
  fi
  pid=$!
  last=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if ((SECONDS - last >= 30)); then
      last=$SECONDS
      if [[ $mode == test ]]; then
        n=$(grep -c '/compile -o' "$tmp/log" || true)
      else
        n=$(grep -cv '^#' "$tmp/log" || true)
      fi
      log "  ... $n packages compiled, $((SECONDS - start)) s"
    fi
  done
  if ! wait "$pid"; then
    grep -v '^\(mkdir\|cat\|cd\|EOF\|packagefile\|WORK=\|echo\|#\|/\)' "$tmp/log" | tail -30 >&2
    log "build of ${pkgs[*]} failed (log above)"
    exit 1
  fi
  mkdir -p "$dir/bin"
  for p in "${pkgs[@]}"; do
    b=${p##*/}
    [[ $mode == test ]] && b+=.test
    mv -f "$tmp/$b" "$dir/bin/$b"
  done
  rm -rf "$tmp"
  trap - EXIT
  log "built ${pkgs[*]##*/}$suffix in $((SECONDS - start)) s"
done

printf '%s\n' "${paths[@]}"
