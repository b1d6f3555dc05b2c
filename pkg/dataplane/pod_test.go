package dataplane

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// fromPod1 is a TCP packet pod1 sends to dst (its eth0 resolved every
// address to the gateway MAC, as the ARP replies below make it do).
func fromPod1(dst string) inner {
	return inner{srcMAC: pod1.MAC, dstMAC: pod1.GatewayMAC, src: pod1.IP, dst: addr(dst),
		ttl: 64, sport: 43210, dport: 8080, payload: []byte("payload from pod1")}
}

// encapTo is the outer header H writes toward a relay hop for packet p:
// fresh IPv4 header (TTL 64, DF, ID 0), source port from the flow hash, UDP
// checksum 0, and the sending-host option naming H.
func encapTo(hop Hop, p inner, vni uint32) outer {
	return outer{srcMAC: hostH.MAC, dstMAC: hop.MAC, src: hostH.IP, dst: hop.IP,
		ttl: 64, df: true, sport: flowSport(p.hash()), vni: vni, options: srcHostOption(hostH.IP)}
}

// direct is o sent straight to the destination's host: no option (after
// the flow's first packet, which introduces the pod: encapTo as is).
func (o outer) direct() outer {
	o.options = nil
	return o
}

func arpFrame(t testing.TB, op uint16, srcMAC, dstMAC net.HardwareAddr, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	return serialize(t, false,
		&layers.Ethernet{SrcMAC: srcMAC, DstMAC: dstMAC, EthernetType: layers.EthernetTypeARP},
		&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
			Operation: op, SourceHwAddress: sha, SourceProtAddress: spa.AsSlice(), DstHwAddress: tha, DstProtAddress: tpa.AsSlice()})
}

func TestPodARPReply(t *testing.T) {
	d := fixture(t)
	zero := make(net.HardwareAddr, 6)
	for _, target := range []netip.Addr{pod1.GatewayIP, addr("10.1.1.20"), addr("10.1.1.254")} {
		t.Run(target.String(), func(t *testing.T) {
			req := arpFrame(t, layers.ARPRequest, pod1.MAC, layers.EthernetBroadcast, pod1.MAC, pod1.IP, zero, target)
			reply := arpFrame(t, layers.ARPReply, pod1.GatewayMAC, pod1.MAC, pod1.GatewayMAC, target, pod1.MAC, pod1.IP)
			delta := counterDelta(t, d)
			expectVerdict(t, d.PodProgram(), req, tcRedirect, reply)
			expectCounts(t, delta().Pod, "arp_reply")
		})
	}
}

func TestPodARPNotAnswered(t *testing.T) {
	d := fixture(t)
	zero := make(net.HardwareAddr, 6)
	bcast := layers.EthernetBroadcast
	full := arpFrame(t, layers.ARPRequest, pod1.MAC, bcast, pod1.MAC, pod1.IP, zero, pod1.GatewayIP)
	cases := []struct {
		name  string
		frame []byte
		count string
	}{
		{"off-subnet target", arpFrame(t, layers.ARPRequest, pod1.MAC, bcast, pod1.MAC, pod1.IP, zero, addr("8.8.8.8")), "drop_arp"},
		{"gratuitous", arpFrame(t, layers.ARPRequest, pod1.MAC, bcast, pod1.MAC, pod1.IP, zero, pod1.IP), "drop_arp"},
		{"probe from 0.0.0.0", arpFrame(t, layers.ARPRequest, pod1.MAC, bcast, pod1.MAC, addr("0.0.0.0"), zero, pod1.GatewayIP), "drop_arp"},
		{"sender spoofs another address", arpFrame(t, layers.ARPRequest, pod1.MAC, bcast, pod1.MAC, addr("10.1.1.77"), zero, pod1.GatewayIP), "drop_arp"},
		{"reply from the pod", arpFrame(t, layers.ARPReply, pod1.MAC, pod1.GatewayMAC, pod1.MAC, pod1.IP, pod1.GatewayMAC, pod1.GatewayIP), "drop_arp"},
		{"truncated", full[:14+20], "drop_malformed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			delta := counterDelta(t, d)
			expectVerdict(t, d.PodProgram(), c.frame, tcShot, nil)
			expectCounts(t, delta().Pod, c.count)
		})
	}
}

