// Package e2e runs the real mizar-apiserver binary as a subprocess and drives it
// with the real kubectl, asserting what a person or a script sees: printed
// columns, explain text, server-side apply, categories and short names, wait,
// validation errors, field selectors, restarts, and how the aggregated mode fails
// without a kube-apiserver.
//
// The binary is $MIZAR_APISERVER when set (the Makefile points it at
// _output/bin/mizar-apiserver), otherwise it is built once into a temporary
// directory. kubectl is $KUBECTL or the one on PATH; it is required.
//
//	go test ./test/e2e -count=1
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

var (
	// apiserverBin and kubectlBin are absolute paths of the binaries under test.
	apiserverBin string
	kubectlBin   string
	// kubectlCache keeps kubectl's discovery cache out of $HOME and away from
	// other runs that may have used the same port.
	kubectlCache string
	// srv is the server every test shares; TestRestartKeepsObjects replaces it.
	srv *server
	// sharedDataDir is srv's data directory, kept across restarts.
	sharedDataDir string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// A short root: the embedded etcd's unix socket path must fit in 107 bytes.
	root, err := os.MkdirTemp("", "mizar-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(root)

	if kubectlBin, err = findKubectl(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if apiserverBin, err = findOrBuildAPIServer(root); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	kubectlCache = filepath.Join(root, "kubectl-cache")
	sharedDataDir = filepath.Join(root, "shared")

	srv, err = startServer(sharedDataDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: starting the shared mizar-apiserver:", err)
		return 1
	}
	code := m.Run()
	if err := srv.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: stopping the shared mizar-apiserver: %v\n%s", err, srv.output())
		if code == 0 {
			code = 1
		}
	}
	return code
}

func findKubectl() (string, error) {
	name := os.Getenv("KUBECTL")
	if name == "" {
		name = "kubectl"
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("these tests drive the real kubectl and cannot run without it (set $KUBECTL or put kubectl on PATH): %w", err)
	}
	return filepath.Abs(path)
}

// findOrBuildAPIServer returns $MIZAR_APISERVER, or builds the command into dir.
func findOrBuildAPIServer(dir string) (string, error) {
	if p := os.Getenv("MIZAR_APISERVER"); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", fmt.Errorf("MIZAR_APISERVER=%s: %w", p, err)
		}
		if _, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("MIZAR_APISERVER=%s: %w", p, err)
		}
		return abs, nil
	}
	out := filepath.Join(dir, "mizar-apiserver")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// go test puts its own toolchain first on PATH, so this builds with the same Go.
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "mizar.dev/cmd/apiserver")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building mizar-apiserver (set $MIZAR_APISERVER to use a prebuilt one): %w\n%s", err, b)
	}
	return out, nil
}

// begin makes a failing test log what the shared server printed while it ran.
func begin(t *testing.T) {
	t.Helper()
	s := srv
	from := s.log.Len()
	t.Cleanup(func() {
		if t.Failed() {
			// srv may have been replaced by a restart; report both.
			if out := s.log.From(from); out != "" {
				t.Logf("mizar-apiserver output during the test:\n%s", out)
			} else {
				t.Logf("mizar-apiserver printed nothing during the test")
			}
			if srv != s {
				t.Logf("restarted mizar-apiserver output:\n%s", srv.output())
			}
		}
	})
}
