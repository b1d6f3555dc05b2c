package etcd

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/storage/storagebackend"
)

// TestLockerExcludes runs holders of one key from one Locker (goroutines of one
// server) and from a second Locker (another replica) and checks that at most one
// holds the key at any time.
func TestLockerExcludes(t *testing.T) {
	e, err := StartEmbedded(EmbeddedOptions{Dir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	var lockers []*Locker
	for range 2 {
		c, err := NewClient(storagebackend.TransportConfig{ServerList: e.Endpoints()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		l := NewLocker(c, "/test/locks/")
		t.Cleanup(func() { _ = l.Close() })
		lockers = append(lockers, l)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var holders, maxHolders, entered atomic.Int32
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock, err := lockers[i%2].Lock(ctx, "k")
			if err != nil {
				t.Error(err)
				return
			}
			n := holders.Add(1)
			for m := maxHolders.Load(); n > m && !maxHolders.CompareAndSwap(m, n); m = maxHolders.Load() {
			}
			time.Sleep(2 * time.Millisecond)
			holders.Add(-1)
			entered.Add(1)
			unlock()
		}()
	}
	wg.Wait()
	if entered.Load() != 16 {
		t.Errorf("%d of 16 holders got the lock", entered.Load())
	}
	if m := maxHolders.Load(); m != 1 {
		t.Errorf("%d holders at once, want 1", m)
	}

	// A waiter gives up when its context ends, and leaves no state behind.
	unlock, err := lockers[0].Lock(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	if _, err := lockers[0].Lock(short, "held"); err == nil {
		t.Error("a second holder got a held lock")
	}
	unlock()
	if n := len(lockers[0].local); n != 0 {
		t.Errorf("%d in-process lock entries left after every holder released", n)
	}
}
