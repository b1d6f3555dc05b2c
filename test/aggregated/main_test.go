// Package aggregated runs mizar-apiserver behind a real kube-apiserver (see
// test/cluster) and drives it with real kubectl binaries of two versions, as a
// cluster's users would. It needs root (a network namespace); under CI=true it
// fails without it, elsewhere it skips.
//
// Binaries come from hack/kube-binaries.sh (built once into ~/.cache/mizar);
// mizar-apiserver is $MIZAR_APISERVER or built here.
//
//	make e2e-aggregated    # or: go test ./test/aggregated -count=1 -v
package aggregated

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"mizar.dev/test/ci"
	"mizar.dev/test/cluster"
)

var (
	// cl is the control plane every test shares.
	cl *cluster.Cluster
	// kubectls maps a version label to a kubectl binary; the suite runs per entry.
	kubectls []kubectlBin
	repoRoot string
	// helmBin is the pinned helm, for the chart tests.
	helmBin string
	// kubectlSkipped says why a kubectl version is missing from kubectls.
	kubectlSkipped string
)

type kubectlBin struct{ version, path string }

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		msg := "test/aggregated needs root to create a network namespace for mizar-apiserver"
		if ci.Enforced() {
			fmt.Fprintln(os.Stderr, "FAIL:", msg)
			return 1
		}
		fmt.Fprintln(os.Stderr, "SKIP:", msg)
		return 0
	}
	var err error
	if repoRoot, err = filepath.Abs("../.."); err != nil {
		fmt.Fprintln(os.Stderr, "aggregated:", err)
		return 1
	}
	// Short root: etcd's unix sockets must fit in 107 bytes.
	dir, err := os.MkdirTemp("", "mizar-agg-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "aggregated:", err)
		return 1
	}
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(dir)
		}
	}()

	bins, err := cluster.Binaries("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "helm")
	if err != nil {
		fmt.Fprintln(os.Stderr, "aggregated:", err)
		return 1
	}
	kubectls = []kubectlBin{{"1.35", bins["kubectl"]}}
	// The skew check's older kubectl: if it cannot be built here, only its run is skipped.
	if old, err := cluster.Binaries("kubectl-1.33"); err != nil {
		kubectlSkipped = fmt.Sprintf("kubectl 1.33 is not installable here: %v", err)
		fmt.Fprintln(os.Stderr, "aggregated:", kubectlSkipped)
	} else {
		kubectls = append(kubectls, kubectlBin{"1.33", old["kubectl-1.33"]})
	}
	helmBin = bins["helm"]
	mizar, err := cluster.MizarAPIServer(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "aggregated:", err)
		return 1
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	cl, err = cluster.Start(ctx, cluster.Options{
		Dir:  dir,
		Etcd: bins["etcd"], KubeAPIServer: bins["kube-apiserver"], KubeControllerManager: bins["kube-controller-manager"],
		MizarAPIServer: mizar, Kubectl: bins["kubectl"],
		// mizar's namespace and RBAC exactly as shipped: if they lack a permission
		// the server needs, it never becomes ready.
		Manifests: []string{filepath.Join(repoRoot, "artifacts/deploy/namespace.yaml"), filepath.Join(repoRoot, "artifacts/deploy/rbac.yaml")},
		// As artifacts/deploy/apiserver.yaml runs it: agents' writes bound to their token's node.
		MizarArgs: []string{"--node-agent-service-account=mizar-system/mizar-agent"},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "aggregated: starting the control plane:", err)
		if os.Getenv("MIZAR_KEEP") != "" {
			keep = true
			fmt.Fprintln(os.Stderr, "kept", dir)
		}
		return 1
	}
	fmt.Fprintf(os.Stderr, "control plane ready in %v (kube-apiserver %s, mizar-apiserver %s)\n", time.Since(start).Round(time.Millisecond), cl.KubeURL, cl.MizarURL)
	code := m.Run()
	if code != 0 && os.Getenv("MIZAR_KEEP") != "" {
		keep = true
		fmt.Fprintln(os.Stderr, "aggregated: kept the control plane's files (logs/, pki/) in", dir)
	}
	if err := cl.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "aggregated: stopping the control plane:", err)
		code = 1
	}
	return code
}
