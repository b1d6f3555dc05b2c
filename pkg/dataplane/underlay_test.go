package dataplane

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// fromA is the outer header of Geneve that host A sends to host H.
func fromA(vni uint32) outer {
	return outer{srcMAC: hostA.MAC, dstMAC: hostH.MAC, src: hostA.IP, dst: hostH.IP,
		ttl: 64, id: 0x1234, sport: 0xC123, udpCsum: 0xbeef, vni: vni, df: true}
}

// toward is what H must turn fromA into when forwarding to hop: new MACs and
// addresses, TTL - 1, UDP checksum 0, everything else (source port, IP ID,
// DF, Geneve, inner frame) kept.
func (o outer) toward(hop Hop) outer {
	o.srcMAC, o.dstMAC = hostH.MAC, hop.MAC
	o.src, o.dst = hostH.IP, hop.IP
	o.ttl--
	o.udpCsum = 0
	return o
}

// podPacket is a TCP packet from a pod on host A to dst.
func podPacket(dst string) inner {
	return inner{srcMAC: remoteMAC, dstMAC: pod1.GatewayMAC, src: addr("10.1.1.99"), dst: addr(dst),
		ttl: 64, sport: 40000, dport: 80, payload: []byte("hello mizar")}
}

func TestUnderlayDecapDeliver(t *testing.T) {
	d := fixture(t)
	in := podPacket("10.1.1.10").frame(t)
	delta := counterDelta(t, d)
	expectVerdict(t, d.UnderlayProgram(), fromA(vpc1).geneve(t, in), xdpRedirect, withMACs(in, pod1.MAC, nil))
	expectCounts(t, delta().Underlay, "rx", "deliver")
}

func TestUnderlayDecapSkipsNonCriticalOptions(t *testing.T) {
	d := fixture(t)
	in := podPacket("10.1.1.10").frame(t)
	o := fromA(vpc1)
	o.options = []*layers.GeneveOption{{Class: mizarOptClass, Type: 0x01, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8}}}
	expectVerdict(t, d.UnderlayProgram(), o.geneve(t, in), xdpRedirect, withMACs(in, pod1.MAC, nil))

	o.critical = true
	delta := counterDelta(t, d)
	expectVerdict(t, d.UnderlayProgram(), o.geneve(t, in), xdpDrop, nil)
	expectCounts(t, delta().Underlay, "rx", "drop_geneve")
}

func TestUnderlayBouncer(t *testing.T) {
	d := fixture(t)
	in := podPacket("10.1.1.20").frame(t)
	delta := counterDelta(t, d)
	expectVerdict(t, d.UnderlayProgram(), fromA(vpc1).geneve(t, in), xdpTX, fromA(vpc1).toward(hostB).geneve(t, in))
	expectCounts(t, delta().Underlay, "rx", "fwd_endpoint")
}

func TestUnderlayDividerToSubnetBouncer(t *testing.T) {
	d := fixture(t)
	in := podPacket("10.1.2.30").frame(t)
	delta := counterDelta(t, d)
	expectVerdict(t, d.UnderlayProgram(), fromA(vpc1).geneve(t, in), xdpTX, fromA(vpc1).toward(hostB).geneve(t, in))
	expectCounts(t, delta().Underlay, "rx", "fwd_subnet")
}

// A subnet with several bouncers: the flow entropy in the outer source port
// picks one, (port & 0x3fff) % n, the same rule the pod side uses.
func TestUnderlayDividerSpreadsByFlow(t *testing.T) {
	d := fixture(t)
	bouncers := s3Bouncers
	in := podPacket("10.1.3.7").frame(t)
	seen := map[string]bool{}
	for _, sport := range []uint16{0xC000, 0xC001, 0xC002, 0xFFFF, 0xD00D, 0xC0DE} {
		o := fromA(vpc1)
		o.sport = sport
		want := bouncers[int(sport&0x3FFF)%len(bouncers)]
		expectVerdict(t, d.UnderlayProgram(), o.geneve(t, in), xdpTX, o.toward(want).geneve(t, in))
		seen[want.IP.String()] = true
	}
	if len(seen) != len(bouncers) {
		t.Fatalf("flows reached %v, want all of %d bouncers", seen, len(bouncers))
	}
}

