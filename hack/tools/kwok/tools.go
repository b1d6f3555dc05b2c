//go:build tools

// Package tools pins kwok's command for hack/kube-binaries.sh.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
