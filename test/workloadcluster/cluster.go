// Package workloadcluster runs a small real Kubernetes cluster for the broker's
// tests: the cluster its fulfillment operator provisions into. etcd runs
// in-process; kube-apiserver (token authentication, RBAC) always runs, and on
// request kube-controller-manager (StatefulSet, garbage collector, volume
// binding, quota), kube-scheduler and kwok, which plays the kubelets of fake
// Nodes so StatefulSet pods are scheduled and become Running and Ready
// without containers. No root is needed.
package workloadcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/keyutil"

	"mizar.dev/test/cluster"
)

// AdminToken authenticates as system:masters.
const AdminToken = "mizar-workload-admin"

// NodeAnnotation marks the Nodes kwok plays the kubelet of.
const NodeAnnotation = "kwok.x-k8s.io/node"

// Options say which components run. Binaries come from Binaries.
type Options struct {
	// Dir holds etcd's data, keys, kubeconfigs and logs.
	Dir string
	// KubeAPIServer is required; the others are optional.
	KubeAPIServer, KubeControllerManager, KubeScheduler, Kwok string
	// Nodes is how many fake Nodes kwok plays (needs Kwok).
	Nodes int
	// PodReadyDelay is how long kwok keeps a scheduled pod Pending before it
	// is Running and Ready, so tests can see the time before readiness.
	PodReadyDelay time.Duration
}

// Cluster is a running workload cluster.
type Cluster struct {
	// Admin is a client config for system:masters.
	Admin *rest.Config
	// AdminKubeconfig is the same as a kubeconfig file.
	AdminKubeconfig string

	dir   string
	etcd  *embed.Etcd
	mu    sync.Mutex
	procs []*cluster.Proc
}

// Start brings the cluster up, or stops what it started and returns the error.
func Start(ctx context.Context, o Options) (_ *Cluster, err error) {
	if o.KubeAPIServer == "" {
		return nil, errors.New("workloadcluster: no kube-apiserver binary given")
	}
	if o.Nodes > 0 && o.Kwok == "" {
		return nil, errors.New("workloadcluster: fake Nodes need kwok")
	}
	c := &Cluster{dir: o.Dir}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Stop())
		}
	}()
	if err := os.MkdirAll(filepath.Join(o.Dir, "logs"), 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", o.Dir, err)
	}
	etcdURL, err := c.startEtcd()
	if err != nil {
		return nil, err
	}
	if err := c.startAPIServer(ctx, o.KubeAPIServer, etcdURL); err != nil {
		return nil, err
	}
	if o.KubeControllerManager != "" {
		// Only what StatefulSets need: pods, their claims bound to volumes,
		// quota, a default ServiceAccount, and collection of what is deleted.
		if _, err := c.start("kube-controller-manager", o.KubeControllerManager,
			"--kubeconfig="+c.AdminKubeconfig,
			"--controllers=statefulset,garbagecollector,namespace,serviceaccount,persistentvolume-binder,pvc-protection,pv-protection,resourcequota",
			"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0"); err != nil {
			return nil, err
		}
	}
	if o.KubeScheduler != "" {
		if _, err := c.start("kube-scheduler", o.KubeScheduler,
			"--kubeconfig="+c.AdminKubeconfig, "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0"); err != nil {
			return nil, err
		}
	}
	if o.Kwok != "" {
		stages := filepath.Join(o.Dir, "kwok-stages.yaml")
		if err := os.WriteFile(stages, []byte(kwokStages(o.PodReadyDelay)), 0o600); err != nil {
			return nil, fmt.Errorf("writing kwok's stages: %w", err)
		}
		if _, err := c.start("kwok", o.Kwok, "--kubeconfig="+c.AdminKubeconfig, "--config="+stages,
			"--manage-nodes-with-annotation-selector="+NodeAnnotation+"=fake"); err != nil {
			return nil, err
		}
	}
	if err := c.addNodes(ctx, o.Nodes); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) startEtcd() (string, error) {
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(c.dir, "etcd")
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "error"
	port, err := freePort()
	if err != nil {
		return "", err
	}
	u := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", port)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{u}, []url.URL{u}
	cfg.ListenPeerUrls = nil
	cfg.AdvertisePeerUrls = []url.URL{{Scheme: "http", Host: "localhost:2380"}}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return "", fmt.Errorf("starting the workload cluster's etcd: %w", err)
	}
	c.etcd = e
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(time.Minute):
		return "", errors.New("the workload cluster's etcd was not ready within a minute")
	}
	return u.String(), nil
}

