package ipam

import (
	"errors"
	"net/netip"
	"testing"
)

func TestBroadcast(t *testing.T) {
	for prefix, want := range map[string]string{
		"10.0.0.0/8":    "10.255.255.255",
		"10.1.2.0/24":   "10.1.2.255",
		"10.1.2.128/25": "10.1.2.255",
		"10.1.2.8/29":   "10.1.2.15",
		"0.0.0.0/0":     "255.255.255.255",
	} {
		if got := Broadcast(netip.MustParsePrefix(prefix)); got.String() != want {
			t.Errorf("Broadcast(%s) = %s, want %s", prefix, got, want)
		}
	}
}

func TestFirstFreeHost(t *testing.T) {
	p := netip.MustParsePrefix("10.0.0.0/29") // hosts .1 .. .6
	used := map[netip.Addr]bool{}
	var got []string
	for {
		a, err := FirstFreeHost(p, used)
		if errors.Is(err, ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, a.String())
		used[a] = true
	}
	want := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"}
	if len(got) != len(want) {
		t.Fatalf("allocated %v, want %v (never the network or broadcast address)", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("allocated %v, want %v", got, want)
		}
	}
	// A released address in the middle is handed out again first.
	delete(used, netip.MustParseAddr("10.0.0.3"))
	if a, err := FirstFreeHost(p, used); err != nil || a.String() != "10.0.0.3" {
		t.Errorf("after release got %v, %v; want 10.0.0.3", a, err)
	}
}

func TestFirstFreeVNI(t *testing.T) {
	if v, err := FirstFreeVNI(map[int32]bool{1: true, 2: true, 4: true}, 10); err != nil || v != 3 {
		t.Errorf("got %d, %v; want 3", v, err)
	}
	if _, err := FirstFreeVNI(map[int32]bool{1: true, 2: true}, 2); !errors.Is(err, ErrExhausted) {
		t.Errorf("full range: got %v, want ErrExhausted", err)
	}
}