func TestUnderlayToDivider(t *testing.T) {
	d := fixture(t)
	in := podPacket("10.9.0.1").frame(t)
	delta := counterDelta(t, d)
	expectVerdict(t, d.UnderlayProgram(), fromA(vpc1).geneve(t, in), xdpTX, fromA(vpc1).toward(hostC).geneve(t, in))
	expectCounts(t, delta().Underlay, "rx", "fwd_divider")
}

// Two VPCs use 10.1.1.0/24. The VNI alone decides which one a packet is in.
func TestUnderlayNoCrossingBetweenVPCs(t *testing.T) {
	d := fixture(t)
	prog := d.UnderlayProgram()

	// 10.1.1.20 is a remote pod in VPC 100 and a local pod in VPC 200.
	in := podPacket("10.1.1.20").frame(t)
	expectVerdict(t, prog, fromA(vpc2).geneve(t, in), xdpRedirect, withMACs(in, epVPC2.MAC, nil))
	expectVerdict(t, prog, fromA(vpc1).geneve(t, in), xdpTX, fromA(vpc1).toward(hostB).geneve(t, in))

	// 10.1.1.10 exists only in VPC 100; H bounces VPC 200's 10.1.1.0/24, so
	// a miss there is final.
	delta := counterDelta(t, d)
	expectVerdict(t, prog, fromA(vpc2).geneve(t, podPacket("10.1.1.10").frame(t)), xdpDrop, nil)
	expectCounts(t, delta().Underlay, "rx", "drop_unknown_dst")

	// Outside every subnet of VPC 200, and H is its divider: dropped too.
	delta = counterDelta(t, d)
	expectVerdict(t, prog, fromA(vpc2).geneve(t, podPacket("10.7.0.1").frame(t)), xdpDrop, nil)
	expectCounts(t, delta().Underlay, "rx", "drop_unknown_dst")
}

func TestUnderlayUnknownVNI(t *testing.T) {
	d := fixture(t)
	delta := counterDelta(t, d)
	expectVerdict(t, d.UnderlayProgram(), fromA(unknownVNI).geneve(t, podPacket("10.1.1.10").frame(t)), xdpDrop, nil)
	expectCounts(t, delta().Underlay, "rx", "drop_unknown_vni")
}

func TestUnderlayStaleEndpointOnThisHost(t *testing.T) {
	d := fixture(t)
	// Remote according to its ifindex, but its host is H itself.
	if err := d.UpsertEndpoint(Endpoint{VNI: vpc1, IP: addr("10.1.1.50"), MAC: remoteMAC, HostIP: hostH.IP, HostMAC: hostH.MAC}); err != nil {
		t.Fatal(err)
	}
	delta := counterDelta(t, d)
	expectVerdict(t, d.UnderlayProgram(), fromA(vpc1).geneve(t, podPacket("10.1.1.50").frame(t)), xdpDrop, nil)
	expectCounts(t, delta().Underlay, "rx", "drop_unknown_dst")
}

func TestUnderlayTTLExpiry(t *testing.T) {
	d := fixture(t)
	o := fromA(vpc1)
	o.ttl = 1
	delta := counterDelta(t, d)
	expectVerdict(t, d.UnderlayProgram(), o.geneve(t, podPacket("10.1.1.20").frame(t)), xdpDrop, nil)
	expectCounts(t, delta().Underlay, "rx", "drop_ttl")

	// Delivery is not forwarding: the last hop accepts TTL 1.
	in := podPacket("10.1.1.10").frame(t)
	expectVerdict(t, d.UnderlayProgram(), o.geneve(t, in), xdpRedirect, withMACs(in, pod1.MAC, nil))
}

