#!/usr/bin/env bash
# Regenerates deepcopy, defaults, conversions, protobuf, OpenAPI, clientset,
# listers, informers and apply configurations for every API group under pkg/apis.
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

# Protobuf (generated.proto, generated.pb.go and the protobuf struct tags in
# types.go) for every external version, as kubernetes/sample-apiserver has it:
# kube-controller-manager, the operators and the agents ask for protobuf.
# go-to-protobuf runs protoc on GOPATH-style paths (<output-dir>/<import path>),
# so a temporary tree links mizar.dev, apimachinery's .proto files and gogo.proto.
# Needs protoc (Debian protobuf-compiler, hack/install-deps.sh); the Go plugins are
# built from the pinned code-generator, goimports at the x/tools version it pins.
gen_protobuf() {
  command -v protoc >/dev/null || {
    echo "update-codegen: protoc not found; run hack/install-deps.sh (Debian protobuf-compiler)" >&2
    return 1
  }
  (cd "$CODEGEN_PKG" && go install k8s.io/code-generator/cmd/go-to-protobuf \
    k8s.io/code-generator/cmd/go-to-protobuf/protoc-gen-gogo)
  local tools_version
  tools_version=$(cd "$CODEGEN_PKG" && go list -m -f '{{.Version}}' golang.org/x/tools)
  (cd / && GOFLAGS= go install "golang.org/x/tools/cmd/goimports@$tools_version")

  local src gogo apis=() pkgs
  src=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$src'" RETURN
  gogo=$(go list -m -f '{{.Dir}}' github.com/gogo/protobuf)
  mkdir -p "$src/k8s.io" "$src/github.com/gogo"
  ln -s "$ROOT" "$src/$MODULE"
  ln -s "$(go list -m -f '{{.Dir}}' k8s.io/apimachinery)" "$src/k8s.io/apimachinery"
  ln -s "$gogo" "$src/github.com/gogo/protobuf"
  for d in "$ROOT"/pkg/apis/*/v[0-9]*/; do
    apis+=("$MODULE/${d#"$ROOT/"}")
  done
  pkgs=$(IFS=,; echo "${apis[*]%/}")
  # apimachinery's packages are read for their types, never written ("-").
  PATH="$GOBIN:$PATH" "$GOBIN/go-to-protobuf" \
    --go-header-file "$BOILERPLATE" \
    --output-dir "$src" \
    --proto-import "$src" \
    --proto-import "$gogo/protobuf" \
    --apimachinery-packages "-k8s.io/apimachinery/pkg/util/intstr,-k8s.io/apimachinery/pkg/api/resource,-k8s.io/apimachinery/pkg/runtime/schema,-k8s.io/apimachinery/pkg/runtime,-k8s.io/apimachinery/pkg/apis/meta/v1" \
    --packages "$pkgs"
}
gen_protobuf

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
  --prefers-protobuf \
  --applyconfig-openapi-schema <(go run "$MODULE/pkg/generated/openapi/cmd/models-schema") \
  --output-dir "$ROOT/pkg/generated" \
  --output-pkg "$MODULE/pkg/generated" \
  --boilerplate "$BOILERPLATE" \
  "$ROOT/pkg/apis"