func (c *Cluster) startAPIServer(ctx context.Context, bin, etcdURL string) error {
	keyPEM, err := keyutil.MakeEllipticPrivateKeyPEM()
	if err != nil {
		return fmt.Errorf("generating the service account key: %w", err)
	}
	write := func(name string, data []byte) (string, error) {
		p := filepath.Join(c.dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return "", fmt.Errorf("writing %s: %w", name, err)
		}
		return p, nil
	}
	saKey, err := write("sa.key", keyPEM)
	if err != nil {
		return err
	}
	tokens, err := write("tokens.csv", []byte(AdminToken+",admin,admin,system:masters\n"))
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	if _, err := c.start("kube-apiserver", bin,
		"--etcd-servers="+etcdURL, "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port), "--cert-dir="+filepath.Join(c.dir, "certs"),
		"--authorization-mode=RBAC", "--token-auth-file="+tokens,
		"--service-cluster-ip-range=10.0.0.0/24", "--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+saKey, "--service-account-signing-key-file="+saKey,
		"--endpoint-reconciler-type=none", "--enable-priority-and-fairness=false",
		// It taints new Nodes not-ready until the node lifecycle controller sees
		// kubelet heartbeats; kwok's Nodes are Ready at once and send none.
		"--disable-admission-plugins=TaintNodesByCondition"); err != nil {
		return err
	}
	c.Admin = &rest.Config{Host: fmt.Sprintf("https://127.0.0.1:%d", port), BearerToken: AdminToken,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 100, Burst: 200}
	if c.AdminKubeconfig, err = c.WriteKubeconfig("admin.kubeconfig", AdminToken); err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(c.Admin)
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if p := c.proc("kube-apiserver"); p.Exited() {
			return false, fmt.Errorf("kube-apiserver exited: %v\n%s", p.Err(), p.Tail(30))
		}
		body, err := kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
	if err != nil {
		return fmt.Errorf("kube-apiserver never ready: %w", err)
	}
	return nil
}

// WriteKubeconfig writes a kubeconfig for the bearer token into the
// cluster's directory and returns its path.
func (c *Cluster) WriteKubeconfig(name, token string) (string, error) {
	return c.writeKubeconfig(name, c.Admin.Host, token)
}

// WriteKubeconfigFor is WriteKubeconfig for another address of the same
// server (a proxy in front of it, say).
func (c *Cluster) WriteKubeconfigFor(name, server, token string) (string, error) {
	return c.writeKubeconfig(name, server, token)
}

func (c *Cluster) writeKubeconfig(name, server, token string) (string, error) {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %q, insecure-skip-tls-verify: %t}
users:
- name: u
  user: {token: %q}
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
`, server, strings.HasPrefix(server, "https:"), token)
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		return "", fmt.Errorf("writing %s: %w", p, err)
	}
	return p, nil
}

// addNodes registers n fake Nodes and waits until kwok reports them Ready.
func (c *Cluster) addNodes(ctx context.Context, n int) error {
	if n == 0 {
		return nil
	}
	kube, err := kubernetes.NewForConfig(c.Admin)
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	for i := range n {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:        fmt.Sprintf("kwok-node-%d", i),
			Annotations: map[string]string{NodeAnnotation: "fake"},
			Labels:      map[string]string{"kubernetes.io/hostname": fmt.Sprintf("kwok-node-%d", i), "type": "kwok"},
		}}
		if _, err := kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating Node %s: %w", node.Name, err)
		}
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if p := c.proc("kwok"); p.Exited() {
			return false, fmt.Errorf("kwok exited: %v\n%s", p.Err(), p.Tail(30))
		}
		nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		ready := 0
		for _, n := range nodes.Items {
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == n, nil
	})
	if err != nil {
		return fmt.Errorf("the fake Nodes never became Ready: %w", err)
	}
	return nil
}

// kwokStages are the lifecycles kwok plays: a Node becomes Ready at once, a
// scheduled pod becomes Running and Ready after delay, and a deleted pod goes.
func kwokStages(delay time.Duration) string {
	return fmt.Sprintf(`apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: node-ready}
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ["True"]
  next:
    statusTemplate: |
      conditions:
      - type: Ready
        status: "True"
        reason: KubeletReady
        message: kwok plays this kubelet
        lastHeartbeatTime: {{ Now | Quote }}
        lastTransitionTime: {{ Now | Quote }}
      allocatable: {cpu: "64", memory: 256Gi, pods: "110"}
      capacity: {cpu: "64", memory: 256Gi, pods: "110"}
      nodeInfo: {architecture: amd64, operatingSystem: linux, kubeletVersion: kwok}
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-ready}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: DoesNotExist
    - key: .status.phase
      operator: In
      values: [Pending]
  delay:
    durationMilliseconds: %d
  next:
    statusTemplate: |
      conditions:
      - {type: Initialized, status: "True", lastTransitionTime: {{ Now | Quote }}}
      - {type: ContainersReady, status: "True", lastTransitionTime: {{ Now | Quote }}}
      - {type: Ready, status: "True", lastTransitionTime: {{ Now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        started: true
        restartCount: 0
        state:
          running: {startedAt: {{ Now | Quote }}}
      {{ end }}
      phase: Running
      startTime: {{ Now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-delete}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: Exists
  next:
    delete: true
`, delay.Milliseconds())
}

// Stop ends every process (the last started first) and etcd. Safe to call twice.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	var errs []error
	for i := len(procs) - 1; i >= 0; i-- {
		if err := procs[i].Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.etcd != nil {
		c.etcd.Close()
		c.etcd = nil
	}
	return errors.Join(errs...)
}

// Logs returns the tail of every component's log, for a failing test.
func (c *Cluster) Logs(lines int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for _, p := range c.procs {
		b.WriteString(p.Tail(lines))
		b.WriteString("\n")
	}
	return b.String()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *Cluster) proc(name string) *cluster.Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		if p.Name == name {
			return p
		}
	}
	return nil
}

func (c *Cluster) start(name, bin string, args ...string) (*cluster.Proc, error) {
	p, err := cluster.StartProc(name, filepath.Join(c.dir, "logs", name+".log"), exec.Command(bin, args...))
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}
