package dataplane

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Trust and leaks, through the kernel: frames enter real veths and bridges of
// the three-host net (buildThreeHosts) and what reaches a pod or the underlay
// is captured there.

// markedUDP is an IPv4/UDP packet from src to dst whose payload is a marker
// the captures look for.
func markedUDP(src, dst netip.Addr, marker string) inner {
	return inner{src: src, dst: dst, proto: layers.IPProtocolUDP, sport: 5555, dport: 9999, ttl: 64, payload: []byte(marker)}
}

func carries(frames [][]byte, marker string) bool {
	for _, f := range frames {
		if bytes.Contains(f, []byte(marker)) {
			return true
		}
	}
	return false
}

// genevePayload is Geneve as a userspace sender writes it (the kernel adds
// outer IPv4 and UDP): VNI, inner Ethernet, inner packet.
func genevePayload(tb testing.TB, vni uint32, srcMAC, dstMAC []byte, p inner) []byte {
	tb.Helper()
	p.srcMAC, p.dstMAC = srcMAC, dstMAC
	return serialize(tb, false, &layers.Geneve{Protocol: layers.EthernetTypeTransparentEthernetBridging, VNI: vni},
		gopacket.Payload(p.frame(tb)))
}

// settle gives frames in flight time to reach the captures.
func settle() { time.Sleep(300 * time.Millisecond) }

func TestUnderlayTrustThroughKernel(t *testing.T) {
	tn := buildThreeHosts(t)
	a, b, y := tn.pods["a"], tn.pods["b"], tn.pods["y"]
	A, B, C := tn.hosts["A"], tn.hosts["B"], tn.hosts["C"]
	// M reaches every host on the underlay but is no droplet.
	M := tn.addHost(t, "M")

	geneve := func(vni uint32, to *testPod, p inner) []byte { return genevePayload(t, vni, a.mac, to.mac, p) }
	send := func(from *testHost, to *testHost, payload []byte) {
		from.ns.sendUDP(t, netip.AddrPortFrom(to.ip, 6081), 0, payload)
	}

	cases := []struct {
		name    string
		from    *testHost
		to      *testHost
		vni     uint32
		pod     *testPod
		src     netip.Addr
		refusal string // "" = delivered
	}{
		// The control: A hosts a, and C (a relay) bounces it on to b.
		{"droplet A for its pod a, via bouncer C", A, C, vpc1, b, a.ip, ""},
		{"stranger M", M, B, vpc1, b, a.ip, "drop_not_droplet"},
		{"stranger M to the bouncer", M, C, vpc1, b, a.ip, "drop_not_droplet"},
		{"A with an unknown inner source", A, C, vpc1, b, addr("10.1.1.77"), "drop_src_unknown"},
		{"A with the inner source of b, hosted by B", A, C, vpc1, b, b.ip, "drop_src_spoofed"},
		{"A with a's address in VPC 200", A, B, vpc2, y, a.ip, "drop_src_unknown"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			marker := fmt.Sprintf("mizar-trust-%d-%s", i, tn.sfx)
			capPod := c.pod.ns.capture(t, "eth0")
			before := counters(t, c.to)
			for range 3 {
				send(c.from, c.to, geneve(c.vni, c.pod, markedUDP(c.src, c.pod.ip, marker)))
			}
			settle()
			got := carries(capPod.stop(), marker)
			delta := counters(t, c.to).Underlay
			if c.refusal == "" {
				if !got {
					t.Fatalf("pod %s did not get the packet (counters of %s: %v)", c.pod.name, c.to.name, delta)
				}
				return
			}
			if got {
				t.Fatalf("pod %s got a packet that %s should have refused", c.pod.name, c.to.name)
			}
			if n := delta[c.refusal] - before.Underlay[c.refusal]; n != 3 {
				t.Fatalf("%s counted %d %s, want 3", c.to.name, n, c.refusal)
			}
		})
	}
}

// Frames a pod puts on its eth0 leave only as what the endpoint is: the
// kernel moves an 802.1Q/802.1ad tag into skb metadata before tcx, so these
// go through a real veth, not BPF_PROG_TEST_RUN.
func TestPodFramesNeverLeak(t *testing.T) {
	tn := buildThreeHosts(t)
	a, b := tn.pods["a"], tn.pods["b"]
	A := tn.hosts["A"]

	frame := func(srcMAC []byte, tags []layers.EthernetType, marker string) []byte {
		p := markedUDP(a.ip, b.ip, marker)
		if len(tags) == 0 {
			p.srcMAC, p.dstMAC = srcMAC, gatewayMAC
			return p.frame(t)
		}
		ip := p.ip()
		udp := &layers.UDP{SrcPort: layers.UDPPort(p.sport), DstPort: layers.UDPPort(p.dport)}
		_ = udp.SetNetworkLayerForChecksum(ip)
		ls := []gopacket.SerializableLayer{&layers.Ethernet{SrcMAC: srcMAC, DstMAC: gatewayMAC, EthernetType: tags[0]}}
		for i := range tags {
			next := layers.EthernetTypeIPv4
			if i+1 < len(tags) {
				next = tags[i+1]
			}
			ls = append(ls, &layers.Dot1Q{VLANIdentifier: uint16(7 + i), Type: next})
		}
		ls = append(ls, ip, udp, gopacket.Payload(p.payload))
		return serialize(t, true, ls...)
	}
	spoofMAC := mustMAC("02:aa:00:00:00:77")
	mcastMAC := mustMAC("01:00:5e:00:00:fb")
	cases := []struct {
		name    string
		srcMAC  []byte
		tags    []layers.EthernetType
		counter string // "" = must leave
	}{
		{"untagged from a's MAC", a.mac, nil, ""},
		{"802.1Q tagged", a.mac, []layers.EthernetType{layers.EthernetTypeDot1Q}, "drop_vlan"},
		{"QinQ 802.1ad+802.1Q", a.mac, []layers.EthernetType{layers.EthernetTypeQinQ, layers.EthernetTypeDot1Q}, "drop_vlan"},
		{"double 802.1Q", a.mac, []layers.EthernetType{layers.EthernetTypeDot1Q, layers.EthernetTypeDot1Q}, "drop_vlan"},
		{"spoofed source MAC", spoofMAC, nil, "drop_mac_spoof"},
		{"multicast source MAC", mcastMAC, nil, "drop_mac_multicast"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			marker := fmt.Sprintf("mizar-leak-%d-%s", i, tn.sfx)
			capUL := tn.sw.capture(t, "pA")
			capB := b.ns.capture(t, "eth0")
			before := counters(t, A)
			a.ns.sendRaw(t, "eth0", frame(c.srcMAC, c.tags, marker), frame(c.srcMAC, c.tags, marker))
			settle()
			onWire, atB := carries(capUL.stop(), marker), carries(capB.stop(), marker)
			after := counters(t, A)
			if c.counter == "" {
				if !onWire || !atB {
					t.Fatalf("the control frame did not cross (underlay %v, pod b %v): %v", onWire, atB, after.Pod)
				}
				return
			}
			if onWire || atB {
				t.Fatalf("leaked (underlay %v, pod b %v)", onWire, atB)
			}
			if n := after.Pod[c.counter] - before.Pod[c.counter]; n != 2 {
				t.Fatalf("A counted %d %s, want 2 (pod counters %v)", n, c.counter, after.Pod)
			}
		})
	}
}
