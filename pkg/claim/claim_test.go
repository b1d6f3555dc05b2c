package claim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/storage/storagebackend"

	"mizar.dev/pkg/etcd"
)

// newStores starts a real etcd and returns n stores on it, as n server replicas
// would have, each under a prefix unique to the test.
func newStores(t testing.TB, n int) []*Store {
	t.Helper()
	dir, err := os.MkdirTemp("", "claim")
	if err != nil {
		t.Fatal(err)
	}
	e, err := etcd.StartEmbedded(etcd.EmbeddedOptions{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(); os.RemoveAll(dir) })
	prefix := fmt.Sprintf("/test/%s/%d/", t.Name(), time.Now().UnixNano())
	stores := make([]*Store, n)
	for i := range stores {
		c, err := etcd.NewClient(storagebackend.TransportConfig{ServerList: e.Endpoints()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		stores[i] = NewStore(c, prefix)
	}
	return stores
}

func owner(name string) Owner { return Owner{Resource: "things", Name: name, UID: "uid-" + name} }

var small = Range{
	Prefix:   "n/",
	Space:    "1-8",
	Lo:       1,
	Hi:       8,
	Reserved: []uint32{1},
	Format:   func(v uint32) string { return strconv.Itoa(int(v)) },
	Parse: func(s string) (uint32, bool) {
		v, err := strconv.Atoi(s)
		return uint32(v), err == nil
	},
}

func TestClaimIsAllOrNothing(t *testing.T) {
	s := newStores(t, 1)[0]
	ctx := context.Background()
	if h, err := s.Claim(ctx, owner("a"), "x/1", "x/2"); err != nil || len(h) != 0 {
		t.Fatalf("first claim: holders %v, err %v", h, err)
	}
	h, err := s.Claim(ctx, owner("b"), "x/2", "x/3")
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 1 || h[0].Key != "x/2" || h[0].Name != "a" {
		t.Fatalf("holders = %+v, want x/2 held by a", h)
	}
	if got, _ := s.Get(ctx, "x/3"); got != nil {
		t.Errorf("x/3 was written by a claim that failed: %+v", got)
	}
	// The same owner claiming again (a retried create) succeeds.
	if h, err := s.Claim(ctx, owner("a"), "x/2", "x/4"); err != nil || len(h) != 0 {
		t.Fatalf("retried claim: holders %v, err %v", h, err)
	}
	if got, _ := s.Get(ctx, "x/4"); got == nil || got.UID != "uid-a" {
		t.Errorf("x/4 = %+v, want held by a", got)
	}
}

func TestReleaseOnlyDropsOwnClaims(t *testing.T) {
	s := newStores(t, 1)[0]
	ctx := context.Background()
	mustClaim(t, s, owner("a"), "r/1")
	if err := s.Release(ctx, "uid-b", "r/1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(ctx, "r/1"); got == nil {
		t.Fatal("b released a's claim")
	}
	if err := s.Release(ctx, "uid-a", "r/1", "r/absent"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(ctx, "r/1"); got != nil {
		t.Fatalf("a's claim survived its release: %+v", got)
	}
}

func TestAllocateLowestFreeUntilExhausted(t *testing.T) {
	s := newStores(t, 1)[0]
	ctx := context.Background()
	var got []uint32
	for i := 0; ; i++ {
		v, h, err := allocate(ctx, s, small, owner(fmt.Sprint(i)))
		if errors.Is(err, ErrExhausted) {
			break
		}
		if err != nil || len(h) != 0 {
			t.Fatalf("allocation %d: %v %v", i, h, err)
		}
		got = append(got, v)
	}
	if fmt.Sprint(got) != "[2 3 4 5 6 7 8]" {
		t.Fatalf("allocated %v, want 2..8 (1 is reserved)", got)
	}
	if err := s.Release(ctx, "uid-2", "n/4"); err != nil {
		t.Fatal(err)
	}
	if v, _, err := allocate(ctx, s, small, owner("again")); err != nil || v != 4 {
		t.Fatalf("after releasing 4: got %d, %v", v, err)
	}
}

func TestAllocateWithExtraKeyHeldClaimsNothing(t *testing.T) {
	s := newStores(t, 1)[0]
	ctx := context.Background()
	mustClaim(t, s, owner("mac-holder"), "mac/aa")
	v, h, err := allocate(ctx, s, small, owner("b"), "mac/aa")
	if err != nil || len(h) != 1 || h[0].Name != "mac-holder" {
		t.Fatalf("got %d %+v %v, want the holder of mac/aa", v, h, err)
	}
	if v, _, err := allocate(ctx, s, small, owner("c")); err != nil || v != 2 {
		t.Fatalf("the value tried with a taken extra key was not freed: got %d, %v", v, err)
	}
}

// Two replicas allocating from one range at once never hand out a value twice,
// and together they use the whole range.
func TestAllocateAcrossReplicas(t *testing.T) {
	stores := newStores(t, 2)
	ctx := context.Background()
	r := small
	r.Hi, r.Reserved = 200, nil
	var mu sync.Mutex
	seen := map[uint32]string{}
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := owner(strconv.Itoa(i))
			v, _, err := allocate(ctx, stores[i%2], r, o)
			if err != nil {
				t.Errorf("allocation %d: %v", i, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if prev, dup := seen[v]; dup {
				t.Errorf("value %d handed to %s and %s", v, prev, o.Name)
			}
			seen[v] = o.Name
		}()
	}
	wg.Wait()
	if len(seen) != 200 {
		t.Errorf("%d distinct values, want 200", len(seen))
	}
	if _, _, err := allocate(ctx, stores[0], r, owner("extra")); !errors.Is(err, ErrExhausted) {
		t.Errorf("201st allocation: %v, want ErrExhausted", err)
	}
}

// A value another replica released is found once the index looks full.
func TestAllocateFindsValuesReleasedElsewhere(t *testing.T) {
	stores := newStores(t, 2)
	ctx := context.Background()
	for i := range 7 {
		if _, _, err := allocate(ctx, stores[0], small, owner(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := stores[1].Release(ctx, "uid-3", "n/5"); err != nil {
		t.Fatal(err)
	}
	if v, _, err := allocate(ctx, stores[0], small, owner("late")); err != nil || v != 5 {
		t.Fatalf("got %d, %v; want 5, released by the other replica", v, err)
	}
}

func TestTakeAndDropAreGuardedByRevision(t *testing.T) {
	s := newStores(t, 1)[0]
	ctx := context.Background()
	mustClaim(t, s, owner("old"), "t/1")
	h, _ := s.Get(ctx, "t/1")
	if ok, err := s.Take(ctx, *h, owner("new")); err != nil || !ok {
		t.Fatalf("take: %v %v", ok, err)
	}
	// h is stale now: neither a second take nor a drop through it may succeed.
	if ok, _ := s.Take(ctx, *h, owner("third")); ok {
		t.Fatal("a stale holder took the claim")
	}
	if err := s.Drop(ctx, *h); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(ctx, "t/1"); got == nil || got.Name != "new" {
		t.Fatalf("claim = %+v, want held by new", got)
	}
}

// allocate claims the lowest free value of r (Next) for owner, together with
// the extra keys, in one transaction of its own, as the registry's creates use
// the index: a value another replica claimed meanwhile is skipped, one tried
// with a taken extra key is given back (Unused).
//
// When an extra key is held by someone else, nothing is claimed and its holders
// are returned.
func allocate(ctx context.Context, s *Store, r Range, owner Owner, extra ...string) (uint32, []Holder, error) {
	for {
		v, err := s.Next(ctx, r)
		if err != nil {
			return 0, nil, err
		}
		key := r.Prefix + r.Format(v)
		holders, err := s.Claim(ctx, owner, append([]string{key}, extra...)...)
		if err != nil {
			// The outcome is unknown: keep v marked; Repair frees it if it was not written.
			return 0, nil, err
		}
		if len(holders) == 0 {
			return v, nil, nil
		}
		valueTaken := false
		var others []Holder
		for _, h := range holders {
			if h.Key == key {
				valueTaken = true // another replica's: stays marked
			} else {
				others = append(others, h)
			}
		}
		if len(others) > 0 {
			if !valueTaken {
				s.Unused(key)
			}
			return 0, others, nil
		}
	}
}

func mustClaim(t *testing.T, s *Store, o Owner, keys ...string) {
	t.Helper()
	if h, err := s.Claim(context.Background(), o, keys...); err != nil || len(h) != 0 {
		t.Fatalf("claiming %v for %s: holders %v, err %v", keys, o.Name, h, err)
	}
}

// BenchmarkAllocate allocates alternately from a range holding 100 values and
// one holding 10,000, on one etcd, timing each: the index makes a fuller range
// cost the same. It reports both and their ratio.
func BenchmarkAllocate(b *testing.B) {
	s := newStores(b, 1)[0]
	ctx := context.Background()
	ranges := make([]Range, 2)
	for i, used := range []int{100, 10000} {
		r := small
		r.Prefix, r.Space, r.Hi, r.Reserved = fmt.Sprintf("r%d/", i), "big", 1<<20, nil
		for j := range used {
			if _, _, err := allocate(ctx, s, r, owner(fmt.Sprintf("fill-%d-%d", i, j))); err != nil {
				b.Fatal(err)
			}
		}
		ranges[i] = r
	}
	var took [2]time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		k := i % 2
		start := time.Now()
		if _, _, err := allocate(ctx, s, ranges[k], owner("bench-"+strconv.Itoa(i))); err != nil {
			b.Fatal(err)
		}
		took[k] += time.Since(start)
	}
	n := float64(b.N) / 2
	b.ReportMetric(float64(took[0].Nanoseconds())/n, "ns/alloc@100")
	b.ReportMetric(float64(took[1].Nanoseconds())/n, "ns/alloc@10000")
	b.ReportMetric(float64(took[1])/float64(took[0]), "@10000/@100")
}

// BenchmarkIndex is the in-memory index alone: finding the lowest free value
// in a range with 100 and with 10,000 values used.
func BenchmarkIndex(b *testing.B) {
	for _, used := range []int{100, 10000} {
		b.Run(fmt.Sprintf("used=%d", used), func(b *testing.B) {
			r := small
			r.Hi, r.Reserved = 1<<20, nil
			p := &pool{r: r, loaded: true, words: map[uint32]uint64{}}
			for v := range used {
				p.mark(uint32(v) + 1)
			}
			for b.Loop() {
				v, ok, _ := p.next(context.Background(), nil)
				if !ok {
					b.Fatal("range exhausted")
				}
				p.free(v)
			}
		})
	}
}

// TestNextFromLooksAboveStart: NextFrom takes the lowest free value at or
// above its start, across index words, and wraps to the lowest free one
// below it once nothing above is free.
func TestNextFromLooksAboveStart(t *testing.T) {
	s := newStores(t, 1)[0]
	ctx := context.Background()
	wide := Range{Prefix: "w/", Lo: 0, Hi: 199, Format: func(v uint32) string { return fmt.Sprint(v) },
		Parse: func(str string) (uint32, bool) {
			var v uint32
			_, err := fmt.Sscan(str, &v)
			return v, err == nil
		}}
	var got []uint32
	for _, start := range []uint32{70, 70, 63, 199, 199, 0} {
		v, err := s.NextFrom(ctx, wide, start)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, v)
	}
	// 199 is taken by the fourth call: the fifth wraps to the lowest free value.
	if fmt.Sprint(got) != "[70 71 63 199 0 1]" {
		t.Fatalf("NextFrom gave %v, want [70 71 63 199 0 1]", got)
	}
	if v, err := s.Next(ctx, wide); err != nil || v != 2 {
		t.Fatalf("Next after NextFrom: %d, %v; want 2", v, err)
	}
}
