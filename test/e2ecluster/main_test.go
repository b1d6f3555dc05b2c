// Package e2ecluster checks mizar as the network of a real Kubernetes cluster:
// stock kind (podman provider), a node image and every image built here,
// real kubelet, containerd, runc, kube-proxy and CoreDNS, and mizar installed
// by `helm install` of its chart (hack/kind/up.sh, `make e2e-cluster`).
//
// MIZAR_KIND_CNI=reference runs the checks that do not need mizar against the
// reference bridge + host-local plugins instead: the harness proven on its
// own, and the baseline. MIZAR_E2E_KEEP=1 keeps the cluster afterwards
// (KUBECONFIG=_output/kind/kubeconfig). Needs root and podman; under CI=true
// a missing prerequisite fails the test instead of skipping it.
//
// It runs only when asked (MIZAR_E2E_CLUSTER=1, as `make e2e-cluster` sets):
// it builds a node image and a cluster for tens of minutes, more than
// `go test ./...` (make test) gives one package.
package e2ecluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"mizar.dev/test/ci"
	"mizar.dev/test/cluster"
)

// env is the running cluster and the commands that drive it.
type env struct {
	root       string
	cni        string // mizar or reference
	kubeconfig string
	kubectl    string
	helm       string
	kind       string
	image      string // the test pods' image
	cs         *kubernetes.Clientset
}

var (
	setupOnce sync.Once
	theEnv    *env
	setupErr  error
	// upRan is set once hack/kind/up.sh has been started, so TestMain
	// removes whatever it created, even when it failed half way.
	upRan bool
)

