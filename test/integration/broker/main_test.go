// Package broker runs mizar-apiserver in-process and exercises the
// broker.mizar.dev API through the generated clientset.
package broker

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"mizar.dev/pkg/apiserver/apiservertest"
)

var shared *apiservertest.Server

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "mizar-broker-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	shared, err = apiservertest.New(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := shared.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the shared server:", err)
		}
	}()
	return m.Run()
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}
