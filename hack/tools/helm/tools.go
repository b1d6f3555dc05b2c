//go:build tools

// Package tools pins helm's command for hack/kube-binaries.sh.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
