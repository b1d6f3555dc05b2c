package dataplane

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"
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

// spoofed is whole Geneve frames as a machine on the underlay can write them
// through a packet socket: any outer source address and MAC, sent on from's
// ul0 toward to.
func spoofed(t *testing.T, from *testHost, src netip.Addr, srcMAC []byte, to *testHost, vni uint32,
	opts []*layers.GeneveOption, p inner, innerDst *testPod) []byte {
	t.Helper()
	p.srcMAC, p.dstMAC = srcMAC, innerDst.mac
	o := outer{src: src, srcMAC: srcMAC, dst: to.ip, dstMAC: to.mac, vni: vni, sport: 0xC123, df: true, options: opts}
	return o.geneve(t, p.frame(t))
}

// addStranger plugs a host that is no droplet into the underlay and waits
// until its port forwards (a frame sent at once may be lost before the
// bridge port is up, which a refusal test would count as refused).
func addStranger(t *testing.T, tn *testNet, name string, to *testHost) *testHost {
	t.Helper()
	M := tn.addHost(t, name)
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := M.ns.exec(ctx, "ping", "-n", "-q", "-c", "1", "-W", "1", to.ip.String())
		cancel()
		if err == nil {
			return M
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s cannot reach %s on the underlay: %v", name, to.name, err)
		}
	}
}

// expectRefused sends frames on from's ul0 three times and checks that pod
// got none of them and host to counted each under refusal.
func expectRefused(t *testing.T, from, to *testHost, pod *testPod, refusal, marker string, frame []byte) {
	t.Helper()
	capPod := pod.ns.capture(t, "eth0")
	before := counters(t, to)
	from.ns.sendRaw(t, "ul0", frame, frame, frame)
	settle()
	if carries(capPod.stop(), marker) {
		t.Fatalf("pod %s got a frame that %s should have refused as %s", pod.name, to.name, refusal)
	}
	after := counters(t, to)
	if n := after.Underlay[refusal] - before.Underlay[refusal]; n != 3 {
		t.Fatalf("%s counted %d %s, want 3 (underlay counters %v)", to.name, n, refusal, after.Underlay)
	}
}

// A frame claiming to come from the receiving host itself is someone else's
// on the segment: refused even though every host of the test net, the
// receiver included, is in its own droplets map.
func TestUnderlayOwnSourceRefused(t *testing.T) {
	tn := buildThreeHosts(t)
	a, b := tn.pods["a"], tn.pods["b"]
	B := tn.hosts["B"]
	M := addStranger(t, tn, "M", B)
	marker := "mizar-self-" + tn.sfx
	// M writes B's own address as the outer source (with its own MAC: the
	// bridge would not hand B a frame from B's MAC), and a (a pod B trusts
	// from nobody but A) as the inner one.
	f := spoofed(t, M, B.ip, M.mac, B, vpc1, nil, markedUDP(a.ip, b.ip, marker), b)
	expectRefused(t, M, B, b, "drop_self_source", marker, f)
}

// geneveWithOption is the Geneve payload a relay writes: VNI, mizar's
// sending-host option naming host, inner Ethernet and packet.
func geneveWithOption(tb testing.TB, vni uint32, host netip.Addr, srcMAC, dstMAC []byte, p inner) []byte {
	tb.Helper()
	p.srcMAC, p.dstMAC = srcMAC, dstMAC
	return serialize(tb, false, &layers.Geneve{Protocol: layers.EthernetTypeTransparentEthernetBridging, VNI: vni,
		Options: srcHostOption(host)}, gopacket.Payload(p.frame(tb)))
}

