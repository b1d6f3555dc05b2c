package storage

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/storage/etcd3/testserver"

	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/test/integration/fixtures"
)

// TestStaleReplicaCreatesFast: a replica idle while another allocated the
// issue's 10,000 VNIs creates its next VPC in under 100 ms, as fast as a fresh
// one: its allocation index follows every replica's claims (a watch on the
// claims prefix). Before, it tried each value the other took (one refused etcd
// transaction apiece): 8.3 s after 2,000 values, the 60 s request timeout
// near 14,000.
func TestStaleReplicaCreatesFast(t *testing.T) {
	const n = 10000
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cfg := testserver.NewTestConfig(t)
	endpoint := cfg.ListenClientUrls[0].String()
	testserver.RunEtcd(t, cfg)
	dir := t.TempDir()
	a := apiservertest.Start(t, filepath.Join(dir, "a"), "--etcd-servers", endpoint)
	b := apiservertest.Start(t, filepath.Join(dir, "b"), "--etcd-servers", endpoint)

	// b allocates once, so its index of VNIs is loaded, then idles.
	if _, err := b.Client.NetworkingV1alpha1().Vpcs().Create(ctx, fixtures.Vpc("stale-first", "10.1.0.0/16", 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	work := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range work {
				_, err := a.Client.NetworkingV1alpha1().Vpcs().Create(ctx, fixtures.Vpc(fmt.Sprintf("busy-%d", i), "10.2.0.0/16", 0), metav1.CreateOptions{})
				if err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("creates on the busy replica: %v", err)
	}
	t.Logf("the busy replica allocated %d VNIs in %v", n, time.Since(start))
	time.Sleep(time.Second) // the watch delivers; a stale index would not improve with time

	start = time.Now()
	vpc, err := b.Client.NetworkingV1alpha1().Vpcs().Create(ctx, fixtures.Vpc("stale-next", "10.3.0.0/16", 0), metav1.CreateOptions{})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the idle replica's next create took %v (VNI %d)", took, vpc.Spec.VNI)
	if took > 100*time.Millisecond {
		t.Errorf("the idle replica's next create took %v after the other allocated %d values, want < 100ms", took, n)
	}
}
