package etcd

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/storage/storagebackend"
)

// startLockers starts an etcd and n Lockers on it, each with its own client as
// separate server replicas would have.
func startLockers(t *testing.T, n int) []*Locker {
	t.Helper()
	e, err := StartEmbedded(EmbeddedOptions{Dir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	var lockers []*Locker
	for range n {
		c, err := NewClient(storagebackend.TransportConfig{ServerList: e.Endpoints()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		l := NewLocker(c, "/test/locks/")
		t.Cleanup(func() { _ = l.Close() })
		lockers = append(lockers, l)
	}
	return lockers
}

// TestLockerExcludes runs holders of one key from one Locker (goroutines of one
// server) and from a second Locker (another replica) and checks that at most one
// holds the key at any time.
func TestLockerExcludes(t *testing.T) {
	lockers := startLockers(t, 2)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var holders, maxHolders, entered atomic.Int32
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, unlock, err := lockers[i%2].Lock(ctx, "k")
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
			unlock("")
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
	_, unlock, err := lockers[0].Lock(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	if _, _, err := lockers[0].Lock(short, "held"); err == nil {
		t.Error("a second holder got a held lock")
	}
	unlock("")
	if n := len(lockers[0].local); n != 0 {
		t.Errorf("%d in-process lock entries left after every holder released", n)
	}
}

// TestLockerHandoff: each holder sees what the previous one left; "" keeps it;
// a holder that dies before releasing leaves nothing the next can trust.
func TestLockerHandoff(t *testing.T) {
	lockers := startLockers(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	step := func(l *Locker, next string) string {
		t.Helper()
		got, unlock, err := l.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		unlock(next)
		return got
	}
	if got := step(lockers[0], "10"); got != "" {
		t.Errorf("first holder got handoff %q, want none", got)
	}
	if got := step(lockers[1], ""); got != "10" {
		t.Errorf("second holder (other replica) got %q, want 10", got)
	}
	if got := step(lockers[0], "11"); got != "10" {
		t.Errorf("after an empty release got %q, want the kept 10", got)
	}
	for i := 12; i < 15; i++ {
		if got, want := step(lockers[i%2], fmt.Sprint(i)), fmt.Sprint(i-1); got != want {
			t.Errorf("holder %d got %q, want %q", i, got, want)
		}
	}

	// A replica that crashes while holding the key: its session ends, the lock
	// frees, and the next holder is told nothing rather than a stale value.
	if _, _, err := lockers[0].Lock(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := lockers[0].Close(); err != nil {
		t.Fatal(err)
	}
	if got := step(lockers[1], "20"); got != "" {
		t.Errorf("after a holder died mid-create got %q, want none", got)
	}
	if got := step(lockers[1], ""); got != "20" {
		t.Errorf("got %q, want 20", got)
	}
}
