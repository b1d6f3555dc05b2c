package e2e

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"mizar.dev/pkg/generated/clientset/versioned"
	"mizar.dev/pkg/pki"
	"mizar.dev/test/integration/fixtures"
)

// etcdCluster is a 3-member etcd of real processes (etcd of mizar's go.mod, built
// from test/e2e/etcd): clients over TLS with client certificates, as production
// runs it; a member is killed with SIGKILL, as a crash would.
type etcdCluster struct {
	procs         []*exec.Cmd
	exited        []chan struct{}
	endpoints     []string
	ca, cert, key string
	client        *clientv3.Client // over every endpoint, for Status
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func startEtcdCluster(t *testing.T, dir string) *etcdCluster {
	t.Helper()
	bin := filepath.Join(dir, "etcd")
	if out, err := exec.Command("go", "build", "-o", bin, "mizar.dev/test/e2e/etcd").CombinedOutput(); err != nil {
		t.Fatalf("building etcd: %v\n%s", err, out)
	}
	f := func(name string) string { return filepath.Join(dir, name) }
	ca, err := pki.LoadOrCreateCA(f("ca.crt"), f("ca.key"), "etcd-ca")
	if err != nil {
		t.Fatal(err)
	}
	serving := x509.Certificate{
		Subject:     pkix.Name{CommonName: "etcd"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if err := ca.EnsureCert(f("etcd.crt"), f("etcd.key"), serving); err != nil {
		t.Fatal(err)
	}
	client := x509.Certificate{Subject: pkix.Name{CommonName: "mizar-apiserver"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if err := ca.EnsureCert(f("client.crt"), f("client.key"), client); err != nil {
		t.Fatal(err)
	}
	c := &etcdCluster{ca: f("ca.crt"), cert: f("client.crt"), key: f("client.key")}
	var initial, peers []string
	for i := range 3 {
		peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		initial = append(initial, fmt.Sprintf("m%d=%s", i, peer))
		peers = append(peers, peer)
		c.endpoints = append(c.endpoints, fmt.Sprintf("https://127.0.0.1:%d", freePort(t)))
	}
	for i := range 3 {
		cmd := exec.Command(bin, "--name", fmt.Sprintf("m%d", i), "--data-dir", f(fmt.Sprintf("m%d", i)),
			"--listen-client-urls", c.endpoints[i], "--advertise-client-urls", c.endpoints[i],
			"--listen-peer-urls", peers[i], "--initial-advertise-peer-urls", peers[i],
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--cert-file", f("etcd.crt"), "--key-file", f("etcd.key"), "--trusted-ca-file", f("ca.crt"), "--client-cert-auth",
			"--unsafe-no-fsync", "--log-level", "error")
		dieWithTest(cmd)
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting etcd member %d: %v", i, err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		c.procs, c.exited = append(c.procs, cmd), append(c.exited, exited)
	}
	t.Cleanup(func() {
		for i, p := range c.procs {
			_ = p.Process.Kill()
			<-c.exited[i]
		}
	})
	tlsCfg, err := (transport.TLSInfo{CertFile: c.cert, KeyFile: c.key, TrustedCAFile: c.ca}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c.client, err = clientv3.New(clientv3.Config{Endpoints: c.endpoints, TLS: tlsCfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.client.Close() })
	deadline := time.Now().Add(time.Minute)
	for c.leader(-1) < 0 {
		if time.Now().After(deadline) {
			t.Fatal("the etcd cluster elected no leader within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return c
}

// leader returns the index of the member all live members (all but dead) report
// as leader, or -1.
func (c *etcdCluster) leader(dead int) int {
	lead := -1
	for i, ep := range c.endpoints {
		if i == dead {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := c.client.Status(ctx, ep)
		cancel()
		if err != nil || st.Leader == 0 {
			return -1
		}
		l := -1
		for j, ep := range c.endpoints {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			o, err := c.client.Status(ctx, ep)
			cancel()
			if j != dead && err == nil && o.Header.MemberId == st.Leader {
				l = j
			}
		}
		if l < 0 || (lead >= 0 && l != lead) {
			return -1
		}
		lead = l
	}
	return lead
}

// kill ends member i with SIGKILL.
func (c *etcdCluster) kill(i int) {
	_ = c.procs[i].Process.Kill()
	<-c.exited[i]
}

func (c *etcdCluster) flags() []string {
	return []string{"--etcd-servers", strings.Join(c.endpoints, ","),
		"--etcd-cafile", c.ca, "--etcd-certfile", c.cert, "--etcd-keyfile", c.key}
}

// TestEtcdLeaderLossUnderCreateStorm: two mizar-apiserver replicas on a 3-member
// etcd over TLS; the etcd leader is killed during a create storm through both.
// No subnet's creates stop for longer than the election takes (plus a client's
// retry after 1 s), every acknowledged create is kept, and no address is shared.
func TestEtcdLeaderLossUnderCreateStorm(t *testing.T) {
	begin(t)
	dir := t.TempDir()
	cluster := startEtcdCluster(t, filepath.Join(dir, "etcd"))
	var clients []versioned.Interface
	for i := range 2 {
		s, err := startServer(filepath.Join(dir, fmt.Sprintf("replica-%d", i)), cluster.flags()...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.stop() })
		clients = append(clients, clientFor(t, s))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tag := unique("leader")
	if _, err := clients[0].NetworkingV1alpha1().Vpcs().Create(ctx, fixtures.Vpc(tag, "10.62.0.0/16", 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	subnets := []string{tag + "-a", tag + "-b"}
	for i, sn := range subnets {
		if _, err := clients[1].NetworkingV1alpha1().Subnets().Create(ctx, fixtures.Subnet(sn, tag, fmt.Sprintf("10.62.%d.0/22", 4*i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	var a acked
	stormCtx, stopStorm := context.WithCancel(ctx)
	started := time.Now()
	wg := storm(stormCtx, clients, "default", subnets, 5*time.Millisecond, &a)
	time.Sleep(2 * time.Second)

	old := -1
	for deadline := time.Now().Add(10 * time.Second); old < 0 && time.Now().Before(deadline); {
		old = cluster.leader(-1)
	}
	if old < 0 {
		t.Fatal("the etcd cluster has no leader")
	}
	killed := time.Now()
	cluster.kill(old)
	var elected time.Duration
	for cluster.leader(old) < 0 {
		if time.Since(killed) > 30*time.Second {
			t.Fatal("no new etcd leader within 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	elected = time.Since(killed)
	time.Sleep(5 * time.Second)
	stopStorm()
	wg.Wait()

	// The longest pause in each subnet's acknowledged creates.
	allowed := elected + 2*time.Second
	for _, sn := range subnets {
		times := a.times[sn]
		var longest time.Duration
		last := started
		for _, at := range times {
			if gap := at.Sub(last); gap > longest {
				longest = gap
			}
			last = at
		}
		if last.Before(killed) {
			t.Errorf("subnet %s: no create acknowledged after the leader was killed", sn)
		}
		t.Logf("subnet %s: %d creates, longest pause %v (election took %v)", sn, len(times), longest.Round(time.Millisecond), elected.Round(time.Millisecond))
		if longest > allowed {
			t.Errorf("subnet %s: creates stopped for %v, longer than the election (%v) + 2 s", sn, longest, elected)
		}
	}
	n := checkAcked(t, clients[1], "default", &a)
	t.Logf("%d creates acknowledged through two replicas, all present", n)
}

// TestEtcdQuorumLossAnswers503: with two of three etcd members gone, creates
// and consistent reads are answered 503 with Retry-After within a bounded time
// (the server's --etcd-leader-wait plus etcd's noticing the lost leader),
// instead of hanging until the request timeout or answering 500 with gRPC's
// text.
func TestEtcdQuorumLossAnswers503(t *testing.T) {
	dir := t.TempDir()
	cluster := startEtcdCluster(t, filepath.Join(dir, "etcd"))
	s, err := startServer(filepath.Join(dir, "replica"), append(cluster.flags(), "--etcd-leader-wait=3s")...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.stop() })
	t.Cleanup(func() {
		if t.Failed() {
			out := s.output()
			t.Logf("mizar-apiserver output (last 8 KB):\n%s", out[max(0, len(out)-8192):])
		}
	})
	cfg, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 1e6, 1e6
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tag := unique("quorum")
	create := func(i int) (*http.Response, string, time.Duration) {
		t.Helper()
		body := fmt.Sprintf(`{"apiVersion":"networking.mizar.dev/v1alpha1","kind":"Vpc","metadata":{"name":"%s-%d"},"spec":{"cidr":"10.%d.0.0/16"}}`, tag, i, 100+i)
		req, err := http.NewRequest(http.MethodPost, cfg.Host+"/apis/networking.mizar.dev/v1alpha1/vpcs", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("create %d: %v after %v", i, err, time.Since(start))
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return resp, string(b), time.Since(start)
	}
	if resp, body, _ := create(0); resp.StatusCode != http.StatusCreated {
		t.Fatalf("create with quorum: %s %s", resp.Status, body)
	}

	// Quorum lost: two members killed.
	lead := cluster.leader(-1)
	if lead < 0 {
		t.Fatal("the etcd cluster has no leader")
	}
	logFrom, lossBegan := s.log.Len(), time.Now()
	cluster.kill(lead)
	cluster.kill((lead + 1) % 3)
	// Within: the leader wait, etcd's election timeout to notice, slack for a busy machine.
	const bound = 20 * time.Second
	for i := 1; i <= 3; i++ {
		resp, body, took := create(i)
		t.Logf("create %d without quorum: %s in %v (Retry-After %q)", i, resp.Status, took.Round(time.Millisecond), resp.Header.Get("Retry-After"))
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Errorf("create %d without quorum: %s, Retry-After %q; want 503 with Retry-After: %s", i, resp.Status, resp.Header.Get("Retry-After"), body)
		}
		if took > bound {
			t.Errorf("create %d without quorum took %v, want an answer within %v", i, took, bound)
		}
	}
	start := time.Now()
	resp, err := hc.Get(cfg.Host + "/apis/networking.mizar.dev/v1alpha1/vpcs/" + tag + "-0")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	took := time.Since(start)
	t.Logf("consistent read without quorum: %s in %v", resp.Status, took.Round(time.Millisecond))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("consistent read without quorum: %s, Retry-After %q; want 503 with Retry-After", resp.Status, resp.Header.Get("Retry-After"))
	}
	if took > bound {
		t.Errorf("consistent read without quorum took %v, want an answer within %v", took, bound)
	}
	// The log during the loss, for the record: k8s.io/apiserver's etcd client
	// logs each retry of a read (its level cannot be set from outside), and
	// its watch cache's etcd watches log each "no leader" they restart on.
	out := s.log.From(logFrom)
	t.Logf("server log during %v without quorum: %d lines; %d etcd client retries, %d watch restarts",
		time.Since(lossBegan).Round(time.Second), strings.Count(out, "\n"), strings.Count(out, "retrying of unary invoker failed"),
		strings.Count(out, "watch chan error"))
	// The watch caches' restarts are paced (pacedWatches): before, each
	// restarted its etcd watch at once for 30 s, about 2,500 times a second in all.
	if n := strings.Count(out, "watch chan error"); n > 2000 {
		t.Errorf("%d watch restarts logged during the loss: the watch caches restart their etcd watches without pause", n)
	}
}
