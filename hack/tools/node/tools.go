//go:build tools

// Package tools pins what the kind node image and its images carry besides
// Kubernetes' own commands: crictl, CoreDNS and the reference CNI plugins
// (loopback, portmap, and bridge/ptp + host-local for the baseline network).
// hack/kube-binaries.sh builds them.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/main/ptp"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
	_ "github.com/coredns/coredns"
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
