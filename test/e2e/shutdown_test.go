package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// TestShutdownWithOpenWatches: SIGTERM with ten `kubectl get -w` open stops the
// server within seconds, and every kubectl prints why its watch ended.
func TestShutdownWithOpenWatches(t *testing.T) {
	const (
		watches = 10
		limit   = 5 * time.Second
	)
	// A server of its own: stopping the shared one would disturb other tests.
	dir, err := os.MkdirTemp("", "mizar-e2e-stop-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s, err := startServer(filepath.Join(dir, "data"))
	if err != nil {
		t.Fatalf("starting mizar-apiserver: %v", err)
	}
	t.Cleanup(func() { _ = s.stop() })

	vpc := unique("stop")
	manifest := fmt.Sprintf("apiVersion: networking.mizar.dev/v1alpha1\nkind: Vpc\nmetadata:\n  name: %s\nspec:\n  cidr: 10.61.0.0/16\n", vpc)
	ctx, cancel := context.WithTimeout(context.Background(), kubectlTimeout)
	defer cancel()
	if r := runKubectl(ctx, s.kubeconfig, []byte(manifest), "apply", "-f", "-"); r.err != nil {
		t.Fatalf("creating VPC %s: %s", vpc, r)
	}

	ws := make([]*background, watches)
	for i := range ws {
		ws[i] = startKubectlOn(t, s.kubeconfig, "get", "vpc", vpc, "-w")
	}
	// Each watch is open once kubectl has printed the VPC from its first list.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		for _, w := range ws {
			select {
			case <-w.exited:
				return false, fmt.Errorf("kubectl exited before the shutdown: %s", w)
			default:
			}
			if !w.stdout.Contains(vpc) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("waiting for %d watches: %v", watches, err)
	}
	// Let kubectl turn from its initial list to the watch itself.
	time.Sleep(time.Second)

	start := time.Now()
	if err := s.stop(); err != nil {
		t.Fatalf("stopping with %d watches open: %v\n%s", watches, err, s.output())
	}
	if took := time.Since(start); took > limit {
		t.Errorf("SIGTERM with %d watches open took %v to exit, want under %v", watches, took.Round(time.Millisecond), limit)
	} else {
		t.Logf("SIGTERM with %d watches open: exited after %v", watches, took.Round(time.Millisecond))
	}
	for i, w := range ws {
		select {
		case <-w.exited:
		case <-time.After(limit):
			t.Fatalf("kubectl watch %d still running %v after the server exited: %s", i, limit, w)
		}
		if out := w.stdout.From(0) + w.stderr.From(0); !strings.Contains(out, "mizar-apiserver is shutting down") {
			t.Errorf("kubectl watch %d does not say why it ended: %s", i, w)
		}
	}
}
