package nodeagent

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apiserver/apiservertest"
)

// cutAfterOne passes one event of a real watch through, then ends the stream as
// a dropped connection would.
type cutAfterOne struct {
	watch.Interface
	out chan watch.Event
}

func (c *cutAfterOne) ResultChan() <-chan watch.Event { return c.out }

// The stream resumes from the last resourceVersion after a disconnect and, when
// that is too old (410), lists again and drops what vanished meanwhile.
func TestStreamResumesAndRelists(t *testing.T) {
	srv := apiservertest.Start(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := srv.Client.NetworkingV1alpha1().Droplets()
	node := "node-" + utilrand.String(5)
	n := 0
	mk := func(name string) *v1alpha1.Droplet {
		n++ // droplets' underlay IPs are unique
		d, err := c.Create(ctx, &v1alpha1.Droplet{ObjectMeta: metav1.ObjectMeta{Name: node + "-" + name},
			Spec: v1alpha1.DropletSpec{Node: node, IP: fmt.Sprintf("192.168.0.%d", n), MAC: "02:00:00:00:00:01", Interface: "eth0"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d1 := mk("a")

	var mu sync.Mutex
	have := map[string]bool{}
	var watchRVs []string
	expired := make(chan struct{})
	var calls atomic.Int32
	s := &stream[*v1alpha1.Droplet]{
		name: "test", selector: "spec.node=" + node,
		list: lister(c.List, func(l *v1alpha1.DropletList) []v1alpha1.Droplet { return l.Items }),
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			mu.Lock()
			watchRVs = append(watchRVs, o.ResourceVersion)
			mu.Unlock()
			switch calls.Add(1) {
			case 1:
				w, err := c.Watch(ctx, o)
				if err != nil {
					return nil, err
				}
				cut := &cutAfterOne{Interface: w, out: make(chan watch.Event)}
				go func() {
					defer close(cut.out)
					cut.out <- <-w.ResultChan()
					w.Stop()
				}()
				return cut, nil
			case 2:
				<-expired // the test changes things while the agent is away
				return nil, apierrors.NewResourceExpired("too old resource version")
			}
			return c.Watch(ctx, o)
		},
		set: func(d *v1alpha1.Droplet) error {
			mu.Lock()
			defer mu.Unlock()
			have[d.Name] = true
			return nil
		},
		del: func(key string) error {
			mu.Lock()
			defer mu.Unlock()
			delete(have, key)
			return nil
		},
		synced: func(context.Context, string) error { return nil },
		events: &atomic.Int64{},
	}
	go s.run(ctx)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			return cond(), nil
		}); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
	}
	waitFor("the initial list", func() bool { return have[d1.Name] })
	d2 := mk("b")
	waitFor("the resumed watch", func() bool { return have[d2.Name] && len(watchRVs) == 2 })
	mu.Lock()
	if watchRVs[1] != d2.ResourceVersion {
		t.Errorf("after the disconnect the watch resumed from %q, want the last seen %q", watchRVs[1], d2.ResourceVersion)
	}
	mu.Unlock()
	if err := c.Delete(ctx, d1.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	close(expired)
	waitFor("the relist to drop the deleted droplet", func() bool { return !have[d1.Name] && have[d2.Name] })
	d3 := mk("c")
	waitFor("events after the relist", func() bool { return have[d3.Name] && len(watchRVs) >= 3 })
}

// A burst of applied events that somebody awaits is acknowledged with a few
// writes, not one per event, and the last one covers the whole burst; events
// nobody awaits are acknowledged by no write at all.
func TestStreamCoalescesAcknowledgements(t *testing.T) {
	srv := apiservertest.Start(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := srv.Client.NetworkingV1alpha1().Droplets()
	node := "node-" + utilrand.String(5)
	const interval = 200 * time.Millisecond

	var mu sync.Mutex
	var acks []string // resourceVersions reported, in order
	applied := map[string]string{}
	s := &stream[*v1alpha1.Droplet]{
		name: "test", selector: "spec.node=" + node,
		list:  lister(c.List, func(l *v1alpha1.DropletList) []v1alpha1.Droplet { return l.Items }),
		watch: c.Watch,
		set: func(d *v1alpha1.Droplet) error {
			mu.Lock()
			defer mu.Unlock()
			applied[d.Name] = d.ResourceVersion
			return nil
		},
		del: func(string) error { return nil },
		synced: func(_ context.Context, rv string) error {
			mu.Lock()
			defer mu.Unlock()
			acks = append(acks, rv)
			return nil
		},
		awaited:     func(d *v1alpha1.Droplet) bool { return d.Labels["awaited"] == "yes" },
		ackInterval: interval,
		events:      &atomic.Int64{},
	}
	go s.run(ctx)
	state := func() (int, map[string]string) {
		mu.Lock()
		defer mu.Unlock()
		return len(acks), maps.Clone(applied)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return cond(), nil
		}); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
	}
	waitFor("the initial list's acknowledgement", func() bool { n, _ := state(); return n == 1 })

	create := func(first, n int, awaited string) (lastRV uint64) {
		var wg sync.WaitGroup
		var lmu sync.Mutex
		for k := range 8 {
			wg.Go(func() {
				for i := first + k; i < first+n; i += 8 {
					d, err := c.Create(ctx, &v1alpha1.Droplet{
						ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", node, i), Labels: map[string]string{"awaited": awaited}},
						Spec:       v1alpha1.DropletSpec{Node: node, IP: fmt.Sprintf("10.9.%d.%d", i/250, i%250+1), MAC: "02:00:00:00:00:01", Interface: "eth0"},
					}, metav1.CreateOptions{})
					if err != nil {
						t.Error(err)
						return
					}
					rv, _ := strconv.ParseUint(d.ResourceVersion, 10, 64)
					lmu.Lock()
					lastRV = max(lastRV, rv)
					lmu.Unlock()
				}
			})
		}
		wg.Wait()
		return lastRV
	}

	const burst = 200
	start := time.Now()
	last := create(0, burst, "yes")
	waitFor("the burst acknowledged", func() bool {
		mu.Lock()
		defer mu.Unlock()
		rv, _ := strconv.ParseUint(acks[len(acks)-1], 10, 64)
		return rv >= last
	})
	elapsed := time.Since(start)
	n, _ := state()
	writes := n - 1
	// At most one write per interval, plus the leading one after the quiet spell.
	if limit := int(elapsed/interval) + 2; writes > limit || writes >= burst/2 {
		t.Errorf("%d applied events took %d acknowledgements in %v; want at most %d (one per %v) and far fewer than the events", burst, writes, elapsed, limit, interval)
	}
	t.Logf("%d awaited events in %v: %d acknowledgements", burst, elapsed.Round(time.Millisecond), writes)

	// Versions nobody awaits are applied but cost no write.
	create(burst, 50, "no")
	waitFor("the unawaited versions applied", func() bool { _, a := state(); return len(a) == burst+50 })
	time.Sleep(3 * interval)
	if m, _ := state(); m != n {
		t.Errorf("versions nobody awaits were acknowledged: %d writes after the burst, want none", m-n)
	}
}