func TestPodSameHostDelivery(t *testing.T) {
	d := fixture(t)
	p := fromPod1(epLocal.IP.String())
	delta := counterDelta(t, d)
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, withMACs(p.frame(t), epLocal.MAC, pod1.GatewayMAC))
	expectCounts(t, delta().Pod, "local")
}

func TestPodSameHostAcrossSubnets(t *testing.T) {
	d := fixture(t)
	p := fromPod1(epLocalS2.IP.String())
	routed := p
	routed.ttl--
	routed.srcMAC, routed.dstMAC = pod1.GatewayMAC, epLocalS2.MAC
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, routed.frame(t))
}

// Destination unknown here, inside pod1's subnet: to the subnet's bouncer.
// The output is compared byte for byte and also decoded back through
// gopacket's Geneve layer.
func TestPodEncapToBouncer(t *testing.T) {
	d := fixture(t)
	p := fromPod1("10.1.1.30")
	delta := counterDelta(t, d)
	out := expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, encapTo(hostC, p, vpc1).geneve(t, p.frame(t)))
	expectCounts(t, delta().Pod, "encap")

	pkt := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
	var got []gopacket.LayerType
	for _, l := range pkt.Layers() {
		got = append(got, l.LayerType())
	}
	want := []gopacket.LayerType{layers.LayerTypeEthernet, layers.LayerTypeIPv4, layers.LayerTypeUDP, layers.LayerTypeGeneve,
		layers.LayerTypeEthernet, layers.LayerTypeIPv4, layers.LayerTypeTCP, gopacket.LayerTypePayload}
	if len(got) != len(want) {
		t.Fatalf("decoded layers %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("decoded layers %v, want %v", got, want)
		}
	}
	gnv := pkt.Layer(layers.LayerTypeGeneve).(*layers.Geneve)
	udp := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
	ip := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if gnv.VNI != vpc1 || gnv.Protocol != layers.EthernetTypeTransparentEthernetBridging || gnv.Version != 0 {
		t.Errorf("geneve header %+v", gnv)
	}
	if udp.DstPort != 6081 || udp.SrcPort < 49152 {
		t.Errorf("outer UDP ports %d -> %d, want 49152.. -> 6081", udp.SrcPort, udp.DstPort)
	}
	if ip.TTL != 64 || ip.Flags&layers.IPv4DontFragment == 0 || int(ip.Length) != len(out)-14 {
		t.Errorf("outer IPv4 %+v", ip)
	}
}

// Destination host known (only a relay's node knows other hosts' endpoints):
// straight there, with the endpoint's MAC inside. The flow's first packet
// introduces pod1 (the sending-host option: the receiver, which may not know
// pod1, learns where it lives from a relay's word and answers directly); the
// next ones do not until half the learned lifetime has passed.
func TestPodEncapDirect(t *testing.T) {
	d := fixture(t)
	p := fromPod1(epRemote.IP.String())
	innerOut := withMACs(p.frame(t), epRemote.MAC, nil)
	delta := counterDelta(t, d)
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, encapTo(hostB, p, vpc1).geneve(t, innerOut))
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, encapTo(hostB, p, vpc1).direct().geneve(t, innerOut))
	expectCounts(t, delta().Pod, "introduce", "encap")

	// Without learning (lifetime 0) nothing is introduced.
	d, err := Load(Options{PinRoot: testPinRoot(t), UnderlayIfindex: 1, HostIP: hostH.IP, HostMAC: hostH.MAC, UnderlayMTU: 1500, LearnLifetime: -1})
	must(t, err)
	t.Cleanup(func() { _ = d.Close() })
	must(t, d.UpsertPodInterface(pod1))
	must(t, d.UpsertEndpoint(epPod1))
	must(t, d.UpsertEndpoint(epRemote))
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, encapTo(hostB, p, vpc1).direct().geneve(t, innerOut))
}

