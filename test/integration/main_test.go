// Package integration runs mizar-apiserver in-process on an embedded etcd and
// exercises it through the generated clientset.
package integration

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// shared is one server for the tests that need no restart of their own; each test
// uses names of its own so they cannot see each other's objects.
var shared *apiservertest.Server

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "mizar-integration-")
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

func client() versioned.Interface { return shared.Client }

// testContext bounds every test so a hung watch fails instead of stalling CI.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var runs atomic.Int32

// runSuffix is appended to the names of the objects one run of a test creates:
// the shared server keeps them, and go test -count=N runs each test N times.
func runSuffix() string { return fmt.Sprintf("-r%d", runs.Add(1)) }