func TestMain(m *testing.M) {
	code := m.Run()
	if upRan && code != 0 && theEnv != nil {
		// The nodes' journals, containerd and kubelet logs and pod logs, for
		// whoever reads the failure (kept in _output/kind/logs).
		dir := filepath.Join(theEnv.root, "_output/kind/logs")
		if _, err := theEnv.run(context.Background(), theEnv.kind, "export", "logs", dir, "--name", "mizar"); err != nil {
			fmt.Fprintf(os.Stderr, "e2ecluster: kind export logs: %v\n", err)
		} else {
			fmt.Fprintf(os.Stderr, "e2ecluster: the cluster's logs are in %s\n", dir)
		}
	}
	if upRan && os.Getenv("MIZAR_E2E_KEEP") != "1" {
		if err := down(); err != nil {
			fmt.Fprintf(os.Stderr, "e2ecluster: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// down removes the kind cluster (hack/kind/down.sh).
func down() error {
	cmd := exec.Command(filepath.Join(cluster.RepoRoot(), "hack/kind/down.sh"))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("hack/kind/down.sh: %w", err)
	}
	return nil
}

// clusterEnv brings the cluster up once (hack/kind/up.sh, idempotent) and
// loads the test image into it; every test shares it.
func clusterEnv(t *testing.T) *env {
	t.Helper()
	if os.Getenv("MIZAR_E2E_CLUSTER") != "1" {
		// Chosen by the run, not missing: `make e2e-cluster` runs it.
		t.Skip("the kind cluster e2e runs with MIZAR_E2E_CLUSTER=1 (make e2e-cluster)")
	}
	ci.RequireRoot(t, "kind's podman nodes run privileged and the node image is built with chroot")
	if _, err := exec.LookPath("podman"); err != nil {
		ci.Unavailable(t, "podman is not installed (hack/install-deps.sh installs it)")
	}
	setupOnce.Do(func() { theEnv, setupErr = setup(os.Getenv("MIZAR_KIND_CNI")) })
	if setupErr != nil {
		t.Fatalf("bringing the kind cluster up: %v", setupErr)
	}
	return theEnv
}

// setup brings the cluster up with network cni ("" = mizar) and loads the
// test image.
func setup(cni string) (*env, error) {
	root, err := filepath.Abs(cluster.RepoRoot())
	if err != nil {
		return nil, err
	}
	e := &env{root: root, cni: cni, kubeconfig: filepath.Join(root, "_output/kind/kubeconfig")}
	if e.cni == "" {
		e.cni = "mizar"
	}
	if e.cni != "mizar" && e.cni != "reference" {
		return nil, fmt.Errorf("MIZAR_KIND_CNI=%q: want mizar or reference", e.cni)
	}
	bins, err := cluster.Binaries("kubectl", "helm", "kind")
	if err != nil {
		return nil, err
	}
	e.kubectl, e.helm, e.kind = bins["kubectl"], bins["helm"], bins["kind"]

	upRan = true
	start := time.Now()
	up := exec.Command(filepath.Join(root, "hack/kind/up.sh"))
	up.Env = append(os.Environ(), "MIZAR_KIND_CNI="+e.cni)
	up.Stdout, up.Stderr = os.Stderr, os.Stderr
	if err := up.Run(); err != nil {
		// e, so TestMain exports the half-made cluster's logs and removes it.
		return e, fmt.Errorf("hack/kind/up.sh (MIZAR_KIND_CNI=%s): %w (its messages above say what failed)", e.cni, err)
	}
	fmt.Fprintf(os.Stderr, "e2ecluster: cluster up in %s\n", time.Since(start).Round(time.Second))

	tarball, err := output(exec.Command(filepath.Join(root, "hack/kind/test-image.sh")))
	if err != nil {
		return nil, fmt.Errorf("building the test image: %w", err)
	}
	kube, err := output(exec.Command("awk", `$1 == "k8s.io/kubernetes" {print $2; exit}`, filepath.Join(root, "hack/tools/kube/go.mod")))
	if err != nil {
		return nil, err
	}
	e.image = "mizar.dev/e2e-agnhost:" + kube
	load := exec.Command(e.kind, "load", "image-archive", "--name", "mizar", tarball)
	load.Env = e.podmanEnv()
	if out, err := load.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("kind load image-archive %s: %w\n%s", tarball, err, out)
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", e.kubeconfig)
	if err != nil {
		return nil, err
	}
	if e.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	return e, nil
}

// podmanEnv is the environment hack/kind/podman-env.sh sets for podman and kind.
func (e *env) podmanEnv() []string {
	cache := os.Getenv("MIZAR_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache/mizar")
	}
	dir := filepath.Join(cache, "podman")
	return append(os.Environ(), "CONTAINERS_CONF="+filepath.Join(dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF="+filepath.Join(dir, "storage.conf"), "KIND_EXPERIMENTAL_PROVIDER=podman",
		"KUBECONFIG="+e.kubeconfig)
}

// run runs a command with the cluster's kubeconfig and podman settings and
// returns its combined output; the error carries the output.
func (e *env) run(ctx context.Context, name string, args ...string) (string, error) {
	return e.runStdin(ctx, "", name, args...)
}

// runStdin is run with stdin as the command's standard input.
func (e *env) runStdin(ctx context.Context, stdin, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = e.podmanEnv()
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, lastLines(out.String(), 15))
	}
	return out.String(), nil
}

func (e *env) kubectlRun(ctx context.Context, args ...string) (string, error) {
	return e.run(ctx, e.kubectl, args...)
}

// kubectlStdin runs kubectl with stdin (a manifest for `apply -f -`).
func (e *env) kubectlStdin(ctx context.Context, stdin string, args ...string) (string, error) {
	return e.runStdin(ctx, stdin, e.kubectl, args...)
}

// exec runs argv in a pod's container (through kubelet, not the pod network).
func (e *env) exec(ctx context.Context, ns, pod string, argv ...string) (string, error) {
	return e.kubectlRun(ctx, append([]string{"exec", "-n", ns, pod, "--"}, argv...)...)
}

// node runs a command in a kind node container.
func (e *env) node(ctx context.Context, node string, argv ...string) (string, error) {
	return e.run(ctx, "podman", append([]string{"exec", node}, argv...)...)
}

func output(cmd *exec.Cmd) (string, error) {
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