// What the sending-host option may teach, through the kernel: relay C (a
// real one, sending from its own address and MAC) delivers b's packets to a
// on A, naming various hosts. Only a droplet that is not A, for an endpoint
// whose host A's maps do not name otherwise, is learned.
func TestLearnOnlyWhatTheAPIVouchesFor(t *testing.T) {
	tn := buildThreeHosts(t)
	a, b := tn.pods["a"], tn.pods["b"]
	A, B, C := tn.hosts["A"], tn.hosts["B"], tn.hosts["C"]
	M := addStranger(t, tn, "M", A)
	cases := []struct {
		name  string
		host  netip.Addr
		learn bool
	}{
		{"a stranger", M.ip, false},
		{"A itself", A.ip, false},
		{"an address outside the droplet set", addr("203.0.113.7"), false},
		{"broadcast", addr("255.255.255.255"), false},
		{"loopback", addr("127.0.0.1"), false},
		{"multicast", addr("224.0.0.1"), false},
		{"unspecified", addr("0.0.0.0"), false},
		{"B, a droplet", B.ip, true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			must(t, A.dp.ForgetLearned(vpc1, b.ip))
			marker := fmt.Sprintf("mizar-vouch-%d-%s", i, tn.sfx)
			capPod := a.ns.capture(t, "eth0")
			before := counters(t, A)
			C.ns.sendUDP(t, netip.AddrPortFrom(A.ip, 6081), 0,
				geneveWithOption(t, vpc1, c.host, b.mac, a.mac, markedUDP(b.ip, a.ip, marker)))
			settle()
			// C is a relay: the packet itself is delivered either way.
			if !carries(capPod.stop(), marker) {
				t.Fatalf("a did not get the relay's packet (counters %v)", counters(t, A).Underlay)
			}
			after := counters(t, A)
			l, err := A.dp.Learned()
			must(t, err)
			if !c.learn {
				if len(l) != 0 {
					t.Fatalf("A learned %+v from an option naming %s", l, c.host)
				}
				if n := after.Underlay["learn_refused"] - before.Underlay["learn_refused"]; n != 1 {
					t.Fatalf("A counted %d learn_refused, want 1", n)
				}
				return
			}
			if len(l) != 1 || l[0].IP != b.ip || l[0].HostIP != B.ip {
				t.Fatalf("A learned %+v, want b at B", l)
			}
		})
	}

	// Where A's maps name the endpoint's host (A bounces for it, say), an
	// option naming any other droplet teaches nothing, even from a relay.
	must(t, A.dp.ForgetLearned(vpc1, b.ip))
	tn.remoteEndpoint(t, A, b)
	before := counters(t, A)
	C.ns.sendUDP(t, netip.AddrPortFrom(A.ip, 6081), 0,
		geneveWithOption(t, vpc1, C.ip, b.mac, a.mac, markedUDP(b.ip, a.ip, "mizar-vouch-api-"+tn.sfx)))
	settle()
	if l, _ := A.dp.Learned(); len(l) != 0 {
		t.Fatalf("A learned %+v against its endpoints map", l)
	}
	if n := counters(t, A).Underlay["learn_refused"] - before.Underlay["learn_refused"]; n != 1 {
		t.Fatalf("A counted %d learn_refused for a host other than the API's, want 1", n)
	}
}

// A learned path never sends a pod's traffic to a host outside the droplet
// set: an entry naming one (learned before this check, or before its
// droplet went) is ignored, and a's packets to b take the relay.
func TestLearnedPathOnlyToDroplets(t *testing.T) {
	tn := buildThreeHosts(t)
	a, b := tn.pods["a"], tn.pods["b"]
	A := tn.hosts["A"]
	M := addStranger(t, tn, "M", A)
	k, err := endpointKey(vpc1, b.ip)
	must(t, err)
	var ts unix.Timespec
	must(t, unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts))
	v := mizarLearnedEntry{HostIp: M.ip.As4(), Expires: uint64(ts.Nano() + int64(time.Hour))}
	must(t, A.dp.objs.Learned.Put(&k, &v))
	capM := M.ns.capture(t, "ul0")
	serveIdentity(t, b)
	if out, ok := a.pingArgs(t, b.ip, 20, "-i", "0.02"); !ok || !strings.Contains(out, " 0% packet loss") {
		t.Fatalf("a -> b with a poisoned entry:\n%s", out)
	}
	if got := identity(t, a, b.ip); got != "b" {
		t.Fatalf("a reached %q at %s, want b", got, b.ip)
	}
	settle()
	for _, f := range capM.stop() {
		if bytes.Contains(f, a.ip.AsSlice()) && bytes.Contains(f, b.ip.AsSlice()) {
			t.Fatalf("the stranger got a's traffic:\n%s", dump(f))
		}
	}
	// What C vouched for since (b at B, a droplet) replaced the entry.
	if l, _ := A.dp.Learned(); len(l) != 1 || l[0].HostIP != tn.hosts["B"].ip {
		t.Fatalf("A learned %+v, want b at B", l)
	}
}

// injects sends, from host from's own address, Geneve carrying a packet from
// src to pod to, and reports whether the pod got it.
func injects(t *testing.T, from, at *testHost, src netip.Addr, srcMAC []byte, to *testPod, marker string) bool {
	t.Helper()
	capPod := to.ns.capture(t, "eth0")
	from.ns.sendUDP(t, netip.AddrPortFrom(at.ip, 6081), 0, genevePayload(t, to.vni, srcMAC, to.mac, markedUDP(src, to.ip, marker)))
	settle()
	return carries(capPod.stop(), marker)
}

