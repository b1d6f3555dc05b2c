// Package workload runs the broker's fulfillment operator against a real
// kube-apiserver (the workload cluster) with the identity and RBAC shipped in
// artifacts/broker/fulfillment-rbac.yaml, and mizar-apiserver in-process.
// No kubelet runs: replicas are reported ready by writing the StatefulSet's
// status, as the StatefulSet controller would.
package workload

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"code.cloudfoundry.org/brokerapi/v13/domain"
	"go.etcd.io/etcd/server/v3/embed"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/keyutil"

	v1 "mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/broker/fulfillment"
	"mizar.dev/pkg/broker/osb"
	"mizar.dev/pkg/broker/saga"
)

const adminToken = "mizar-workload-test-admin"

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "../..")
}

// kubeAPIServer finds the binary: $KUBE_APISERVER, the project's build script, or its cache.
func kubeAPIServer(t *testing.T) string {
	if p := os.Getenv("KUBE_APISERVER"); p != "" {
		return p
	}
	if script := filepath.Join(repoRoot(), "hack/kube-binaries.sh"); fileExists(script) {
		if out, err := exec.Command(script, "kube-apiserver").Output(); err == nil {
			return strings.TrimSpace(string(out))
		}
	}
	home, _ := os.UserHomeDir()
	if p := filepath.Join(home, ".cache/mizar/kube-v1.35.4/bin/kube-apiserver"); fileExists(p) {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no kube-apiserver binary (set KUBE_APISERVER or run hack/kube-binaries.sh)")
	}
	t.Skip("no kube-apiserver binary (set KUBE_APISERVER or run hack/kube-binaries.sh)")
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startWorkloadCluster runs etcd (in-process) and kube-apiserver; it returns an
// admin config.
func startWorkloadCluster(t *testing.T) *rest.Config {
	bin := kubeAPIServer(t)
	dir := t.TempDir()

	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dir, "etcd")
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "error"
	u := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{u}, []url.URL{u}
	cfg.ListenPeerUrls = nil
	cfg.AdvertisePeerUrls = []url.URL{{Scheme: "http", Host: "localhost:2380"}}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	<-e.Server.ReadyNotify()

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	saKey := write("sa.key", keyPEM)
	saPub := write("sa.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	tokens := write("tokens.csv", []byte(adminToken+",admin,admin,system:masters\n"))
	port := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin,
		"--etcd-servers="+u.String(), "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port), "--cert-dir="+filepath.Join(dir, "certs"),
		"--authorization-mode=RBAC", "--token-auth-file="+tokens,
		"--service-cluster-ip-range=10.0.0.0/24", "--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+saPub, "--service-account-signing-key-file="+saKey,
		"--endpoint-reconciler-type=none", "--enable-priority-and-fairness=false")
	logf, _ := os.Create(filepath.Join(dir, "kube-apiserver.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			out, _ := os.ReadFile(filepath.Join(dir, "kube-apiserver.log"))
			if len(out) > 4000 {
				out = out[len(out)-4000:]
			}
			t.Logf("kube-apiserver log tail:\n%s", out)
		}
	})
	admin := &rest.Config{Host: fmt.Sprintf("https://127.0.0.1:%d", port), BearerToken: adminToken,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	kube := kubernetes.NewForConfigOrDie(admin)
	err = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		body, err := kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
	if err != nil {
		t.Fatalf("kube-apiserver never ready: %v", err)
	}
	return admin
}

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
	waitOrder(t, mizar, "mizar-broker", "db", "waited for replicas", func(in *v1.ServiceInstance) bool {
		return in != nil && in.Status.Phase == v1.PhaseProvisioning && strings.Contains(fulfillment.Describe(in), "waiting for 0/3 replicas ready")
	})
	sts, err := kube.AppsV1().StatefulSets("mizar-broker").Get(ctx, "db", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Services("mizar-broker").Get(ctx, "db", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	secret, err := kube.CoreV1().Secrets("mizar-broker").Get(ctx, "db-credentials", metav1.GetOptions{})
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
	binding, err := facade.Bind(ctx, "db", "app", domain.BindDetails{}, false)
	if err != nil {
		t.Fatalf("bind: %v", err)
	}
	if cr := binding.Credentials.(map[string]any); cr["password"] != string(secret.Data["password"]) || cr["host"] != "db.mizar-broker.svc" {
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
	if _, err := kube.AppsV1().StatefulSets("mizar-broker").Get(ctx, "db", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("StatefulSet left behind: %v", err)
	}
	if _, err := kube.CoreV1().Services("mizar-broker").Get(ctx, "db", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Service left behind: %v", err)
	}
	if _, err := kube.CoreV1().Secrets("mizar-broker").Get(ctx, "db-credentials", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Secret left behind: %v", err)
	}
}
