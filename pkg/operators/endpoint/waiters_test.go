package endpoint

import (
	"fmt"
	"slices"
	"testing"
)

func TestWaitersReleaseOnlyWhatAWatermarkCovers(t *testing.T) {
	w := newWaiters()
	marks := map[string]string{}
	wm := func(a string) string { return marks[a] }
	host, b0, b1 := dropletAgent("d1"), bouncerAgent("s-b-0"), bouncerAgent("s-b-1")
	for i := 1; i <= 5; i++ {
		if w.wait(fmt.Sprintf("ns/ep%d", i), fmt.Sprint(10*i), []string{host, b0, b1}, "s", false, wm) {
			t.Fatalf("ep%d: nothing covers it yet, but wait reported ready", i)
		}
	}
	if got := w.covered(host, "30"); len(got) != 0 {
		t.Errorf("host alone covered %v; the bouncers have not", got)
	}
	if got := w.covered(b0, "25"); len(got) != 0 {
		t.Errorf("got %v, want none ready", got)
	}
	got := w.covered(b1, "100")
	slices.Sort(got)
	if want := []string{"ns/ep1", "ns/ep2"}; !slices.Equal(got, want) {
		t.Errorf("after every agent covered 20: ready %v, want %v", got, want)
	}
	// A registration replaces the previous one: the old version's entries are stale.
	if w.wait("ns/ep3", "35", []string{host}, "s", false, wm) {
		t.Fatal("ep3 at 35 is not covered by the host's 30")
	}
	if got := w.covered(host, "34"); len(got) != 0 {
		t.Errorf("got %v, want none ready", got)
	}
	if got := w.covered(host, "35"); !slices.Equal(got, []string{"ns/ep3"}) {
		t.Errorf("got %v, want ep3", got)
	}
	// A watermark that moved before the registration is seen under the lock.
	marks[host] = "60"
	if !w.wait("ns/ep6", "60", []string{host}, "s", false, wm) {
		t.Error("a wait already covered must report ready")
	}
	// An agent that changes hands its waiters back; gone, it holds nothing.
	got = w.changed(b0, true)
	slices.Sort(got)
	if want := []string{"ns/ep4", "ns/ep5"}; !slices.Equal(got, want) {
		t.Errorf("waiters of a gone bouncer %v, want %v", got, want)
	}
	// They still wait for the host (Reconcile registers them afresh anyway).
	got = w.covered(host, "1000")
	slices.Sort(got)
	if want := []string{"ns/ep4", "ns/ep5"}; !slices.Equal(got, want) {
		t.Errorf("after the host covered them: ready %v, want %v", got, want)
	}
	// Waiting for the subnet's first bouncer: no watermark releases it.
	w.wait("ns/ep7", "70", nil, "s2", true, wm)
	if got := w.subnetWaiters("s2"); !slices.Equal(got, []string{"ns/ep7"}) {
		t.Errorf("subnet waiters %v, want ep7", got)
	}
	w.forget("ns/ep7")
	if len(w.byKey) != 0 || len(w.bySubnet) != 0 {
		t.Errorf("left behind: %v %v", w.byKey, w.bySubnet)
	}
}

// Registrations replaced again and again (an endpoint updated while its agent
// does not acknowledge) do not grow the agent's heap without bound.
func TestWaitersCompactStaleEntries(t *testing.T) {
	w := newWaiters()
	wm := func(string) string { return "" }
	a := dropletAgent("d")
	for i := range 100000 {
		w.wait(fmt.Sprintf("ns/ep%d", i%10), fmt.Sprint(i+1), []string{a}, "s", false, wm)
	}
	if n := len(w.byAgent[a].heap); n > 2048 {
		t.Errorf("heap holds %d entries for 10 waiters", n)
	}
	got := w.covered(a, "1000000")
	if len(got) != 10 {
		t.Errorf("ready %v, want the 10 endpoints", got)
	}
}