// Learned trust ends with the map write that says the endpoint moved or its
// host went, not with the learned lifetime: A learned b at B (through relay
// C), so B may send as b straight to a; once A's maps say b's address lives
// on D, B's frames as b are refused at once; once B's maps lose droplet A,
// everything B learned at A is gone and A's frames are refused.
func TestLearnedTrustForgottenOnMove(t *testing.T) {
	tn := newTestNet(t, []string{"A", "B", "C", "D"}, []podSpec{
		{"a", "A", vpc1, "10.1.1.10/24"},
		{"b", "B", vpc1, "10.1.1.20/24"},
		{"b2", "D", vpc1, "10.1.1.20/24"}, // where b's address moves to
	})
	tn.wireMode(t)
	tn.xdpTXToSwitch(t, "C") // the relay
	A, B, C, D := tn.hosts["A"], tn.hosts["B"], tn.hosts["C"], tn.hosts["D"]
	for _, h := range tn.order {
		tn.loadMizar(t, h)
		must(t, h.dp.UpsertVPC(VPC{VNI: vpc1, Dividers: []Hop{C.hop()}}))
		must(t, h.dp.UpsertSubnet(Subnet{VNI: vpc1, Prefix: netip.MustParsePrefix("10.1.1.0/24"), Bouncers: []Hop{C.hop()}}))
	}
	tn.setRelays(t, vpc1, C)
	a, b, b2 := tn.pods["a"], tn.pods["b"], tn.pods["b2"]
	tn.remoteEndpoint(t, C, a)
	tn.remoteEndpoint(t, C, b)
	if out, ok := a.pingArgs(t, b.ip, 10, "-i", "0.05"); !ok {
		t.Fatalf("a -> b failed:\n%s", out)
	}
	if l, _ := A.dp.Learned(); len(l) != 1 || l[0].HostIP != B.ip {
		t.Fatalf("A learned %+v, want b at B", l)
	}
	if l, _ := B.dp.Learned(); len(l) != 1 || l[0].HostIP != A.ip {
		t.Fatalf("B learned %+v, want a at A", l)
	}
	if !injects(t, B, A, b.ip, b.mac, a, "mizar-move-control-"+tn.sfx) {
		t.Fatal("control: B's direct frame as b did not reach a")
	}

	// The move, as an agent applies it to A's maps.
	before := counters(t, A)
	tn.remoteEndpoint(t, A, b2)
	if injects(t, B, A, b.ip, b.mac, a, "mizar-move-after-"+tn.sfx) {
		t.Fatal("B still injects as b into a after the move")
	}
	if n := counters(t, A).Underlay["drop_src_spoofed"] - before.Underlay["drop_src_spoofed"]; n != 1 {
		t.Fatalf("A counted %d drop_src_spoofed after the move, want 1", n)
	}
	if !injects(t, D, A, b2.ip, b2.mac, a, "mizar-move-new-"+tn.sfx) {
		t.Fatal("D, b's address's new host, cannot send as it")
	}
	// Deleted: nobody may.
	must(t, A.dp.DeleteEndpoint(vpc1, b2.ip))
	if injects(t, D, A, b2.ip, b2.mac, a, "mizar-move-deleted-"+tn.sfx) {
		t.Fatal("D injects as a deleted endpoint")
	}

	// Droplet A deleted from B's maps: B's paths and trust learned at A go
	// in the same call.
	before = counters(t, B)
	must(t, B.dp.DeleteDroplet(A.ip))
	learned, err := B.dp.Learned()
	must(t, err)
	for _, l := range learned {
		if l.HostIP == A.ip {
			t.Fatalf("B still holds %+v after droplet A went", l)
		}
	}
	if injects(t, A, B, a.ip, a.mac, b, "mizar-move-droplet-"+tn.sfx) {
		t.Fatal("A, no droplet any more, still injects into b")
	}
	if n := counters(t, B).Underlay["drop_not_droplet"] - before.Underlay["drop_not_droplet"]; n != 1 {
		t.Fatalf("B counted %d drop_not_droplet, want 1", n)
	}
}

// A stranger on the segment that writes a relay's or a droplet's outer
// address, with its own MAC, injects nothing: each host knows the MACs of
// the droplets on its segment. (Re-bounce, where a droplet sends on under
// the sender's address with its own MAC, is TestLearnedPathStaleHost.)
func TestSpoofedDropletAddressRefused(t *testing.T) {
	tn := buildThreeHosts(t)
	a, b, x, y := tn.pods["a"], tn.pods["b"], tn.pods["x"], tn.pods["y"]
	A, B, C := tn.hosts["A"], tn.hosts["B"], tn.hosts["C"]
	M := addStranger(t, tn, "M", A)
	cases := []struct {
		name string
		as   *testHost
		vni  uint32
		src  netip.Addr
		pod  *testPod
	}{
		{"relay C's address, into a as its neighbour b", C, vpc1, b.ip, a},
		{"relay C's address, into a as no endpoint", C, vpc1, addr("10.1.1.77"), a},
		{"relay C's address, into VPC 200's x as y", C, vpc2, y.ip, x},
		{"droplet B's address, into a as b", B, vpc1, b.ip, a},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			marker := fmt.Sprintf("mizar-macspoof-%d-%s", i, tn.sfx)
			f := spoofed(t, M, c.as.ip, M.mac, A, c.vni, nil, markedUDP(c.src, c.pod.ip, marker), c.pod)
			expectRefused(t, M, A, c.pod, "drop_mac_spoof", marker, f)
		})
	}
	// The control: the same frame from C itself is delivered.
	if !injects(t, C, A, b.ip, b.mac, a, "mizar-macspoof-control-"+tn.sfx) {
		t.Fatal("control: relay C's own frame as b did not reach a")
	}
}

