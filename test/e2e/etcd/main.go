// Command etcd is the etcd server of mizar's go.mod, built by the e2e tests so
// they can run an etcd cluster as real processes and kill a member with SIGKILL.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