// Leaving the subnet: TTL - 1 (the gateway's hop), gateway as inner source;
// to the target subnet's bouncer when this host knows the subnet, else to a
// divider.
func TestPodEncapAcrossSubnets(t *testing.T) {
	d := fixture(t)
	for _, c := range []struct {
		dst string
		hop Hop
	}{{"10.1.2.30", hostB}, {"10.9.0.1", hostC}} {
		t.Run(c.dst, func(t *testing.T) {
			p := fromPod1(c.dst)
			routed := p
			routed.ttl--
			routed.srcMAC = pod1.GatewayMAC
			expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, encapTo(c.hop, p, vpc1).geneve(t, routed.frame(t)))
		})
	}
}

// The flow hash reads ports after IP options, skips them for fragments and
// portless protocols, and spreads flows over a subnet's bouncers.
func TestPodFlowHash(t *testing.T) {
	d := fixture(t)
	bouncers := s3Bouncers
	seen := map[string]bool{}
	var packets []inner
	for sport := uint16(1000); sport < 1012; sport++ {
		p := fromPod1("10.1.3.40")
		p.sport = sport
		packets = append(packets, p)
	}
	udp := fromPod1("10.1.3.40")
	udp.proto = layers.IPProtocolUDP
	icmp := fromPod1("10.1.3.40")
	icmp.proto = layers.IPProtocolICMPv4
	opts := fromPod1("10.1.3.40")
	opts.options = []layers.IPv4Option{{OptionType: 1}, {OptionType: 1}, {OptionType: 1}, {OptionType: 1}}
	frag := fromPod1("10.1.3.40")
	frag.flags = layers.IPv4MoreFragments
	frag.payload = make([]byte, 64)
	later := frag
	later.flags = 0
	later.fragOffset = 8
	packets = append(packets, udp, icmp, opts, frag, later)

	for _, p := range packets {
		h := p.hash()
		hop := bouncers[int(h&0x3FFF)%len(bouncers)]
		routed := p
		routed.ttl--
		routed.srcMAC = pod1.GatewayMAC
		expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, encapTo(hop, p, vpc1).geneve(t, routed.frame(t)))
		seen[hop.IP.String()] = true
	}
	if len(seen) != len(bouncers) {
		t.Fatalf("flows reached %v, want all %d bouncers", seen, len(bouncers))
	}
	if frag.hash() != later.hash() {
		t.Fatal("fragments of one datagram must hash alike")
	}
}

// Same-subnet traffic is not routed: a TTL of 1 still gets through.
func TestPodTTLOneInsideSubnet(t *testing.T) {
	d := fixture(t)
	p := fromPod1("10.1.1.30")
	p.ttl = 1
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, encapTo(hostC, p, vpc1).geneve(t, p.frame(t)))
}

