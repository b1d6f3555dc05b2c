package apiserver_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/client-go/rest"

	"mizar.dev/pkg/apiserver"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// slowUpdates makes every update of the droplet named hog take delay in storage.
type slowUpdates struct {
	storage.Interface
	hog   string
	delay time.Duration
}

func (s slowUpdates) GuaranteedUpdate(ctx context.Context, key string, dst runtime.Object, ignoreNotFound bool,
	pre *storage.Preconditions, try storage.UpdateFunc, cached runtime.Object) error {
	if strings.HasSuffix(key, "/droplets/"+s.hog) {
		time.Sleep(s.delay)
	}
	return s.Interface.GuaranteedUpdate(ctx, key, dst, ignoreNotFound, pre, try, cached)
}

// classification returns the flow schema and priority level a request of cfg
// to path was served under (the names are the objects' UIDs).
func classification(t *testing.T, cfg *rest.Config, path string) (flowSchema, priorityLevel string) {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(cfg.Host + path)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedFlowSchemaUID), resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedPriorityLevelConfigurationUID)
}

// TestPriorityAndFairness: the standalone server runs API Priority and
// Fairness with mizar's levels from the moment it is ready, and one droplet
// flooding its writes neither turns another droplet away nor holds up an
// admin. Before, standalone ran max-in-flight only: the flood took every
// mutating slot and the other droplet's write got 429.
func TestPriorityAndFairness(t *testing.T) {
	const hogWrites, delay = 30, 2 * time.Second
	hog, victim := "hog-"+rand5(), "victim-"+rand5()
	s := apiservertest.StartWithOptions(t, t.TempDir(), func(o *apiserver.Options) {
		o.WrapStorage = func(_ schema.GroupResource, st storage.Interface) storage.Interface {
			return slowUpdates{Interface: st, hog: hog, delay: delay}
		}
	}, "--max-requests-inflight=20", "--max-mutating-requests-inflight=10")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Classified by mizar's schemas as soon as /readyz passes: nothing is
	// served as catch-all by a server that says it is ready.
	hogCfg, victimCfg := dropletConfig(t, s.DataDir, hog), dropletConfig(t, s.DataDir, victim)
	for _, c := range []struct {
		cfg          *rest.Config
		path, fs, pl string
	}{
		{victimCfg, "/apis/networking.mizar.dev/v1alpha1/droplets", "mizar-node-reads", "mizar-node-reads"},
		{s.Config, "/apis/networking.mizar.dev/v1alpha1/droplets", "exempt", "exempt"},
		{victimCfg, "/readyz", "probes", "exempt"},
	} {
		if fs, pl := classification(t, c.cfg, c.path); fs != c.fs || pl != c.pl {
			t.Errorf("GET %s as %s: flow schema %q, priority level %q; want %q, %q", c.path, c.cfg.Host, fs, pl, c.fs, c.pl)
		}
	}

	hogClient, err := versioned.NewForConfig(hogCfg)
	if err != nil {
		t.Fatal(err)
	}
	victimClient, err := versioned.NewForConfig(victimCfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hogClient.NetworkingV1alpha1().Droplets().Create(ctx, droplet(hog, "192.168.90.1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := victimClient.NetworkingV1alpha1().Droplets().Create(ctx, droplet(victim, "192.168.90.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The hog writes its status hogWrites times at once, each held delay in
	// storage: far more than the 10 mutating slots max-in-flight had.
	patch := []byte(`{"status":{"appliedResourceVersion":"1"}}`)
	began := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var hogErrs []error
	hogDone := make([]time.Duration, 0, hogWrites)
	for range hogWrites {
		wg.Go(func() {
			_, err := hogClient.NetworkingV1alpha1().Droplets().Patch(ctx, hog, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
			mu.Lock()
			defer mu.Unlock()
			hogDone = append(hogDone, time.Since(began))
			if err != nil {
				hogErrs = append(hogErrs, err)
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // the flood is in

	start := time.Now()
	if _, err := s.Client.NetworkingV1alpha1().Droplets().Get(ctx, victim, metav1.GetOptions{}); err != nil {
		t.Errorf("admin read during the flood: %v", err)
	}
	adminTook := time.Since(start)
	start = time.Now()
	_, err = victimClient.NetworkingV1alpha1().Droplets().Patch(ctx, victim, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	victimTook := time.Since(start)
	if apierrors.IsTooManyRequests(err) {
		t.Errorf("droplet %s was turned away while %s flooded: %v", victim, hog, err)
	} else if err != nil {
		t.Errorf("droplet %s's write during the flood: %v", victim, err)
	}
	wg.Wait()
	flood := time.Since(began)
	t.Logf("flood of %d writes x %v: %v; the other droplet's write took %v, an admin read %v", hogWrites, delay, flood, victimTook, adminTook)
	// Fair queuing serves the other droplet at the next free seat, not after
	// the hog's queue: well before the flood ends.
	if victimTook > flood/2 {
		t.Errorf("the other droplet's write took %v, more than half the flood's %v: it waited behind the hog", victimTook, flood)
	}
	if adminTook > flood/4 {
		t.Errorf("an admin read took %v during a %v flood: admins are exempt and must not wait for it", adminTook, flood)
	}
	for _, err := range hogErrs {
		t.Errorf("the hog's own writes are queued, not refused: %v", err)
	}
}

func rand5() string { return fmt.Sprintf("%05d", time.Now().UnixNano()%100000) }
