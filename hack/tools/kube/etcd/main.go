// Command etcd is the etcd server at the version k8s.io/kubernetes v1.35 tests
// with (go.etcd.io/etcd/server/v3 in this module's go.mod). Debian bookworm's
// etcd-server (3.4) is too old for kube-apiserver's consistent reads from cache.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