func TestPodRejects(t *testing.T) {
	d := fixture(t)
	spoofed := fromPod1("10.1.1.20")
	spoofed.src = addr("10.1.1.11")
	ttl1 := fromPod1("10.1.2.30")
	ttl1.ttl = 1
	ip6 := &layers.IPv6{Version: 6, NextHeader: layers.IPProtocolNoNextHeader, HopLimit: 64,
		SrcIP: netip.MustParseAddr("fd00::1").AsSlice(), DstIP: netip.MustParseAddr("fd00::2").AsSlice()}
	ipv6 := serialize(t, true, &layers.Ethernet{SrcMAC: pod1.MAC, DstMAC: pod1.GatewayMAC, EthernetType: layers.EthernetTypeIPv6}, ip6)
	good := fromPod1("10.1.1.20").frame(t)
	badIHL := append([]byte(nil), good...)
	badIHL[14] = 0x44
	// A header claiming 60 bytes, cut right after the fixed 20.
	longIHL := append([]byte(nil), good[:14+20+6]...)
	longIHL[14] = 0x4f

	// No ICMP error about an ICMP error (RFC 1122 3.2.2).
	ttl1Err := ttl1
	ttl1Err.proto = layers.IPProtocolICMPv4
	ttl1Err.payload = nil
	ttl1ErrFrame := ttl1Err.frame(t)
	ttl1ErrFrame[14+20] = 3 // destination unreachable, not echo request
	binary.BigEndian.PutUint16(ttl1ErrFrame[14+20+2:], 0)

	cases := []struct {
		name  string
		frame []byte
		count string
	}{
		{"spoofed source", spoofed.frame(t), "drop_spoof"},
		{"IPv6", ipv6, "drop_not_ipv4"},
		// BPF_PROG_TEST_RUN refuses skbs of type IPv4 shorter than 34 bytes
		// (EINVAL), so the shortest IPv4 truncations are not expressible here;
		// the program checks them all the same (pull() before every read).
		{"IPv4 header options cut off", longIHL, "drop_malformed"},
		{"TCP without ports", good[:14+20+2], "drop_malformed"},
		{"IPv4 header length 16", badIHL, "drop_malformed"},
		{"TTL 1 leaving the subnet, ICMP error", ttl1ErrFrame, "drop_ttl"},
		{"VPC known, destination unknown", fromPod1("10.7.7.7").frame(t), ""},
	}
	// 10.7.7.7 is outside every subnet of VPC 100, whose divider is C: that
	// is not a reject, the divider decides. Make this host VPC 100's divider
	// and it becomes final here.
	if err := d.UpsertVPC(VPC{VNI: vpc1, Dividers: []Hop{hostH}}); err != nil {
		t.Fatal(err)
	}
	cases[len(cases)-1].count = "drop_unknown_dst"

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			delta := counterDelta(t, d)
			expectVerdict(t, d.PodProgram(), c.frame, tcShot, nil)
			expectCounts(t, delta().Pod, c.count)
		})
	}
}

func TestPodWithoutConfig(t *testing.T) {
	d := fixture(t)
	if err := d.DeletePodInterface(pod1.Ifindex); err != nil {
		t.Fatal(err)
	}
	delta := counterDelta(t, d)
	expectVerdict(t, d.PodProgram(), fromPod1("10.1.1.20").frame(t), tcShot, nil)
	expectCounts(t, delta().Pod, "drop_no_config")
}

func TestPodUnknownVNI(t *testing.T) {
	d := fixture(t)
	p := pod1
	p.VNI = unknownVNI
	if err := d.UpsertPodInterface(p); err != nil {
		t.Fatal(err)
	}
	delta := counterDelta(t, d)
	expectVerdict(t, d.PodProgram(), fromPod1("10.1.1.30").frame(t), tcShot, nil)
	expectCounts(t, delta().Pod, "drop_unknown_vni")
}

// A pod of VPC 200 on the same host, same addresses: it reaches VPC 200's
// 10.1.1.20 (here) and never VPC 100's pods.
func TestPodNoCrossingBetweenVPCs(t *testing.T) {
	d := fixture(t)
	p := pod1
	p.VNI = vpc2
	if err := d.UpsertPodInterface(p); err != nil {
		t.Fatal(err)
	}
	// VPC 100 would send 10.1.1.20 to host B; VPC 200 has it on this host.
	pkt := fromPod1("10.1.1.20")
	expectVerdict(t, d.PodProgram(), pkt.frame(t), tcRedirect, withMACs(pkt.frame(t), epVPC2.MAC, pod1.GatewayMAC))

	// 10.1.1.11 is a VPC 100 pod on this host; in VPC 200 it does not exist.
	delta := counterDelta(t, d)
	expectVerdict(t, d.PodProgram(), fromPod1(epLocal.IP.String()).frame(t), tcShot, nil)
	expectCounts(t, delta().Pod, "drop_unknown_dst")
}