// tagged inserts 802.1Q (and, for QinQ, an 802.1ad outer) tags after the
// MACs of an Ethernet frame.
func tagged(frame []byte, qinq bool) []byte {
	out := append([]byte{}, frame[:12]...)
	if qinq {
		out = append(out, 0x88, 0xa8, 0x00, 0x09)
	}
	out = append(out, 0x81, 0x00, 0x00, 0x07)
	return append(out, frame[12:]...)
}

// Mizar's underlay is untagged: Geneve to a host in a tagged frame is
// dropped and counted. The switch port carries the tag in the frame (as a
// wire does: its tx VLAN offload off) and A's agent has turned A's VLAN
// stripping off (DisableVLANStripping), so the program sees the tag; the
// same frame untagged is delivered.
func TestTaggedGeneveDropped(t *testing.T) {
	tn := buildThreeHosts(t)
	a, b := tn.pods["a"], tn.pods["b"]
	A, C := tn.hosts["A"], tn.hosts["C"]
	M := addStranger(t, tn, "M", A)
	A.sw.do(t, func() error {
		return SetFeatures("pA", map[string]bool{"tx-vlan-hw-insert": false, "tx-vlan-stag-hw-insert": false})
	})
	A.ns.do(t, func() error { return DisableVLANStripping("ul0") })
	for i, qinq := range []bool{false, true} {
		marker := fmt.Sprintf("mizar-vlan-%d-%s", i, tn.sfx)
		// C's address and MAC, as a relay that got itself onto a VLAN.
		f := spoofed(t, M, C.ip, C.mac, A, vpc1, nil, markedUDP(b.ip, a.ip, marker), a)
		expectRefused(t, M, A, a, "drop_vlan", marker, tagged(f, qinq))
	}
	if !injects(t, C, A, b.ip, b.mac, a, "mizar-vlan-control-"+tn.sfx) {
		t.Fatal("control: C's untagged frame did not reach a")
	}
}

// A pod's broadcast storm stays on its host: pod a sends 400 frames to
// broadcast and multicast destinations in a burst; at most a second's worth
// (DefaultPodFloodRate, plus what the clock added meanwhile) become Geneve
// on the underlay, the rest are dropped and counted. Unicast to b is not
// limited at all.
func TestPodFloodLimited(t *testing.T) {
	tn := buildThreeHosts(t)
	a, b := tn.pods["a"], tn.pods["b"]
	A := tn.hosts["A"]
	bcast := mustMAC("ff:ff:ff:ff:ff:ff")
	var frames [][]byte
	for i, dst := range []string{"10.1.1.255", "255.255.255.255", "224.0.0.251", "239.1.2.3"} {
		for j := range 100 {
			p := markedUDP(a.ip, addr(dst), fmt.Sprintf("mizar-flood-%d-%d-%s", i, j, tn.sfx))
			p.srcMAC, p.dstMAC = a.mac, bcast
			if i >= 2 {
				p.dstMAC = mustMAC("01:00:5e:00:00:fb")
			}
			frames = append(frames, p.frame(t))
		}
	}
	capUL := tn.sw.capture(t, "pA")
	before := counters(t, A)
	start := time.Now()
	a.ns.sendRaw(t, "eth0", frames...)
	took := time.Since(start)
	settle()
	onWire := 0
	for _, f := range capUL.stop() {
		if bytes.Contains(f, []byte("mizar-flood-")) {
			onWire++
		}
	}
	after := counters(t, A)
	dropped := after.Pod["drop_flood"] - before.Pod["drop_flood"]
	allowed := DefaultPodFloodRate + int(took.Seconds()*DefaultPodFloodRate) + 2 // + racing CPUs
	if onWire > allowed || onWire < DefaultPodFloodRate/2 {
		t.Fatalf("%d of 400 flood frames left A (sent in %v), want about %d", onWire, took, DefaultPodFloodRate)
	}
	if int(dropped)+onWire != len(frames) {
		t.Fatalf("A counted %d drop_flood and %d frames left, of %d sent", dropped, onWire, len(frames))
	}
	// Unicast right after the storm is not limited.
	if out, ok := a.pingArgs(t, b.ip, 50, "-i", "0.01"); !ok || !strings.Contains(out, " 0% packet loss") {
		t.Fatalf("a -> b after the storm:\n%s", out)
	}
}
