package dataplane

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// A good citizen on the wire, through the kernel on the three-host net:
// DSCP/ECN across encap and decap, ICMP time exceeded and fragmentation
// needed, and the kernel's own drop counters beside the programs'.
func TestWireCitizen(t *testing.T) {
	tn := buildThreeHosts(t)
	a, b, b2 := tn.pods["a"], tn.pods["b"], tn.pods["b2"]
	A, B, C := tn.hosts["A"], tn.hosts["B"], tn.hosts["C"]

	t.Run("DSCP and ECN survive encap and decap", func(t *testing.T) {
		caps := captureUnderlay(t, tn)
		capB := b.ns.capture(t, "eth0")
		if out, ok := a.pingArgs(t, b.ip, 2, "-Q", "0xb9"); !ok {
			t.Fatalf("ping with TOS 0xb9 failed:\n%s", out)
		}
		for _, hop := range []struct {
			frames   [][]byte
			src, dst *testHost
		}{{caps["A"].stop(), A, C}, {caps["C"].stop(), C, B}} {
			pkt := expectGeneve(t, hop.frames, hop.src, hop.dst, vpc1, a.ip, b.ip)
			ls := pkt.Layers()
			if o, i := ls[1].(*layers.IPv4).TOS, ls[5].(*layers.IPv4).TOS; o != 0xb9 || i != 0xb9 {
				t.Fatalf("%s -> %s: outer TOS %#x, inner %#x, want 0xb9 both", hop.src.name, hop.dst.name, o, i)
			}
		}
		if tos := tosOf(t, capB.stop(), func(ip *layers.IPv4) bool { return ip.SrcIP.Equal(a.ip.AsSlice()) }); tos != 0xb9 {
			t.Fatalf("b got TOS %#x, want 0xb9", tos)
		}

		// CE marked on the underlay (A sends it that way, C bounces it
		// keeping the outer TOS) reaches b's ECN-capable packet; over a
		// not-ECT packet it is refused at B.
		for _, c := range []struct {
			inner, want uint8
		}{{0x02, 0x03}, {0x00, 0}} {
			marker := fmt.Sprintf("mizar-ecn-%#x-%s", c.inner, tn.sfx)
			capB := b.ns.capture(t, "eth0")
			before := counters(t, B)
			p := markedUDP(a.ip, b.ip, marker)
			p.tos = c.inner
			A.ns.sendUDP(t, netip.AddrPortFrom(C.ip, 6081), 0x03, genevePayload(t, vpc1, a.mac, b.mac, p))
			settle()
			got := tosOf(t, capB.stop(), func(ip *layers.IPv4) bool { return strings.Contains(string(ip.Payload), marker) })
			if c.want == 0 {
				if got >= 0 {
					t.Fatalf("CE over not-ECT was delivered (TOS %#x)", got)
				}
				if n := counters(t, B).Underlay["drop_ecn"] - before.Underlay["drop_ecn"]; n != 1 {
					t.Fatalf("B counted %d drop_ecn, want 1", n)
				}
				continue
			}
			if got != int(c.want) {
				t.Fatalf("inner ECT(0) under outer CE arrived with TOS %#x, want %#x", got, c.want)
			}
		}
	})

	t.Run("traceroute across subnets shows the gateway", func(t *testing.T) {
		before := counters(t, A)
		out, _ := a.pingArgs(t, b2.ip, 1, "-t", "1")
		if !strings.Contains(out, "From "+gatewayOf(a.subnet).String()) || !strings.Contains(out, "Time to live exceeded") {
			t.Fatalf("TTL 1 toward another subnet: want time exceeded from the gateway, got:\n%s", out)
		}
		if n := counters(t, A).Pod["icmp_time_exceeded"] - before.Pod["icmp_time_exceeded"]; n != 1 {
			t.Fatalf("A counted %d icmp_time_exceeded, want 1", n)
		}
		if out, ok := a.pingArgs(t, b2.ip, 1, "-t", "2"); !ok {
			t.Fatalf("TTL 2 does not reach b2 (gateway, then b2):\n%s", out)
		}
	})

	t.Run("kernel drops after the programs are reported", func(t *testing.T) {
		// Without GRO b's eth0 has no NAPI: B's redirect into it fails in
		// the kernel after the program returned, and the underlay driver
		// counts the frame as an rx drop.
		b.ns.do(t, func() error { return SetFeatures("eth0", map[string]bool{"rx-gro": false}) })
		defer b.ns.do(t, func() error { return SetFeatures("eth0", map[string]bool{"rx-gro": true}) })
		before := kernelDrops(t, B)
		if out, ok := a.ping(t, b.ip, 2); ok {
			t.Fatalf("ping reached b without NAPI on its eth0:\n%s", out)
		}
		after := kernelDrops(t, B)
		if after["ul0"].RxDropped < before["ul0"].RxDropped+2 {
			t.Fatalf("B's underlay kernel drops %+v -> %+v, want 2 more rx drops", before["ul0"], after["ul0"])
		}
		for _, p := range []*testPod{b, tn.pods["b2"], tn.pods["y"]} {
			if _, ok := after[p.hostIf]; !ok {
				t.Fatalf("no entry for pod interface %s in %v", p.hostIf, after)
			}
		}
	})

	t.Run("oversized DF packet gets fragmentation needed", func(t *testing.T) {
		// A pod whose MTU ignores the Geneve overhead.
		a.ns.do(t, func() error { return setMTU(a.ns, "eth0", underlayMTU) })
		A.ns.do(t, func() error { return setMTU(A.ns, a.hostIf, underlayMTU) })
		before := counters(t, A)
		out, _ := a.pingArgs(t, b.ip, 1, "-M", "do", "-s", fmt.Sprint(underlayMTU-28))
		if !strings.Contains(out, fmt.Sprintf("mtu = %d", podMTU)) {
			t.Fatalf("want fragmentation needed with mtu = %d, got:\n%s", podMTU, out)
		}
		if n := counters(t, A).Pod["icmp_frag_needed"] - before.Pod["icmp_frag_needed"]; n != 1 {
			t.Fatalf("A counted %d icmp_frag_needed, want 1", n)
		}
		if out, ok := a.pingArgs(t, b.ip, 1, "-M", "do", "-s", fmt.Sprint(podMTU-28)); !ok {
			t.Fatalf("a packet that fits after encap did not cross:\n%s", out)
		}
	})
}

