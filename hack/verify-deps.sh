#!/usr/bin/env bash
# Fails when the Kubernetes modules drift apart: client, server and generators
# must come from one release (an unqualified `go get`/`go mod tidy` can pull a
# newer minor of one of them).
set -o errexit -o nounset -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

versions=$(go list -m -f '{{.Path}} {{.Version}}' all |
  awk '$1 ~ /^k8s\.io\/(api|apimachinery|apiserver|client-go|component-base|code-generator|kms)$/ {print $2}' | sort -u)
if [[ $(wc -l <<<"$versions") -ne 1 ]]; then
  echo "verify-deps: k8s.io modules are on different versions:" >&2
  go list -m -f '{{.Path}} {{.Version}}' all | grep -E '^k8s\.io/(api|apimachinery|apiserver|client-go|component-base|code-generator|kms) ' >&2
  exit 1
fi
echo "verify-deps: k8s.io modules all at $versions"
