// Package workload runs the broker's fulfillment operator against a real
// kube-apiserver (the workload cluster) with the identity and RBAC shipped in
// artifacts/broker/fulfillment-rbac.yaml, and mizar-apiserver in-process.
// No kubelet runs: replicas are reported ready by writing the StatefulSet's
// status, as the StatefulSet controller would.
package workload

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"code.cloudfoundry.org/brokerapi/v13/domain"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	v1 "mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/broker/fulfillment"
	"mizar.dev/pkg/broker/osb"
	"mizar.dev/pkg/broker/saga"
	"mizar.dev/test/cluster"
	"mizar.dev/test/workloadcluster"
)

// startWorkloadCluster runs etcd and kube-apiserver (test/workloadcluster);
// it returns an admin config.
func startWorkloadCluster(t *testing.T) *rest.Config {
	c := workloadcluster.StartAPIServer(t)
	return c.Admin
}

func repoRoot() string { return cluster.RepoRoot() }

func kubectl(t *testing.T, admin *rest.Config, args ...string) {
	t.Helper()
	args = append([]string{"--server", admin.Host, "--token", admin.BearerToken, "--insecure-skip-tls-verify"}, args...)
	out, err := exec.Command("kubectl", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args[5:], " "), err, out)
	}
}

func waitOrder(t *testing.T, s *apiservertest.Server, ns, name, what string, cond func(*v1.ServiceInstance) bool) *v1.ServiceInstance {
	t.Helper()
	var last *v1.ServiceInstance
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		in, err := s.Client.BrokerV1alpha1().ServiceInstances(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return cond(nil), nil
		}
		if err != nil {
			return false, err
		}
		last = in
		return cond(in), nil
	})
	if err != nil {
		t.Fatalf("order %s/%s never %s: %v; last %+v", ns, name, what, err, last)
	}
	return last
}

