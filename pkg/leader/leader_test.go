package leader

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// TestRestartAfterACrashTakesOverAtOnce: a process of this replica that died
// while leading left its lease in the lease file; the restarted process
// revokes it and leads at once, not after the lease's TTL. A lease file
// locked by a live process is left alone.
func TestRestartAfterACrashTakesOverAtOnce(t *testing.T) {
	dir := t.TempDir()
	e, err := etcd.StartEmbedded(etcd.EmbeddedOptions{Dir: dir + "/etcd", UnsafeNoFsync: true})
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
	leaseFile := dir + "/lease"

	// The "crashed" process: leads under a 30 s lease it never revokes.
	dead, err := client.Grant(context.Background(), 30)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Put(context.Background(), key+"/dead", "dead-process", clientv3.WithLease(dead.ID)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(leaseFile, []byte(fmt.Sprintf("%x\n", int64(dead.ID))), 0o600); err != nil {
		t.Fatal(err)
	}

	// A live process holds the file: its lease is not touched.
	holder, _ := os.OpenFile(leaseFile, os.O_RDWR, 0)
	if err := syscall.Flock(int(holder.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if f := takeOverDeadLease(context.Background(), Options{Etcd: client, Name: "t", LeaseFile: leaseFile}); f != nil {
		t.Fatal("took a lease file another process holds")
	}
	if ttl, err := client.TimeToLive(context.Background(), dead.ID); err != nil || ttl.TTL <= 0 {
		t.Fatalf("the live process's lease was revoked: %v %v", ttl, err)
	}
	holder.Close()

	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	elected := make(chan time.Duration, 1)
	go func() {
		_ = Run(ctx, Options{Etcd: client, Key: key, Identity: "restarted", LeaseTTL: 30, LeaseFile: leaseFile}, func(ctx context.Context) error {
			elected <- time.Since(start)
			<-ctx.Done()
			return nil
		})
	}()
	select {
	case d := <-elected:
		if d > 5*time.Second {
			t.Errorf("elected after %v", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the restarted process waited for the dead process's 30 s lease")
	}
	b, _ := os.ReadFile(leaseFile)
	if strings.TrimSpace(string(b)) == fmt.Sprintf("%x", int64(dead.ID)) || strings.TrimSpace(string(b)) == "" {
		t.Errorf("the lease file holds %q, not the new lease", b)
	}
}
