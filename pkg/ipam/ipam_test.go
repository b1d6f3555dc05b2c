package ipam

import (
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
