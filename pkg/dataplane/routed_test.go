package dataplane

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// Droplets on two L3 subnets with a router between them (routedSegment):
//
//	198.18.0.0/24: A (pod a 10.1.1.10)  --R--  198.18.1.0/24: B (pod b 10.1.1.20), C
//
// C, on the far side from A, bounces VPC 100's 10.1.1.0/24 and divides the
// VPC. Every hop is given without a MAC, so every next hop comes from the
// kernel FIB: through R between the segments, straight to the host on C's
// own.
func buildRouted(t *testing.T) *testNet {
	tn := newTestNet(t, []string{"A"}, nil)
	far := tn.routedSegment(t)
	tn.addHostOn(t, far, "B")
	tn.addHostOn(t, far, "C")
	tn.addPod(t, podSpec{"a", "A", vpc1, "10.1.1.10/24"})
	tn.addPod(t, podSpec{"b", "B", vpc1, "10.1.1.20/24"})
	tn.wireMode(t)
	tn.xdpTXToSwitch(t, "C")
	C := tn.hosts["C"]
	for _, h := range tn.order {
		// bpf_fib_lookup answers only where IPv4 forwarding is on, as on
		// any Kubernetes node.
		h.ns.sysctl(t, "net.ipv4.ip_forward", "1")
		tn.loadMizar(t, h)
		must(t, h.dp.UpsertVPC(VPC{VNI: vpc1, Dividers: []Hop{C.routedHop()}}))
		must(t, h.dp.UpsertSubnet(Subnet{VNI: vpc1, Prefix: netip.MustParsePrefix("10.1.1.0/24"), Bouncers: []Hop{C.routedHop()}}))
	}
	tn.setRelays(t, vpc1, C)
	for _, p := range tn.pods {
		tn.remoteEndpoint(t, C, p)
	}
	tn.resolveUnderlay(t)
	return tn
}

// resolveUnderlay has every host ping every other one, as a node's own
// traffic would: the underlay program cannot wait for ARP, the kernel then
// has the neighbour entries it needs (drop_no_neigh otherwise).
func (tn *testNet) resolveUnderlay(tb testing.TB) {
	tb.Helper()
	for _, h := range tn.order {
		for _, o := range tn.order {
			if o == h {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			out, err := h.ns.exec(ctx, "ping", "-n", "-q", "-c", "1", "-W", "2", o.ip.String())
			cancel()
			if err != nil {
				tb.Fatalf("underlay %s -> %s: %v\n%s", h.name, o.name, err, out)
			}
		}
	}
}

func TestRoutedUnderlay(t *testing.T) {
	tn := buildRouted(t)
	a, b := tn.pods["a"], tn.pods["b"]
	A, B, C := tn.hosts["A"], tn.hosts["B"], tn.hosts["C"]
	for _, p := range tn.pods {
		serveIdentity(t, p)
	}

	t.Run("through the bouncer on the far side", func(t *testing.T) {
		before := counters(t, C)
		caps := captureUnderlay(t, tn)
		if out, ok := a.ping(t, b.ip, 3); !ok {
			t.Fatalf("a -> b ping failed:\n%s", out)
		}
		// A's frame leaves for C's address through R's MAC; C's bounce
		// goes to B on its own segment; B's reply comes back through C and R.
		expectGeneve(t, caps["A"].stop(), A, C, vpc1, a.ip, b.ip)
		expectGeneve(t, caps["C"].stop(), C, B, vpc1, a.ip, b.ip)
		transfer(t, a, b, 4<<20)
		after := counters(t, C)
		if n := after.Underlay["fwd_endpoint"] - before.Underlay["fwd_endpoint"]; n == 0 {
			t.Fatalf("C forwarded nothing as bouncer: %v", after.Underlay)
		}
		if after.Underlay["drop_no_neigh"]+after.Underlay["drop_no_route"] != 0 {
			t.Fatalf("C could not route: %v", after.Underlay)
		}
	})

	t.Run("directly across the router", func(t *testing.T) {
		tn.remoteEndpoint(t, A, b)
		tn.remoteEndpoint(t, B, a)
		before := counters(t, C)
		caps := captureUnderlay(t, tn)
		if out, ok := a.ping(t, b.ip, 3); !ok {
			t.Fatalf("a -> b ping failed:\n%s", out)
		}
		expectGeneve(t, caps["A"].stop(), A, B, vpc1, a.ip, b.ip)
		transfer(t, a, b, 4<<20)
		if got := identity(t, a, b.ip); got != "b" {
			t.Fatalf("a reached %q at %s, want b", got, b.ip)
		}
		if after := counters(t, C); after.Underlay["rx"] != before.Underlay["rx"] {
			t.Fatalf("C still saw Geneve: %v -> %v", before.Underlay, after.Underlay)
		}
	})
}
