#!/usr/bin/env bash
# Fails when the committed generated code differs from what hack/update-codegen.sh
# produces. Regenerates into a copy of the tree, so the working tree is untouched.
set -o errexit -o nounset -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The tracked and new (not ignored) files: exactly what a commit would hold.
git ls-files -z --cached --others --exclude-standard |
  tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$tmp"
# Reuse the installed generators instead of rebuilding them in the copy.
mkdir -p "$ROOT/_output/tools" "$tmp/_output"
ln -s "$ROOT/_output/tools" "$tmp/_output/tools"
(cd "$tmp" && hack/update-codegen.sh >/dev/null)

if ! diff -ruN "$ROOT/pkg" "$tmp/pkg" >"$tmp/diff"; then
  echo "verify-codegen: generated code is stale; run 'make codegen' and commit the result:" >&2
  head -50 "$tmp/diff" >&2
  exit 1
fi
echo "verify-codegen: generated code is up to date"
