package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// RepoRoot is the repository's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "../..")
}

// Binaries asks hack/kube-binaries.sh for the named binaries (a no-op once
// cached) and returns their paths by name.
func Binaries(names ...string) (map[string]string, error) {
	cmd := exec.Command(filepath.Join(RepoRoot(), "hack/kube-binaries.sh"), names...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("hack/kube-binaries.sh %s: %w", strings.Join(names, " "), err)
	}
	paths := strings.Fields(string(out))
	if len(paths) != len(names) {
		return nil, fmt.Errorf("hack/kube-binaries.sh printed %d paths for %d names: %q", len(paths), len(names), out)
	}
	m := map[string]string{}
	for i, n := range names {
		m[n] = paths[i]
	}
	return m, nil
}

// MizarAPIServer is $MIZAR_APISERVER (the Makefile's build), or the command
// built into dir.
func MizarAPIServer(dir string) (string, error) {
	if p := os.Getenv("MIZAR_APISERVER"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("MIZAR_APISERVER: %w", err)
		}
		return filepath.Abs(p)
	}
	out := filepath.Join(dir, "mizar-apiserver")
	// go test puts its own toolchain first on PATH, so this builds with the same Go.
	cmd := exec.Command("go", "build", "-o", out, "mizar.dev/cmd/apiserver")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building mizar-apiserver (set $MIZAR_APISERVER to use a prebuilt one): %w\n%s", err, b)
	}
	return out, nil
}

// Mizarctl is $MIZARCTL (a prebuilt mizarctl), or mizar.dev/cmd/mizarctl
// built from this tree into dir.
func Mizarctl(dir string) (string, error) {
	if p := os.Getenv("MIZARCTL"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("MIZARCTL: %w", err)
		}
		return filepath.Abs(p)
	}
	out := filepath.Join(dir, "mizarctl")
	// go test puts its own toolchain first on PATH, so this builds with the same Go.
	cmd := exec.Command("go", "build", "-o", out, "mizar.dev/cmd/mizarctl")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building mizarctl (set $MIZARCTL to use a prebuilt one): %w\n%s", err, b)
	}
	return out, nil
}
