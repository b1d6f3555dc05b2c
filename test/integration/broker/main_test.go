// Package broker runs mizar-apiserver in-process and exercises the
// broker.mizar.dev API through the generated clientset.
package broker

import (
	"context"
	"fmt"
	"os"
	"strings"
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

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestFulfillmentFlagsAreCheckedBeforeStart(t *testing.T) {
	dir := t.TempDir()
	missing := dir + "/no-such-kubeconfig"
	s, err := apiservertest.New(dir, "--broker-fulfillment", "--broker-workload-kubeconfig", missing)
	if err == nil {
		_ = s.Stop()
		t.Fatal("the server started with an unreadable workload kubeconfig")
	}
	if !strings.Contains(err.Error(), "--broker-workload-kubeconfig "+missing) {
		t.Errorf("error %q does not name the flag and file", err)
	}
	if _, err := apiservertest.New(t.TempDir(), "--broker-workers", "0"); err == nil || !strings.Contains(err.Error(), "--broker-workers must be at least 1") {
		t.Errorf("--broker-workers 0: %v", err)
	}
	if _, err := apiservertest.New(t.TempDir(), "--broker-client-qps", "0"); err == nil || !strings.Contains(err.Error(), "--broker-client-qps and --broker-client-burst must be positive") {
		t.Errorf("--broker-client-qps 0: %v", err)
	}
}
