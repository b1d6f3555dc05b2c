package brokere2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	v1 "mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
	"mizar.dev/test/cluster"
)

// holdingProxy passes every request through to kube-apiserver, except one a
// test asked to hold: that one waits until released, or is dropped if its
// client goes away first (a killed mizar-apiserver never makes it).
type holdingProxy struct {
	URL string
	srv *httptest.Server

	mu     sync.Mutex
	hold   *hold
	writes []write
}

// write is a mutating request the proxy passed on.
type write struct {
	at                      time.Time
	userAgent, method, path string
}

type hold struct {
	method, pathSuffix string
	arrived, release   chan struct{}
	once               sync.Once
}

func newHoldingProxy(target string) (*holdingProxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("proxy target %s: %w", target, err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	// The workload cluster's serving certificate is self-signed.
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true}
	rp.FlushInterval = -1 // watches stream
	rp.ErrorLog = nil
	p := &holdingProxy{}
	// TLS: client-go sends a kubeconfig's token only over TLS.
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := p.take(r); h != nil {
			h.once.Do(func() { close(h.arrived) })
			select {
			case <-h.release:
			case <-r.Context().Done():
				return // the caller is gone: the request never reaches the cluster
			}
		}
		if r.Method != http.MethodGet {
			p.mu.Lock()
			p.writes = append(p.writes, write{time.Now(), r.UserAgent(), r.Method, r.URL.Path})
			p.mu.Unlock()
		}
		rp.ServeHTTP(w, r)
	}))
	p.srv.EnableHTTP2 = true
	p.srv.StartTLS()
	p.URL = p.srv.URL
	return p, nil
}

// Hold holds the next request of this method whose path ends so. It returns
// a channel closed when it arrives and a func that lets it through.
func (p *holdingProxy) Hold(method, pathSuffix string) (<-chan struct{}, func()) {
	h := &hold{method: method, pathSuffix: pathSuffix, arrived: make(chan struct{}), release: make(chan struct{})}
	p.mu.Lock()
	p.hold = h
	p.mu.Unlock()
	var once sync.Once
	return h.arrived, func() {
		once.Do(func() {
			p.mu.Lock()
			if p.hold == h {
				p.hold = nil
			}
			p.mu.Unlock()
			close(h.release)
		})
	}
}

func (p *holdingProxy) take(r *http.Request) *hold {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.hold
	if h == nil || r.Method != h.method || !strings.HasSuffix(r.URL.Path, h.pathSuffix) {
		return nil
	}
	p.hold = nil
	return h
}

// Writes are the mutating requests passed on so far whose path contains part.
func (p *holdingProxy) Writes(part string) []write {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []write
	for _, w := range p.writes {
		if strings.Contains(w.path, part) {
			out = append(out, w)
		}
	}
	return out
}

func (p *holdingProxy) Close() { p.srv.Close() }

// mizar is a standalone mizar-apiserver process with the fulfillment operator on.
type mizar struct {
	dataDir string
	Client  versioned.Interface
	cmd     *exec.Cmd
	out     *bytes.Buffer
	mu      *sync.Mutex
	exited  chan struct{}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// startMizar runs mizar-apiserver on dataDir (keeping what an earlier run left
// there) and waits until it is ready. The test stops it at cleanup.
func startMizar(t *testing.T, dataDir string, extra ...string) *mizar {
	t.Helper()
	kubeconfig := filepath.Join(dataDir, "kubeconfig")
	// A kubeconfig left by the previous run names a port that is gone.
	if err := os.Remove(kubeconfig); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	args := append([]string{"--standalone", "--data-dir", dataDir, "--secure-port", "0",
		"--operators=false", "--broker-fulfillment", "--broker-workload-kubeconfig", mizarKubeconfig}, extra...)
	if !slices.ContainsFunc(extra, func(a string) bool { return strings.HasPrefix(a, "--etcd-servers") }) {
		// Only the embedded etcd has the flag (it is refused beside --etcd-servers).
		args = append(args, "--embedded-etcd-unsafe-no-fsync")
	}
	m := &mizar{dataDir: dataDir, out: &bytes.Buffer{}, mu: &sync.Mutex{}, exited: make(chan struct{})}
	m.cmd = exec.Command(mizarBin, args...)
	m.cmd.Stdout, m.cmd.Stderr = lockedWriter{m.mu, m.out}, lockedWriter{m.mu, m.out}
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("starting mizar-apiserver: %v", err)
	}
	go func() { _ = m.cmd.Wait(); close(m.exited) }()
	t.Cleanup(func() {
		m.Stop()
		if t.Failed() {
			t.Logf("mizar-apiserver output (tail):\n%s", m.tail(40))
		}
	})
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case <-m.exited:
			return false, errors.New("mizar-apiserver exited")
		default:
		}
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return false, nil
		}
		cfg.QPS, cfg.Burst = 100, 200
		c, err := versioned.NewForConfig(cfg)
		if err != nil {
			return false, err
		}
		body, err := c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil || string(body) != "ok" {
			return false, nil
		}
		m.Client = c
		return true, nil
	})
	if err != nil {
		t.Fatalf("mizar-apiserver not ready: %v\n%s", err, m.tail(40))
	}
	return m
}

// Kill ends the process with SIGKILL, as a crash would.
func (m *mizar) Kill() {
	_ = m.cmd.Process.Kill()
	<-m.exited
}

// Stop ends the process with SIGTERM (SIGKILL after 20 s).
func (m *mizar) Stop() {
	select {
	case <-m.exited:
		return
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(20 * time.Second):
		m.Kill()
	}
}

// Said reports whether the process has printed s.
func (m *mizar) Said(s string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return strings.Contains(m.out.String(), s)
}

func (m *mizar) tail(n int) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	lines := strings.Split(strings.TrimRight(m.out.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// applyClass creates the shipped MySQL catalog entry.
func applyClass(t *testing.T, m *mizar) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cluster.RepoRoot(), "artifacts/broker/mysql-class.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var class v1.ServiceClass
	if err := yaml.UnmarshalStrict(b, &class); err != nil {
		t.Fatalf("decoding the shipped class: %v", err)
	}
	if _, err := m.Client.BrokerV1alpha1().ServiceClasses().Create(context.Background(), &class, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the class: %v", err)
	}
}

// servedNamespace creates a namespace the fulfillment identity serves (a
// RoleBinding to the shipped ClusterRole) and volumes for its claims to bind
// to; both go at cleanup.
func servedNamespace(t *testing.T, volumes int, size string) string {
	t.Helper()
	ctx := context.Background()
	ns := "brokere2e-" + utilrand.String(6)
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := exec.Command(kubectlBin, "--kubeconfig", workload.AdminKubeconfig, "get", "pods,pvc,events", "-n", ns, "-o", "wide").CombinedOutput()
			t.Logf("namespace %s at the failure:\n%s", ns, out)
		}
		_ = kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: identityName, Namespace: ns},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: identityName, Namespace: identityNamespace}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: identityName},
	}
	if _, err := kube.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createVolumes(t, ns, volumes, size)
	return ns
}

// createVolumes makes n statically provisioned volumes (no provisioner runs
// here) for any claim to bind to; they go at cleanup.
func createVolumes(t *testing.T, prefix string, volumes int, size string) {
	t.Helper()
	ctx := context.Background()
	for i := range volumes {
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, i)},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/" + prefix}},
			},
		}
		if _, err := kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = kube.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
		})
	}
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
