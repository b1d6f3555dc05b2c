package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAggregatedModeNeedsKubeAPIServer runs the default (aggregated) mode where
// there is no kube-apiserver to delegate authentication to: no
// --authentication-kubeconfig and not in a cluster. It must fail fast and say so.
func TestAggregatedModeNeedsKubeAPIServer(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// --secure-port 0 keeps the run from binding the default 8443, which another
	// process may hold; the delegation failure comes first either way.
	cmd := exec.CommandContext(ctx, apiserverBin, "--data-dir", filepath.Join(dir, "data"), "--secure-port", "0", "--embedded-etcd-unsafe-no-fsync")
	// In-cluster configuration comes from these; a CI job in a pod would have them.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KUBERNETES_SERVICE_HOST=") && !strings.HasPrefix(kv, "KUBERNETES_SERVICE_PORT=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	elapsed := time.Since(start)

	if ctx.Err() != nil {
		t.Fatalf("mizar-apiserver without a kube-apiserver was still running after %v:\n%s", elapsed, out.String())
	}
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() <= 0 {
		t.Fatalf("mizar-apiserver without a kube-apiserver: got %v, want a non-zero exit status:\n%s", err, out.String())
	}
	if elapsed > 10*time.Second {
		t.Errorf("mizar-apiserver took %v to give up; it should fail at once", elapsed)
	}
	// The message must say what is missing, where it was looked for, and the way out.
	for _, want := range []string{"--authentication-kubeconfig", "--authorization-kubeconfig", "--kubeconfig", "KUBERNETES_SERVICE_HOST", "--standalone"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("mizar-apiserver's error does not mention %q:\n%s", want, out.String())
		}
	}
	// The mode is checked before anything starts: no embedded etcd, no kubeconfig.
	if _, err := os.Stat(filepath.Join(dir, "data")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused start left its data directory behind (stat: %v)", err)
	}
	t.Logf("exit status %d after %v; last line: %s", exitErr.ExitCode(), elapsed.Round(time.Millisecond), lastLine(out.String()))
}

func lastLine(s string) string {
	ls := lines(s)
	if len(ls) == 0 {
		return ""
	}
	return ls[len(ls)-1]
}
