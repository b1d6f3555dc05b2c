package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	v1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
	"mizar.dev/test/integration/fixtures"
)

// clientFor is a clientset for a server (client-go, for storms kubectl is too slow for).
func clientFor(t *testing.T, s *server) versioned.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 1e6, 1e6
	cfg.Timeout = 30 * time.Second
	c, err := versioned.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// acked records the creates a server acknowledged.
type acked struct {
	mu    sync.Mutex
	names map[string][]string // subnet -> endpoint names
	times map[string][]time.Time
}

func (a *acked) add(subnet, name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.names == nil {
		a.names, a.times = map[string][]string{}, map[string][]time.Time{}
	}
	a.names[subnet] = append(a.names[subnet], name)
	a.times[subnet] = append(a.times[subnet], time.Now())
}

// storm starts an endpoint create in the subnets every interval per client, each
// in its own goroutine (open loop: a create stuck on a failing etcd holds up
// only itself), until ctx ends, and records each acknowledged create.
func storm(ctx context.Context, clients []versioned.Interface, ns string, subnets []string, interval time.Duration, a *acked) *sync.WaitGroup {
	var wg sync.WaitGroup
	for ci, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				sn := subnets[i%len(subnets)]
				name := fmt.Sprintf("c%d-%d", ci, i)
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := c.NetworkingV1alpha1().Endpoints(ns).Create(ctx, fixtures.Endpoint(ns, name, sn, ""), metav1.CreateOptions{}); err == nil {
						a.add(sn, name)
					}
				}()
			}
		}()
	}
	return &wg
}

// checkAcked asserts every acknowledged endpoint exists and no address is shared.
func checkAcked(t *testing.T, c versioned.Interface, ns string, a *acked) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := c.NetworkingV1alpha1().Endpoints(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]v1.Endpoint{}
	ips := map[string]string{}
	for _, ep := range list.Items {
		stored[ep.Name] = ep
		key := ep.Spec.Subnet + "/" + ep.Spec.IP
		if other, dup := ips[key]; dup {
			t.Errorf("address %s held by %s and %s", key, other, ep.Name)
		}
		ips[key] = ep.Name
	}
	n := 0
	for _, names := range a.names {
		for _, name := range names {
			n++
			if _, ok := stored[name]; !ok {
				t.Errorf("acknowledged endpoint %s/%s is lost", ns, name)
			}
		}
	}
	return n
}

// TestCrashUnderCreateStorm: kill -9 during a create storm; after the restart
// every acknowledged create is there, no address is shared, and the first
// create of each kind answers at once (nothing waits for a crashed holder).
func TestCrashUnderCreateStorm(t *testing.T) {
	begin(t)
	dir := filepath.Join(t.TempDir(), "crash")
	s, err := startServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.stop() }()
	c := clientFor(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tag := unique("crash")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err = c.NetworkingV1alpha1().Vpcs().Create(ctx, fixtures.Vpc(tag, "10.60.0.0/16", 0), metav1.CreateOptions{})
	must(err)
	subnets := []string{tag + "-a", tag + "-b"}
	for i, sn := range subnets {
		_, err = c.NetworkingV1alpha1().Subnets().Create(ctx, fixtures.Subnet(sn, tag, fmt.Sprintf("10.60.%d.0/22", 4*i)), metav1.CreateOptions{})
		must(err)
	}

	var a acked
	stormCtx, stopStorm := context.WithCancel(ctx)
	wg := storm(stormCtx, []versioned.Interface{c}, "default", subnets, 2*time.Millisecond, &a)
	time.Sleep(1500 * time.Millisecond)
	s.kill()
	stopStorm()
	wg.Wait()

	s, err = startServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	c = clientFor(t, s)
	// The first create of every kind, right after the restart.
	firsts := []struct {
		kind   string
		create func() error
	}{
		{"Endpoint", func() error {
			_, err := c.NetworkingV1alpha1().Endpoints("default").Create(ctx, fixtures.Endpoint("default", tag+"-first", subnets[0], ""), metav1.CreateOptions{})
			return err
		}},
		{"Vpc", func() error {
			_, err := c.NetworkingV1alpha1().Vpcs().Create(ctx, fixtures.Vpc(tag+"-2", "10.61.0.0/16", 0), metav1.CreateOptions{})
			return err
		}},
		{"Subnet", func() error {
			_, err := c.NetworkingV1alpha1().Subnets().Create(ctx, fixtures.Subnet(tag+"-c", tag, "10.60.100.0/24"), metav1.CreateOptions{})
			return err
		}},
		{"Droplet", func() error {
			_, err := c.NetworkingV1alpha1().Droplets().Create(ctx, fixtures.Droplet(tag+"-d", "192.0.2.10"), metav1.CreateOptions{})
			return err
		}},
		{"Divider", func() error {
			_, err := c.NetworkingV1alpha1().Dividers().Create(ctx, fixtures.Divider(tag+"-div", tag, ""), metav1.CreateOptions{})
			return err
		}},
		{"Bouncer", func() error {
			_, err := c.NetworkingV1alpha1().Bouncers().Create(ctx, fixtures.Bouncer(tag+"-bnc", subnets[0], ""), metav1.CreateOptions{})
			return err
		}},
	}
	for _, f := range firsts {
		start := time.Now()
		err := f.create()
		took := time.Since(start)
		if err != nil {
			t.Errorf("first %s create after kill -9: %v", f.kind, err)
		}
		if took > time.Second {
			t.Errorf("first %s create after kill -9 took %v, want < 1s", f.kind, took)
		}
		t.Logf("first %s create after kill -9: %v", f.kind, took.Round(time.Millisecond))
	}
	n := checkAcked(t, c, "default", &a)
	if n == 0 {
		t.Fatal("no create was acknowledged before the kill; the test proves nothing")
	}
	t.Logf("%d creates acknowledged before kill -9, all present after the restart", n)
}