// Everything that is not well-formed Geneve for this host is either passed
// to the kernel untouched (not ours) or dropped and counted (ours, broken).
func TestUnderlayRejects(t *testing.T) {
	d := fixture(t)
	in := podPacket("10.1.1.10").frame(t)
	good := fromA(vpc1)

	arp := serialize(t, false,
		&layers.Ethernet{SrcMAC: hostA.MAC, DstMAC: layers.EthernetBroadcast, EthernetType: layers.EthernetTypeARP},
		&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
			Operation: layers.ARPRequest, SourceHwAddress: hostA.MAC, SourceProtAddress: hostA.IP.AsSlice(),
			DstHwAddress: make([]byte, 6), DstProtAddress: hostH.IP.AsSlice()})
	ip6 := &layers.IPv6{Version: 6, NextHeader: layers.IPProtocolUDP, HopLimit: 64,
		SrcIP: netip.MustParseAddr("fd00::1").AsSlice(), DstIP: netip.MustParseAddr("fd00::2").AsSlice()}
	udp6 := &layers.UDP{SrcPort: 0xC000, DstPort: 6081}
	_ = udp6.SetNetworkLayerForChecksum(ip6)
	ipv6 := serialize(t, true, &layers.Ethernet{SrcMAC: hostA.MAC, DstMAC: hostH.MAC, EthernetType: layers.EthernetTypeIPv6},
		ip6, udp6, gopacket.Payload(in))

	notForUs := good
	notForUs.dst = addr("198.18.0.99")
	withOpts := good
	withOpts.ipOptions = []layers.IPv4Option{{OptionType: 1}, {OptionType: 1}, {OptionType: 1}, {OptionType: 1}}
	firstFrag := good
	firstFrag.df = false
	firstFrag.flags = layers.IPv4MoreFragments
	laterFrag := good
	laterFrag.df = false
	laterFrag.fragOffset = 100
	v1 := good
	v1.geneveVersion = 1
	ipProto := good
	ipProto.protocol = layers.EthernetTypeIPv4
	oam := good
	oam.oam = true

	otherPort := func(port layers.UDPPort, opts []layers.IPv4Option) []byte {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: hostA.IP.AsSlice(), DstIP: hostH.IP.AsSlice(), Options: opts}
		udp := &layers.UDP{SrcPort: 5353, DstPort: port}
		_ = udp.SetNetworkLayerForChecksum(ip)
		return serialize(t, true, &layers.Ethernet{SrcMAC: hostA.MAC, DstMAC: hostH.MAC, EthernetType: layers.EthernetTypeIPv4},
			ip, udp, gopacket.Payload(in))
	}
	tcpTo6081 := func() []byte {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: hostA.IP.AsSlice(), DstIP: hostH.IP.AsSlice()}
		tcp := &layers.TCP{SrcPort: 5353, DstPort: 6081, SYN: true}
		_ = tcp.SetNetworkLayerForChecksum(ip)
		return serialize(t, true, &layers.Ethernet{SrcMAC: hostA.MAC, DstMAC: hostH.MAC, EthernetType: layers.EthernetTypeIPv4}, ip, tcp)
	}
	innerARP := good.geneve(t, arp)

	// The UDP length disagrees with the IP total length.
	badUDPLen := good.geneve(t, in)
	binary.BigEndian.PutUint16(badUDPLen[14+20+4:], 200)
	// An inner IPv4 header claiming 16 bytes.
	badInnerIHL := good.geneve(t, in)
	badInnerIHL[14+20+8+8+14] = 0x44

	cases := []struct {
		name    string
		frame   []byte
		verdict uint32
		counts  []string
	}{
		{"ARP on the underlay", arp, xdpPass, []string{"pass"}},
		{"IPv6 to port 6081", ipv6, xdpPass, []string{"pass"}},
		{"Geneve for another host", notForUs.geneve(t, in), xdpPass, []string{"pass"}},
		{"TCP to port 6081", tcpTo6081(), xdpPass, []string{"pass"}},
		{"UDP to another port", otherPort(4789, nil), xdpPass, []string{"pass"}},
		{"UDP with IP options to another port", otherPort(53, withOpts.ipOptions), xdpPass, []string{"pass"}},
		{"later fragment", laterFrag.geneve(t, in), xdpPass, []string{"pass"}},
		{"Geneve with IP options", withOpts.geneve(t, in), xdpDrop, []string{"rx", "drop_ip_options"}},
		{"Geneve first fragment", firstFrag.geneve(t, in), xdpDrop, []string{"rx", "drop_fragment"}},
		{"Geneve version 1", v1.geneve(t, in), xdpDrop, []string{"rx", "drop_geneve"}},
		{"Geneve carrying IPv4, not Ethernet", ipProto.geneve(t, in), xdpDrop, []string{"rx", "drop_geneve"}},
		{"Geneve OAM", oam.geneve(t, in), xdpDrop, []string{"rx", "drop_geneve"}},
		{"inner ARP", innerARP, xdpDrop, []string{"rx", "drop_inner_not_ipv4"}},
		{"UDP length inconsistent", badUDPLen, xdpDrop, []string{"rx", "drop_malformed"}},
		{"inner IPv4 header too short", badInnerIHL, xdpDrop, []string{"rx", "drop_malformed"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			delta := counterDelta(t, d)
			out := expectVerdict(t, d.UnderlayProgram(), c.frame, c.verdict, nil)
			if c.verdict == xdpPass && string(out) != string(c.frame) {
				t.Fatalf("passed frame was modified:\n%s", dump(out))
			}
			expectCounts(t, delta().Underlay, c.counts...)
		})
	}
}

