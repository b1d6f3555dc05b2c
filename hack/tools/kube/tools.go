//go:build tools

// Package tools pins the Kubernetes commands hack/kube-binaries.sh builds, so
// `go mod tidy` keeps their dependencies in go.sum. kubelet, kubeadm and
// kube-proxy go into the kind node image (hack/kind/node-image.sh), agnhost into
// the e2e test image.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
