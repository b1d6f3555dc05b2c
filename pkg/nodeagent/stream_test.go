package nodeagent

import (
	"context"
	"fmt"
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
		list: func(ctx context.Context, o metav1.ListOptions) ([]*v1alpha1.Droplet, string, error) {
			l, err := c.List(ctx, o)
			if err != nil {
				return nil, "", err
			}
			return ptrs(l.Items), l.ResourceVersion, nil
		},
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
