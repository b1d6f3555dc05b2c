//go:build tools

// Package tools pins kubectl v1.33, the oldest kubectl the e2e suite checks
// against the v1.35 kube-apiserver (kubectl's supported skew is one minor
// either way, and mizar's README promises kubectl >= 1.30).
package tools

import _ "k8s.io/kubernetes/cmd/kubectl"