// Every truncation of a good frame: cut inside the outer IPv4 or UDP header
// it cannot be known to be Geneve (pass); cut later it is ours and broken.
func TestUnderlayTruncated(t *testing.T) {
	d := fixture(t)
	frame := fromA(vpc1).geneve(t, podPacket("10.1.1.20").frame(t))
	const udpEnd = 14 + 20 + 8
	for n := 14; n < len(frame); n++ {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			delta := counterDelta(t, d)
			if n < udpEnd {
				expectVerdict(t, d.UnderlayProgram(), frame[:n], xdpPass, frame[:n])
				expectCounts(t, delta().Underlay, "pass")
				return
			}
			expectVerdict(t, d.UnderlayProgram(), frame[:n], xdpDrop, nil)
			expectCounts(t, delta().Underlay, "rx", "drop_malformed")
		})
	}
}

// Trust on the underlay: Geneve only from droplets, with a good outer
// header checksum, and an inner source that the outer source may speak for.
func TestUnderlayTrust(t *testing.T) {
	d := fixture(t)
	prog := d.UnderlayProgram()
	from := func(src Hop, vni uint32) outer {
		o := fromA(vni)
		o.src, o.srcMAC = src.IP, src.MAC
		return o
	}
	sentBy := func(src string, dst string) []byte {
		p := podPacket(dst)
		p.src = addr(src)
		return p.frame(t)
	}
	stranger := Hop{IP: addr("198.18.0.99"), MAC: mustMAC("02:00:00:00:00:99")}
	badSum := fromA(vpc1).geneve(t, podPacket("10.1.1.10").frame(t))
	badSum[14+10] ^= 0x01

	cases := []struct {
		name    string
		frame   []byte
		verdict uint32
		counts  []string
	}{
		{"not a droplet", from(stranger, vpc1).geneve(t, podPacket("10.1.1.10").frame(t)), xdpDrop, []string{"rx", "drop_not_droplet"}},
		{"not a droplet, to relay", from(stranger, vpc1).geneve(t, podPacket("10.1.1.20").frame(t)), xdpDrop, []string{"rx", "drop_not_droplet"}},
		{"outer IPv4 checksum wrong", badSum, xdpDrop, []string{"rx", "drop_ip_checksum"}},
		{"inner source unknown", fromA(vpc1).geneve(t, sentBy("10.1.1.77", "10.1.1.10")), xdpDrop, []string{"rx", "drop_src_unknown"}},
		{"inner source hosted by B", fromA(vpc1).geneve(t, sentBy(epRemote.IP.String(), "10.1.1.10")), xdpDrop, []string{"rx", "drop_src_spoofed"}},
		{"inner source is a pod of this host", fromA(vpc1).geneve(t, sentBy(epLocal.IP.String(), "10.1.1.10")), xdpDrop, []string{"rx", "drop_src_spoofed"}},
		{"inner source of another VNI", fromA(vpc1).geneve(t, sentBy(epOnlyA2.IP.String(), "10.1.1.10")), xdpDrop, []string{"rx", "drop_src_unknown"}},
		{"spoofed source not relayed", fromA(vpc1).geneve(t, sentBy("10.1.1.77", "10.1.1.20")), xdpDrop, []string{"rx", "drop_src_unknown"}},
		{"relay brings any source of its VPC", from(hostC, vpc1).geneve(t, sentBy("10.1.1.77", "10.1.1.10")), xdpRedirect, []string{"rx", "deliver"}},
		{"relay of another VPC only", from(hostC, vpc2).geneve(t, sentBy("10.1.1.77", "10.1.1.20")), xdpDrop, []string{"rx", "drop_src_unknown"}},
		{"plain host for its own pod", from(hostA, vpc2).geneve(t, sentBy(epOnlyA2.IP.String(), "10.1.1.20")), xdpRedirect, []string{"rx", "deliver"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			delta := counterDelta(t, d)
			expectVerdict(t, prog, c.frame, c.verdict, nil)
			expectCounts(t, delta().Underlay, c.counts...)
		})
	}

	// Forgetting a droplet, or a relay role, takes effect at once.
	relayed := from(hostC, vpc1).geneve(t, sentBy("10.1.1.77", "10.1.1.10"))
	must(t, d.SetRelays(vpc1, []netip.Addr{hostB.IP}))
	delta := counterDelta(t, d)
	expectVerdict(t, prog, relayed, xdpDrop, nil)
	expectCounts(t, delta().Underlay, "rx", "drop_src_unknown")
	must(t, d.DeleteDroplet(hostA.IP))
	delta = counterDelta(t, d)
	expectVerdict(t, prog, fromA(vpc1).geneve(t, podPacket("10.1.1.10").frame(t)), xdpDrop, nil)
	expectCounts(t, delta().Underlay, "rx", "drop_not_droplet")
}

