package workloadcluster

import (
	"context"
	"testing"

	"mizar.dev/test/ci"
	"mizar.dev/test/cluster"
)

// StartAPIServer runs etcd and kube-apiserver alone for test t, stops them
// when t ends (printing their logs if t failed), and returns the cluster.
// Without a cached kube-apiserver the test skips, or fails under CI=true.
func StartAPIServer(t testing.TB) *Cluster {
	t.Helper()
	bins, err := cluster.Binaries("kube-apiserver")
	if err != nil {
		ci.Unavailable(t, err.Error())
	}
	c, err := Start(context.Background(), Options{Dir: t.TempDir(), KubeAPIServer: bins["kube-apiserver"]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Logs(40))
		}
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	return c
}
