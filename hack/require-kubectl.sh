#!/usr/bin/env bash
# Fails at once, saying how to get one, unless kubectl >= 1.30 is on PATH
# ($KUBECTL names another binary). 'make up' and the e2e tests drive it.
set -o errexit -o nounset -o pipefail
KUBECTL=${KUBECTL:-kubectl}
min_minor=30
how="Run 'make deps' (hack/kube-binaries.sh builds a pinned kubectl from the Go module proxy into
\${MIZAR_CACHE:-~/.cache/mizar}), or install kubectl >= 1.$min_minor yourself
(https://kubernetes.io/docs/tasks/tools/), or set KUBECTL to one."
if ! command -v "$KUBECTL" >/dev/null 2>&1; then
  echo "mizar: '$KUBECTL' is not on PATH; 'make up' and the e2e tests need it." >&2
  echo "$how" >&2
  exit 1
fi
# "Client Version: v1.32.4..." on every kubectl since 1.28.
version=$("$KUBECTL" version --client 2>/dev/null | sed -n 's/^Client Version: v\{0,1\}\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
read -r major minor <<<"${version:-0 0}"
if ((major < 1 || (major == 1 && minor < min_minor))); then
  echo "mizar: $KUBECTL is version ${major}.${minor}; 'make up' and the e2e tests need 1.$min_minor or newer." >&2
  echo "$how" >&2
  exit 1
fi