// RFC 6040 decapsulation: CE on the outer header reaches an ECN-capable
// inner packet (checksum patched), is refused over a not-ECT one; ECT(1)
// outer over ECT(0) inner gives ECT(1); DSCP inside stays the sender's.
func TestUnderlayDecapECN(t *testing.T) {
	d := fixture(t)
	cases := []struct {
		outer, inner, want uint8 // TOS bytes
	}{
		{0x00, 0xb8, 0xb8},
		{0xb8, 0x00, 0x00}, // outer DSCP is not copied inward
		{0x03, 0xb9, 0xbb},
		{0x03, 0x2a, 0x2b},
		{0x03, 0x03, 0x03},
		{0x01, 0x02, 0x01},
		{0x02, 0x01, 0x01},
		{0x01, 0x00, 0x00},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("outer %#02x inner %#02x", c.outer, c.inner), func(t *testing.T) {
			p := podPacket("10.1.1.10")
			p.tos = c.inner
			o := fromA(vpc1)
			o.tos = c.outer
			want := p
			want.tos = c.want
			expectVerdict(t, d.UnderlayProgram(), o.geneve(t, p.frame(t)), xdpRedirect, withMACs(want.frame(t), pod1.MAC, nil))
		})
	}
	p := podPacket("10.1.1.10")
	o := fromA(vpc1)
	o.tos = 0x03
	delta := counterDelta(t, d)
	expectVerdict(t, d.UnderlayProgram(), o.geneve(t, p.frame(t)), xdpDrop, nil)
	expectCounts(t, delta().Underlay, "rx", "drop_ecn")
}
