//go:build tools

// Package tools pins kind, which hack/kind/up.sh runs (stock, unmodified) to
// bring up the e2e cluster; hack/kube-binaries.sh builds it.
package tools

import _ "sigs.k8s.io/kind"
