#!/usr/bin/env bash
# debian-subset.sh ROOTFS OUT.tar PACKAGE...: writes a tarball of the files the
# named Debian packages installed in ROOTFS, with every package they depend on
# (recursively) and the /etc/alternatives links they use: a small root
# filesystem for an image that needs Debian's userland tools (kube-proxy's
# iptables-nft and conntrack) without carrying a whole Debian.
set -o errexit -o nounset -o pipefail
R=$(cd "$1" && pwd -P) OUT=$2
shift 2

# Installed packages, and which installed package provides each virtual one
# (a dependency on "awk" is one on mawk here).
declare -A installed=() provider=()
while read -r status pkg provides; do
  [[ $status == installed ]] || continue
  installed[$pkg]=1
  for v in ${provides//,/ }; do
    [[ $v == \(* || $v == *\) || $v == '=' ]] && continue
    provider[$v]=$pkg
  done
done < <(dpkg-query --admindir="$R/var/lib/dpkg" -W -f '${db:Status-Status} ${Package} ${Provides}\n')
for p in "$@"; do
  [[ -n ${installed[${p%%:*}]:-} ]] || { echo "debian-subset: $p is not installed in $R" >&2; exit 1; }
done

declare -A seen=()
queue=("$@")
while ((${#queue[@]})); do
  p=${queue[0]} queue=("${queue[@]:1}")
  p=${p%%:*}
  [[ -n ${installed[$p]:-} ]] || p=${provider[$p]:-}
  [[ -n $p && -z ${seen[$p]:-} ]] || continue
  seen[$p]=1
  # "a (>= 1) | b, c" -> a c: the first alternative, which is what is installed
  # here; a dependency neither installed nor provided is left out.
  deps=$(dpkg-query --admindir="$R/var/lib/dpkg" -W -f '${Pre-Depends}, ${Depends}' "$p" 2>/dev/null |
    tr ',' '\n' | sed -e 's/|.*//' -e 's/(.*)//' -e 's/ //g' | grep -v '^$' || true)
  for d in $deps; do
    d=${d%%:*}
    [[ -n ${installed[$d]:-} || -n ${provider[$d]:-} ]] && queue+=("$d")
  done
done

list=$(mktemp)
trap 'rm -f "$list"' EXIT
declare -A real=()
for p in "${!seen[@]}"; do
  dpkg-query --admindir="$R/var/lib/dpkg" -L "$p" 2>/dev/null
done | sort -u | while read -r f; do
  # Files and links only (tar adds the directories they sit in); no docs.
  case $f in /usr/share/doc/* | /usr/share/man/* | /usr/share/locale/* | /usr/share/lintian/*) continue ;; esac
  [[ -L $R$f || -f $R$f ]] || continue
  # Merged /usr: /lib is a link to usr/lib; name each file by its real
  # directory so the layer's links (bin, lib, lib64, sbin) stay links.
  dir=${f%/*}
  dir=${dir:-/}
  [[ -n ${real[$dir]:-} ]] || real[$dir]=$(cd "$R$dir" && pwd -P)
  d=${real[$dir]#"$R"}
  echo "${d#/}${d:+/}${f##*/}"
done | sort -u >"$list"
# update-alternatives' links (iptables -> /etc/alternatives/iptables -> iptables-nft).
(cd "$R" && find etc/alternatives usr/sbin usr/bin -maxdepth 1 -type l -lname '/etc/alternatives/*' 2>/dev/null) >>"$list"
(cd "$R" && find etc/alternatives -maxdepth 1 -type l 2>/dev/null) >>"$list"
(cd "$R" && for l in bin lib lib64 sbin; do [[ -L $l ]] && echo "$l"; done) | cat - "$list" | awk '!seen[$0]++' >"$list.top"
mv "$list.top" "$list"
tar -C "$R" --numeric-owner -cf "$OUT" -T "$list"
echo "debian-subset: $(wc -l <"$list") files from ${#seen[@]} packages, $(du -h "$OUT" | cut -f1)" >&2