// TestRestartDuring200Creates (issue 7): kill -9 the server while 200 endpoint
// creates run at once; after the restart every acknowledged create is there,
// the rest are retried as a client would, and the 200 endpoints hold 200
// distinct addresses. Deleting them all leaves no claim: the creates cut off
// mid-way are reclaimed by the repair loop (grace and period shortened here).
func TestRestartDuring200Creates(t *testing.T) {
	begin(t)
	dir := filepath.Join(t.TempDir(), "r200")
	flags := []string{"--claim-orphan-grace", "2s", "--claim-repair-period", "500ms"}
	s, err := startServer(dir, flags...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.stop() }()
	c := clientFor(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tag := unique("r200")
	if _, err := c.NetworkingV1alpha1().Vpcs().Create(ctx, fixtures.Vpc(tag, "10.63.0.0/16", 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NetworkingV1alpha1().Subnets().Create(ctx, fixtures.Subnet(tag, tag, "10.63.0.0/23"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	name := func(i int) string { return fmt.Sprintf("%s-%d", tag, i) }
	create := func(c versioned.Interface, i int) error {
		_, err := c.NetworkingV1alpha1().Endpoints("default").Create(ctx, fixtures.Endpoint("default", name(i), tag, ""), metav1.CreateOptions{})
		return err
	}
	var a acked
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if create(c, i) == nil {
				a.add(tag, name(i))
			}
		}()
	}
	close(start)
	time.Sleep(150 * time.Millisecond)
	s.kill()
	wg.Wait()
	t.Logf("%d of 200 creates acknowledged before kill -9", len(a.names[tag]))

	if s, err = startServer(dir, flags...); err != nil {
		t.Fatal(err)
	}
	c = clientFor(t, s)
	if n := checkAcked(t, c, "default", &a); n != len(a.names[tag]) {
		t.Fatalf("checked %d acknowledged creates, want %d", n, len(a.names[tag]))
	}
	// Retry what was not acknowledged; an AlreadyExists means it was stored anyway.
	for i := range 200 {
		if err := create(c, i); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("retrying create %d: %v", i, err)
		}
	}
	list, err := c.NetworkingV1alpha1().Endpoints("default").List(ctx, metav1.ListOptions{FieldSelector: "spec.subnet=" + tag})
	if err != nil {
		t.Fatal(err)
	}
	ips := map[string]bool{}
	for _, ep := range list.Items {
		ips[ep.Spec.IP] = true
	}
	if len(list.Items) != 200 || len(ips) != 200 {
		t.Fatalf("%d endpoints with %d distinct addresses, want 200 and 200", len(list.Items), len(ips))
	}

	// Delete everything; then no claim may remain once the repair loop ran.
	if err := c.NetworkingV1alpha1().Endpoints("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.NetworkingV1alpha1().Subnets().Delete(ctx, tag, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.NetworkingV1alpha1().Vpcs().Delete(ctx, tag, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	etcdc, err := clientv3.New(clientv3.Config{Endpoints: []string{"unix://" + filepath.Join(dir, "etcd", "client.sock")}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer etcdc.Close()
	var left []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		resp, err := etcdc.Get(ctx, "/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		left = left[:0]
		for _, kv := range resp.Kvs {
			if strings.Contains(string(kv.Key), "/claims/") {
				left = append(left, string(kv.Key))
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("claims left 30 s after deleting everything: %v", left)
	}
}
