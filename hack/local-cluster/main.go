// Command local-cluster runs the control plane `make e2e-aggregated` tests
// against (etcd, kube-apiserver v1.35, kube-controller-manager, and
// mizar-apiserver aggregated on its own TLS etcd in a network namespace; see
// test/cluster) until interrupted, for trying mizar by hand with kubectl.
// Needs root.
//
//	make cluster        # or: go run ./hack/local-cluster
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"mizar.dev/test/cluster"
)

func main() {
	dir := flag.String("dir", "_output/cluster", "directory for certificates, kubeconfigs, data and logs (emptied first)")
	mizar := flag.String("mizar-apiserver", "_output/bin/mizar-apiserver", "mizar-apiserver binary ('make build' writes it)")
	flag.Parse()
	if err := run(*dir, *mizar); err != nil {
		fmt.Fprintln(os.Stderr, "local-cluster:", err)
		os.Exit(1)
	}
}

func run(dir, mizar string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (it creates a network namespace for mizar-apiserver)")
	}
	root, err := filepath.Abs(".")
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "hack/kube-binaries.sh")); err != nil {
		return fmt.Errorf("run from the repository root: %w", err)
	}
	if mizar, err = filepath.Abs(mizar); err != nil {
		return err
	}
	if _, err := os.Stat(mizar); err != nil {
		return fmt.Errorf("mizar-apiserver binary: %w (run 'make build')", err)
	}
	names := []string{"etcd", "kube-apiserver", "kube-controller-manager", "kubectl"}
	cmd := exec.Command(filepath.Join(root, "hack/kube-binaries.sh"), names...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("hack/kube-binaries.sh: %w", err)
	}
	bins := strings.Fields(string(out))
	if len(bins) != len(names) {
		return fmt.Errorf("hack/kube-binaries.sh printed %q", out)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("emptying %s: %w", dir, err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	c, err := cluster.Start(startCtx, cluster.Options{
		Dir: dir, Etcd: bins[0], KubeAPIServer: bins[1], KubeControllerManager: bins[2], Kubectl: bins[3],
		MizarAPIServer: mizar,
		Manifests:      []string{filepath.Join(root, "artifacts/deploy/namespace.yaml"), filepath.Join(root, "artifacts/deploy/rbac.yaml")},
	})
	if err != nil {
		return err
	}
	fmt.Printf(`Control plane ready in %v.
  kube-apiserver   %s  (logs in %s/logs)
  mizar-apiserver  %s  (aggregated as v1alpha1.networking.mizar.dev)

  export KUBECONFIG=%s
  %s apply -f artifacts/examples/network.yaml && %s get mizar -A

Direct to mizar-apiserver: KUBECONFIG=%s. Ctrl-C stops everything.
`, time.Since(start).Round(time.Millisecond), c.KubeURL, dir, c.MizarURL, c.AdminKubeconfig, bins[3], bins[3], c.DirectKubeconfig)
	<-ctx.Done()
	fmt.Println("\nstopping ...")
	return c.Stop()
}
