// Package brokere2e runs the broker end to end against a real workload
// cluster: kube-apiserver, kube-controller-manager and kube-scheduler, with
// kwok playing the kubelets of three fake Nodes, so the StatefulSet controller
// makes the pods, the scheduler binds them and kwok makes them Ready.
// mizar-apiserver runs as its own process (standalone, embedded etcd, the
// fulfillment operator on) so a test can kill -9 it and start it again on the
// same data. It reaches the workload cluster as the identity and with the
// permissions shipped in artifacts/broker/fulfillment-rbac.yaml, through a
// pass-through proxy a test can use to hold one request.
//
//	go test ./test/brokere2e -count=1 -v
package brokere2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"mizar.dev/test/cluster"
	"mizar.dev/test/workloadcluster"
)

var (
	// workload is the shared workload cluster; kube its admin client.
	workload *workloadcluster.Cluster
	kube     kubernetes.Interface
	// proxy fronts kube-apiserver for mizar-apiserver.
	proxy *holdingProxy
	// mizarKubeconfig is the fulfillment identity's kubeconfig, through proxy.
	mizarKubeconfig string
	mizarBin        string
	kubectlBin      string
)

// The fulfillment identity of artifacts/broker/fulfillment-rbac.yaml.
const (
	identityNamespace = "mizar-system"
	identityName      = "mizar-broker-fulfillment"
	// podReadyDelay is how long kwok keeps each pod unready: orders spend a
	// visible while waiting for replicas.
	podReadyDelay = 1500 * time.Millisecond
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "brokere2e:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "mizar-brokere2e-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	bins, err := cluster.Binaries("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl")
	if err != nil {
		return fail(err)
	}
	kubectlBin = bins["kubectl"]
	if mizarBin, err = cluster.MizarAPIServer(dir); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	workload, err = workloadcluster.Start(ctx, workloadcluster.Options{
		Dir: filepath.Join(dir, "workload"), KubeAPIServer: bins["kube-apiserver"],
		KubeControllerManager: bins["kube-controller-manager"], KubeScheduler: bins["kube-scheduler"], Kwok: bins["kwok"],
		Nodes: 3, PodReadyDelay: podReadyDelay,
	})
	if err != nil {
		return fail(fmt.Errorf("starting the workload cluster: %w", err))
	}
	defer func() {
		if err := workload.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "brokere2e: stopping the workload cluster:", err)
		}
	}()
	if kube, err = kubernetes.NewForConfig(workload.Admin); err != nil {
		return fail(err)
	}
	if err := setupIdentity(ctx); err != nil {
		return fail(err)
	}
	if proxy, err = newHoldingProxy(workload.Admin.Host); err != nil {
		return fail(err)
	}
	defer proxy.Close()
	tok, err := kube.CoreV1().ServiceAccounts(identityNamespace).CreateToken(ctx, identityName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		return fail(fmt.Errorf("a token for the fulfillment identity: %w", err))
	}
	if mizarKubeconfig, err = workload.WriteKubeconfigFor("fulfillment.kubeconfig", proxy.URL, tok.Status.Token); err != nil {
		return fail(err)
	}
	fmt.Fprintf(os.Stderr, "brokere2e: workload cluster with 3 kwok nodes ready in %v\n", time.Since(start).Round(time.Millisecond))
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, workload.Logs(15))
	}
	return code
}

func ptr[T any](v T) *T { return &v }

// setupIdentity applies the shipped fulfillment RBAC with kubectl, as an operator would.
func setupIdentity(ctx context.Context) error {
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: identityNamespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", identityNamespace, err)
	}
	// The shipped RoleBinding is for namespace mizar-broker: it must exist for apply.
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mizar-broker"}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating namespace mizar-broker: %w", err)
	}
	rbac := filepath.Join(cluster.RepoRoot(), "artifacts/broker/fulfillment-rbac.yaml")
	out, err := exec.CommandContext(ctx, kubectlBin, "--kubeconfig", workload.AdminKubeconfig, "apply", "-f", rbac).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl apply -f %s: %w\n%s", rbac, err, out)
	}
	return nil
}