// Frames leave a pod only as what the endpoint is: its MAC, untagged. (A tag
// in skb metadata, which BPF_PROG_TEST_RUN cannot set, is tested through the
// kernel in TestPodFramesNeverLeak.)
func TestPodLayer2Leaks(t *testing.T) {
	d := fixture(t)
	good := fromPod1("10.1.1.30")
	spoofed := good
	spoofed.srcMAC = mustMAC("02:aa:00:01:01:77")
	mcast := good
	mcast.srcMAC = mustMAC("01:00:5e:00:00:01")
	bcast := good
	bcast.srcMAC = layers.EthernetBroadcast
	tagged := func(tpid layers.EthernetType) []byte {
		return serialize(t, true,
			&layers.Ethernet{SrcMAC: pod1.MAC, DstMAC: pod1.GatewayMAC, EthernetType: tpid},
			&layers.Dot1Q{VLANIdentifier: 7, Type: layers.EthernetTypeIPv4}, good.ip(), gopacket.Payload(good.payload))
	}
	zero := make(net.HardwareAddr, 6)
	arpSpoof := arpFrame(t, layers.ARPRequest, spoofed.srcMAC, layers.EthernetBroadcast, pod1.MAC, pod1.IP, zero, pod1.GatewayIP)
	cases := []struct {
		name  string
		frame []byte
		count string
	}{
		{"spoofed source MAC", spoofed.frame(t), "drop_mac_spoof"},
		{"ARP from a spoofed MAC", arpSpoof, "drop_mac_spoof"},
		{"multicast source MAC", mcast.frame(t), "drop_mac_multicast"},
		{"broadcast source MAC", bcast.frame(t), "drop_mac_multicast"},
		{"802.1Q tag inline", tagged(layers.EthernetTypeDot1Q), "drop_vlan"},
		{"802.1ad tag inline", tagged(layers.EthernetTypeQinQ), "drop_vlan"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			delta := counterDelta(t, d)
			expectVerdict(t, d.PodProgram(), c.frame, tcShot, nil)
			expectCounts(t, delta().Pod, c.count)
		})
	}
}

// icmpError is what the pod-side program answers pod1 with about packet p:
// from the gateway, quoting p's IPv4 header and first 8 bytes after it.
func icmpError(t testing.TB, p inner, typ, code uint8, rest uint32) []byte {
	t.Helper()
	quoted := p.frame(t)[14 : 14+28]
	icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(typ, code)}
	icmp.Id, icmp.Seq = uint16(rest>>16), uint16(rest)
	return serialize(t, true,
		&layers.Ethernet{SrcMAC: pod1.GatewayMAC, DstMAC: pod1.MAC, EthernetType: layers.EthernetTypeIPv4},
		&layers.IPv4{Version: 4, TOS: 0xc0, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: pod1.GatewayIP.AsSlice(), DstIP: pod1.IP.AsSlice()},
		icmp, gopacket.Payload(quoted))
}

// Leaving the subnet with TTL 1 answers time exceeded from the gateway, so
// traceroute shows it; for TCP, UDP and ICMP echo alike.
func TestPodTTLExpiredAnswersICMP(t *testing.T) {
	d := fixture(t)
	for _, proto := range []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP, layers.IPProtocolICMPv4} {
		t.Run(proto.String(), func(t *testing.T) {
			p := fromPod1("10.1.2.30")
			p.ttl, p.proto = 1, proto
			delta := counterDelta(t, d)
			expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, icmpError(t, p, layers.ICMPv4TypeTimeExceeded, 0, 0))
			expectCounts(t, delta().Pod, "icmp_time_exceeded")
		})
	}
	// Inside the subnet there is no hop: TTL 1 goes through untouched.
	p := fromPod1(epLocal.IP.String())
	p.ttl = 1
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, withMACs(p.frame(t), epLocal.MAC, pod1.GatewayMAC))
}

// DSCP and ECN of the pod's packet are copied to the outer header.
func TestPodEncapCopiesDSCPAndECN(t *testing.T) {
	d := fixture(t)
	for _, tos := range []uint8{0xb8, 0xb9, 0x2a, 0x03} {
		p := fromPod1("10.1.1.30")
		p.tos = tos
		o := encapTo(hostC, p, vpc1)
		o.tos = tos
		expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, o.geneve(t, p.frame(t)))
	}
}
