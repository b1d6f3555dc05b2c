package dataplane

import (
	"context"
	"sync"
	"testing"
	"time"
)

// dropEvents collects what ReadDropEvents reports while a test runs.
type dropEvents struct {
	mu  sync.Mutex
	evs []DropEvent
}

func collectDropEvents(tb testing.TB, d *Datapath) *dropEvents {
	tb.Helper()
	c := &dropEvents{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- d.ReadDropEvents(ctx, func(e DropEvent) {
			c.mu.Lock()
			c.evs = append(c.evs, e)
			c.mu.Unlock()
		})
	}()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("ReadDropEvents: %v", err)
		}
	})
	return c
}

// wait returns the events once there are at least n (or after 2 s).
func (c *dropEvents) wait(n int) []DropEvent {
	deadline := time.Now().Add(2 * time.Second)
	for {
		c.mu.Lock()
		evs := append([]DropEvent(nil), c.evs...)
		c.mu.Unlock()
		if len(evs) >= n || time.Now().After(deadline) {
			return evs
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// nextJiffy sleeps into a fresh budget window (a jiffy is at most 10 ms).
func nextJiffy() { time.Sleep(11 * time.Millisecond) }

func TestDropEventsNameReasonAndAddresses(t *testing.T) {
	d := fixture(t)
	evs := collectDropEvents(t, d)

	// Underlay: Geneve from droplet A for a VNI this host does not know.
	nextJiffy()
	expectVerdict(t, d.UnderlayProgram(), fromA(unknownVNI).geneve(t, podPacket("10.1.1.10").frame(t)), xdpDrop, nil)
	// Pod: pod1 sends as someone else.
	nextJiffy()
	spoof := fromPod1("10.1.1.20")
	spoof.src = addr("10.1.1.66")
	expectVerdict(t, d.PodProgram(), spoof.frame(t), tcShot, nil)
	// Delivered and encapsulated packets report nothing.
	nextJiffy()
	expectVerdict(t, d.UnderlayProgram(), fromA(vpc1).geneve(t, podPacket("10.1.1.10").frame(t)), xdpRedirect, nil)
	expectVerdict(t, d.PodProgram(), fromPod1("10.1.1.20").frame(t), tcRedirect, nil)

	got := evs.wait(2)
	time.Sleep(50 * time.Millisecond)
	if got = evs.wait(3); len(got) != 2 {
		t.Fatalf("want 2 drop events (the two drops, nothing for the delivered packets), got %d: %v", len(got), got)
	}
	ul, pod := got[0], got[1]
	if ul.Program != "underlay" || ul.Reason != "drop_unknown_vni" || ul.VNI != unknownVNI || ul.OuterSrc != hostA.IP ||
		ul.OuterDst != hostH.IP || ul.Src != addr("10.1.1.99") || ul.Dst != addr("10.1.1.10") || ul.Proto != 6 ||
		ul.SrcPort != 40000 || ul.DstPort != 80 {
		t.Errorf("underlay event: %+v", ul)
	}
	if pod.Program != "pod" || pod.Reason != "drop_spoof" || pod.OuterSrc.IsValid() || pod.Src != addr("10.1.1.66") ||
		pod.Dst != addr("10.1.1.20") || pod.SrcPort != 43210 || pod.DstPort != 8080 || pod.Ifindex != 1 {
		t.Errorf("pod event: %+v", pod)
	}
	if time.Since(ul.Time) > time.Minute || ul.Time.After(time.Now()) {
		t.Errorf("event time %v is not now", ul.Time)
	}
	t.Logf("%s\n%s", ul, pod)
}

// A flood of drops is reported within the budget; the rest are counted
// and surface as suppressed.
func TestDropEventsRateLimited(t *testing.T) {
	d := fixture(t)
	evs := collectDropEvents(t, d)
	frame := fromA(unknownVNI).geneve(t, podPacket("10.1.1.10").frame(t))
	const n = 2000
	delta := counterDelta(t, d)
	start := time.Now()
	for range n {
		expectVerdict(t, d.UnderlayProgram(), frame, xdpDrop, nil)
	}
	took := time.Since(start)
	if got := delta().Underlay["drop_unknown_vni"]; got != n {
		t.Fatalf("counted %d drops, want %d", got, n)
	}
	time.Sleep(100 * time.Millisecond)
	got := evs.wait(0)
	var suppressed uint32
	for _, e := range got {
		suppressed += e.Suppressed
	}
	// One a jiffy per CPU: at most HZ 1000 x 2 CPUs x the time taken, +2
	// for windows cut at either end.
	limit := int(took/time.Millisecond)*2*DefaultDropEventBurst + 2*2
	t.Logf("%d drops in %v: %d events, %d suppressed reported", n, took, len(got), suppressed)
	if len(got) == 0 || len(got) > limit || len(got) >= n {
		t.Fatalf("%d events for %d drops in %v, want 1..%d", len(got), n, took, limit)
	}
	if len(got) > 1 && suppressed == 0 {
		t.Errorf("no event carried a suppressed count")
	}
	if len(got)+int(suppressed) > n {
		t.Errorf("events %d + suppressed %d exceed the %d drops", len(got), suppressed, n)
	}
}

func TestDropEventsOff(t *testing.T) {
	requireRoot(t)
	d, err := Load(Options{PinRoot: testPinRoot(t), UnderlayIfindex: 1, HostIP: hostH.IP, HostMAC: hostH.MAC, DropEventBurst: -1})
	must(t, err)
	t.Cleanup(func() { _ = d.Close() })
	populate(t, d)
	evs := collectDropEvents(t, d)
	expectVerdict(t, d.UnderlayProgram(), fromA(unknownVNI).geneve(t, podPacket("10.1.1.10").frame(t)), xdpDrop, nil)
	time.Sleep(100 * time.Millisecond)
	if got := evs.wait(0); len(got) != 0 || d.DropEventsEnabled() {
		t.Fatalf("reports off, got %d events (enabled %v)", len(got), d.DropEventsEnabled())
	}
}
