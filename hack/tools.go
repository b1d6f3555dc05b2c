//go:build tools

// Package tools pins the code generators' module in go.mod, so
// hack/update-codegen.sh runs the same version everywhere, and cnitool's, so
// `make build` builds the cnitool `make up` and test/podnet drive the plugin with.
package tools

import (
	_ "github.com/containernetworking/cni/cnitool"
	_ "k8s.io/code-generator"
)
