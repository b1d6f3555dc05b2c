package leader

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"mizar.dev/pkg/etcd"
)

// TestOneLeaderAtATime: two replicas campaign; only one works at a time, and
// when the leader stops the other takes over.
func TestOneLeaderAtATime(t *testing.T) {
	dir, err := os.MkdirTemp("", "leader-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e, err := etcd.StartEmbedded(etcd.EmbeddedOptions{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	client, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })

	key := "/test/leader/" + t.Name() + time.Now().Format(time.RFC3339Nano)
	var working, overlaps atomic.Int32
	led := make(chan string, 4)
	var wg sync.WaitGroup
	cancels := map[string]context.CancelFunc{}
	for _, id := range []string{"a", "b"} {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[id] = cancel
		wg.Go(func() {
			_ = Run(ctx, Options{Etcd: client, Key: key, Identity: id, LeaseTTL: 2}, func(ctx context.Context) error {
				if working.Add(1) > 1 {
					overlaps.Add(1)
				}
				led <- id
				<-ctx.Done()
				working.Add(-1)
				return nil
			})
		})
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
		wg.Wait()
	}()
	var first string
	select {
	case first = <-led:
	case <-time.After(10 * time.Second):
		t.Fatal("nobody was elected")
	}
	select {
	case id := <-led:
		t.Fatalf("%s leads while %s does", id, first)
	case <-time.After(time.Second):
	}
	cancels[first]()
	select {
	case id := <-led:
		if id == first {
			t.Fatalf("%s led again after it stopped", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the other replica never took over")
	}
	if n := overlaps.Load(); n != 0 {
		t.Errorf("two replicas worked at once %d times", n)
	}
}

func TestRunNeedsEtcdAndKey(t *testing.T) {
	if err := Run(context.Background(), Options{}, func(context.Context) error { return nil }); err == nil {
		t.Error("Run without etcd or key returned no error")
	}
}
