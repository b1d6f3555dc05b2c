#!/usr/bin/env bash
# Regenerates deepcopy, defaults, conversions, OpenAPI, clientset, listers,
# informers and apply configurations for every API group under pkg/apis.
set -o errexit -o nounset -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
MODULE=mizar.dev
BOILERPLATE="$ROOT/hack/boilerplate.go.txt"
# Downloaded first: on a cold module cache `go list -m` knows no directory for it.
go mod download k8s.io/code-generator
CODEGEN_PKG=$(go list -m -f '{{.Dir}}' k8s.io/code-generator)
# The generators are installed from the pinned module into a project-local bin,
# so they never drift with whatever is on PATH.
export GOBIN="$ROOT/_output/tools/codegen-$(go list -m -f '{{.Version}}' k8s.io/code-generator)"
mkdir -p "$GOBIN"

# shellcheck source=/dev/null
source "$CODEGEN_PKG/kube_codegen.sh"

kube::codegen::gen_helpers --boilerplate "$BOILERPLATE" "$ROOT/pkg/apis"

# The report also lists apimachinery's own long-known violations; only ours fail.
report="$GOBIN/api-rule-violations.list"
kube::codegen::gen_openapi \
  --output-dir "$ROOT/pkg/generated/openapi" \
  --output-pkg "$MODULE/pkg/generated/openapi" \
  --report-filename "$report" \
  --update-report \
  --output-model-name-file zz_generated.model_name.go \
  --boilerplate "$BOILERPLATE" \
  "$ROOT/pkg/apis"
if grep -q "$MODULE/" "$report"; then
  echo "API rule violations in mizar's types (fix the types, do not list exceptions):" >&2
  grep "$MODULE/" "$report" >&2
  exit 1
fi

kube::codegen::gen_client \
  --with-watch \
  --with-applyconfig \
  --applyconfig-openapi-schema <(go run "$MODULE/pkg/generated/openapi/cmd/models-schema") \
  --output-dir "$ROOT/pkg/generated" \
  --output-pkg "$MODULE/pkg/generated" \
  --boilerplate "$BOILERPLATE" \
  "$ROOT/pkg/apis"