func TestFulfillmentAgainstARealWorkloadCluster(t *testing.T) {
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not on PATH")
	}
	admin := startWorkloadCluster(t)
	kube := kubernetes.NewForConfigOrDie(admin)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The shipped identity and permissions, served namespace mizar-broker only.
	for _, ns := range []string{"mizar-system", "mizar-broker", "elsewhere"} {
		kubectl(t, admin, "create", "namespace", ns)
	}
	kubectl(t, admin, "apply", "-f", filepath.Join(repoRoot(), "artifacts/broker/fulfillment-rbac.yaml"))
	tok, err := kube.CoreV1().ServiceAccounts("mizar-system").CreateToken(ctx, "mizar-broker-fulfillment",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	identity := rest.AnonymousClientConfig(admin)
	identity.BearerToken = tok.Status.Token
	workload := kubernetes.NewForConfigOrDie(identity)

	mizar := apiservertest.Start(t, t.TempDir())
	classYAML := filepath.Join(repoRoot(), "artifacts/broker/mysql-class.yaml")
	out, err := exec.Command("kubectl", "--kubeconfig", mizar.Kubeconfig, "apply", "-f", classYAML).CombinedOutput()
	if err != nil {
		t.Fatalf("applying the class: %v\n%s", err, out)
	}
	c, err := fulfillment.New(mizar.Client, workload)
	if err != nil {
		t.Fatal(err)
	}
	c.Backoff = saga.Backoff{Initial: 50 * time.Millisecond, Factor: 2, Max: time.Second}
	opCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(opCtx, 2) }()
	defer func() { stop(); <-done }()

	order := func(ns string) *v1.ServiceInstance {
		return &v1.ServiceInstance{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: ns},
			Spec: v1.ServiceInstanceSpec{Class: "mysql", Plan: "ha"}}
	}

	// Served namespace: Secret, Service, StatefulSet; Provisioned only when ready.
	if _, err := mizar.Client.BrokerV1alpha1().ServiceInstances("mizar-broker").Create(ctx, order("mizar-broker"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waiting := waitOrder(t, mizar, "mizar-broker", "db", "waited for replicas", func(in *v1.ServiceInstance) bool {
		return in != nil && in.Status.Phase == v1.PhaseProvisioning && strings.Contains(fulfillment.Describe(in), "waiting for 0/3 replicas ready")
	})
	// The workload objects are named from the order's uid (status.workloadName), not its name.
	wl := waiting.Status.WorkloadName
	if wl == "" {
		t.Fatalf("order db waits for replicas with no status.workloadName: %+v", waiting.Status)
	}
	sts, err := kube.AppsV1().StatefulSets("mizar-broker").Get(ctx, wl, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Services("mizar-broker").Get(ctx, wl, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	secret, err := kube.CoreV1().Secrets("mizar-broker").Get(ctx, wl+"-credentials", metav1.GetOptions{})
	if err != nil || len(secret.Data["password"]) < 16 {
		t.Fatalf("credentials Secret: %v", err)
	}
	sts.Status.Replicas, sts.Status.ReadyReplicas, sts.Status.ObservedGeneration = 3, 3, sts.Generation
	if _, err := kube.AppsV1().StatefulSets("mizar-broker").UpdateStatus(ctx, sts, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOrder(t, mizar, "mizar-broker", "db", "became Provisioned", func(in *v1.ServiceInstance) bool {
		return in.Status.Phase == v1.PhaseProvisioned
	})

	// The OSB facade hands out the credentials the real Secret holds.
	facade := osb.New(mizar.Client, workload, "mizar-broker")
	if err := facade.Start(ctx); err != nil {
		t.Fatal(err)
	}
	class, err := mizar.Client.BrokerV1alpha1().ServiceClasses().Get(ctx, "mysql", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A bind names the instance's service and plan (OSB: 400 otherwise).
	bindTo := domain.BindDetails{ServiceID: class.Spec.ID}
	for _, p := range class.Spec.Plans {
		if p.Name == "ha" {
			bindTo.PlanID = p.ID
		}
	}
	binding, err := facade.Bind(ctx, "db", "app", bindTo, false)
	if err != nil {
		t.Fatalf("bind: %v", err)
	}
	if cr := binding.Credentials.(map[string]any); cr["password"] != string(secret.Data["password"]) || cr["host"] != wl+".mizar-broker.svc" {
		t.Errorf("bound credentials %v do not match the Secret", cr)
	}
	if _, err := facade.Unbind(ctx, "db", "app", domain.UnbindDetails{}, false); err != nil {
		t.Errorf("unbind: %v", err)
	}

	// A namespace the identity does not serve: Forbidden fails the order, nothing is left.
	if _, err := mizar.Client.BrokerV1alpha1().ServiceInstances("elsewhere").Create(ctx, order("elsewhere"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in := waitOrder(t, mizar, "elsewhere", "db", "failed", func(in *v1.ServiceInstance) bool {
		r := meta.FindStatusCondition(in.Status.Conditions, fulfillment.ConditionReady)
		return r != nil && r.Reason == "Failed"
	})
	r := meta.FindStatusCondition(in.Status.Conditions, fulfillment.ConditionReady)
	if !strings.Contains(r.Message, "(CreatingSecret) failed") || !strings.Contains(r.Message, "forbidden") {
		t.Errorf("Ready condition of the forbidden order: %q", r.Message)
	}

	// Deprovision removes everything it made.
	if err := mizar.Client.BrokerV1alpha1().ServiceInstances("mizar-broker").Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOrder(t, mizar, "mizar-broker", "db", "went away", func(in *v1.ServiceInstance) bool { return in == nil })
	if _, err := kube.AppsV1().StatefulSets("mizar-broker").Get(ctx, wl, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("StatefulSet left behind: %v", err)
	}
	if _, err := kube.CoreV1().Services("mizar-broker").Get(ctx, wl, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Service left behind: %v", err)
	}
	if _, err := kube.CoreV1().Secrets("mizar-broker").Get(ctx, wl+"-credentials", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Secret left behind: %v", err)
	}
}
