// Package storage tests mizar-apiserver against its storage: data kept across a
// restart, and an external etcd that demands a TLS client identity. It runs in a
// process of its own: k8s.io/apiserver keeps some state per process (the etcd
// size metrics follow the last server started), and these tests start and stop
// several servers.
package storage

import (
	"context"
	"testing"
	"time"
)

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}