// pingArgs pings with extra arguments and returns the output.
func (p *testPod) pingArgs(tb testing.TB, dst netip.Addr, count int, args ...string) (string, bool) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(count+3)*time.Second)
	defer cancel()
	args = append([]string{"-n", "-c", fmt.Sprint(count), "-i", "0.2", "-W", "1"}, args...)
	out, err := p.ns.exec(ctx, "ping", append(args, dst.String())...)
	return out, err == nil
}

// tosOf returns the TOS byte of the first captured IPv4 packet that match
// accepts, or -1.
func tosOf(tb testing.TB, frames [][]byte, match func(*layers.IPv4) bool) int {
	tb.Helper()
	for _, f := range frames {
		pkt := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
		if ip, ok := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok && match(ip) {
			return int(ip.TOS)
		}
	}
	return -1
}

func kernelDrops(tb testing.TB, h *testHost) map[string]LinkDrops {
	tb.Helper()
	var ds []LinkDrops
	h.ns.do(tb, func() (err error) {
		ds, err = h.dp.KernelDrops()
		return err
	})
	out := map[string]LinkDrops{}
	for _, d := range ds {
		out[d.Ifname] = d
	}
	return out
}

func setMTU(n *netNS, ifname string, mtu int) error {
	l, err := n.nl.LinkByName(ifname)
	if err != nil {
		return err
	}
	return n.nl.LinkSetMTU(l, mtu)
}
