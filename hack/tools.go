//go:build tools

// Package tools pins the code generators' module in go.mod, so
// hack/update-codegen.sh runs the same version everywhere.
package tools

import _ "k8s.io/code-generator"
