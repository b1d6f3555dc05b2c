package nodeagent

import (
	"net/netip"
	"testing"
)

func TestWireGuardAddress(t *testing.T) {
	for _, c := range []struct{ given, phys, want string }{
		{"100.96.0.7/16", "172.18.0.5", "100.96.0.7/16"},     // given whole
		{"100.96.0.0/16", "172.18.0.5", "100.96.0.5/16"},     // derived
		{"100.96.0.0/16", "10.1.200.17", "100.96.200.17/16"}, // 16 host bits
		{"100.96.0.0/24", "172.18.0.0", ""},                  // the network address
		{"100.96.0.0/24", "172.18.3.255", ""},                // the broadcast address
	} {
		got, err := wireGuardAddress(netip.MustParsePrefix(c.given), netip.MustParseAddr(c.phys))
		if c.want == "" {
			if err == nil {
				t.Errorf("%s with %s: %s, want an error", c.given, c.phys, got)
			}
			continue
		}
		if err != nil || got.String() != c.want {
			t.Errorf("%s with %s: %s %v, want %s", c.given, c.phys, got, err, c.want)
		}
	}
}
