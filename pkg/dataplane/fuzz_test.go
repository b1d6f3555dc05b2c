package dataplane

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"
)

// Largest frame BPF_PROG_TEST_RUN takes for XDP (a page minus headroom and
// skb_shared_info).
const maxTestFrame = 3520

type ulClass int

const (
	ulNotOurs ulClass = iota // must be XDP_PASS, untouched
	ulBroken                 // Geneve for us, malformed: must be XDP_DROP
	ulValid                  // well-formed: the maps decide
)

// classifyUnderlay is an independent statement of what the underlay program
// owns, written from RFC 8926 and the rules in mizar.c's comments.
func classifyUnderlay(f []byte) (ulClass, int) {
	if len(f) < 34 || binary.BigEndian.Uint16(f[12:]) != 0x0800 {
		return ulNotOurs, 0
	}
	ip := f[14:]
	ihl := int(ip[0] & 0xf)
	h := hostH.IP.As4()
	if ip[0]>>4 != 4 || ihl < 5 || !bytes.Equal(ip[16:20], h[:]) || ip[9] != 17 {
		return ulNotOurs, 0
	}
	frag := binary.BigEndian.Uint16(ip[6:])
	if frag&0x1fff != 0 || len(f) < 14+ihl*4+8 || binary.BigEndian.Uint16(f[14+ihl*4+2:]) != 6081 {
		return ulNotOurs, 0
	}
	if ihl != 5 || frag&0x2000 != 0 || !ipv4HeaderOK(ip[:20]) || !droplets[netip.AddrFrom4([4]byte(ip[12:16]))] || len(f) < 50 {
		return ulBroken, 0
	}
	g := f[42:50]
	if g[0]>>6 != 0 || binary.BigEndian.Uint16(g[2:]) != 0x6558 || g[1]&0xc0 != 0 {
		return ulBroken, 0
	}
	innerEth := 50 + int(g[0]&0x3f)*4
	tot := int(binary.BigEndian.Uint16(ip[2:]))
	if len(f) < innerEth+34 || tot > len(f)-14 || 14+tot < innerEth+34 ||
		int(binary.BigEndian.Uint16(f[38:])) != tot-20 {
		return ulBroken, 0
	}
	if binary.BigEndian.Uint16(f[innerEth+12:]) != 0x0800 {
		return ulBroken, 0
	}
	if f[innerEth+14]>>4 != 4 || f[innerEth+14]&0xf < 5 {
		return ulBroken, 0
	}
	return ulValid, innerEth
}

// droplets are the fixture's: Geneve from anyone else is dropped.
var droplets = map[netip.Addr]bool{hostA.IP: true, hostB.IP: true, hostC.IP: true, hostD.IP: true}

func ipv4HeaderOK(h []byte) bool {
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return sum == 0xffff
}

func hasMAC(set []net.HardwareAddr, m []byte) bool {
	for _, s := range set {
		if bytes.Equal(s, m) {
			return true
		}
	}
	return false
}

func underlaySeeds(tb testing.TB) [][]byte {
	in := podPacket("10.1.1.10").frame(tb)
	opts := fromA(vpc1)
	opts.options = []*layers.GeneveOption{{Class: mizarOptClass, Type: 1, Data: []byte{1, 2, 3, 4}}}
	return [][]byte{
		fromA(vpc1).geneve(tb, in),
		fromA(vpc1).geneve(tb, podPacket("10.1.1.20").frame(tb)),
		fromA(vpc1).geneve(tb, podPacket("10.1.2.30").frame(tb)),
		fromA(vpc1).geneve(tb, podPacket("10.9.0.1").frame(tb)),
		fromA(vpc2).geneve(tb, podPacket("10.1.1.20").frame(tb)),
		fromA(unknownVNI).geneve(tb, in),
		opts.geneve(tb, in),
		in,
		make([]byte, 14),
		bytes.Repeat([]byte{0xff}, 100),
	}
}

// FuzzUnderlay: whatever arrives, the program returns PASS (unchanged) for
// what is not its own, DROP for its own garbage, and TX/REDIRECT only for
// well-formed Geneve, with outputs that are exactly a forward or a decap.
func FuzzUnderlay(f *testing.F) {
	d := fixture(f)
	for _, s := range underlaySeeds(f) {
		f.Add(s)
	}
	hops := map[string]bool{hostA.IP.String(): true, hostB.IP.String(): true, hostC.IP.String(): true, hostD.IP.String(): true}
	localMACs := []net.HardwareAddr{epPod1.MAC, epLocal.MAC, epLocalS2.MAC, epVPC2.MAC}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14 || len(frame) > maxTestFrame {
			return // outside what BPF_PROG_TEST_RUN accepts
		}
		ret, out := run(t, d.UnderlayProgram(), frame)
		class, innerEth := classifyUnderlay(frame)
		switch {
		case class == ulNotOurs:
			if ret != xdpPass || !bytes.Equal(out, frame) {
				t.Fatalf("not Geneve for this host: got %s, want untouched XDP_PASS\n%s", verdictName(d.UnderlayProgram(), ret), dump(frame))
			}
		case class == ulBroken:
			if ret != xdpDrop {
				t.Fatalf("malformed Geneve: got %s, want XDP_DROP\n%s", verdictName(d.UnderlayProgram(), ret), dump(frame))
			}
		case ret == xdpDrop:
			// Well-formed, but the maps hold no route: fine.
		case ret == xdpTX:
			// A relay writes the sender it verified into mizar's option.
			stamped := append([]byte(nil), frame...)
			if frame[42]&0x3f == 2 && binary.BigEndian.Uint16(frame[50:]) == mizarOptClass && frame[52] == 1 && frame[53]&0x1f == 1 {
				copy(stamped[54:58], frame[26:30])
			}
			if len(out) != len(frame) || !ipv4HeaderOK(out[14:34]) || !bytes.Equal(out[34:40], frame[34:40]) ||
				out[40] != 0 || out[41] != 0 || (!bytes.Equal(out[42:], frame[42:]) && !bytes.Equal(out[42:], stamped[42:])) ||
				out[22] != frame[22]-1 {
				t.Fatalf("XDP_TX output is not a forward of the input\n in:\n%s\nout:\n%s", dump(frame), dump(out))
			}
			if !hops[netip.AddrFrom4([4]byte(out[30:34])).String()] || !bytes.Equal(out[26:30], hostH.IP.AsSlice()) || !bytes.Equal(out[6:12], hostH.MAC) {
				t.Fatalf("forwarded to an unknown hop\n%s", dump(out))
			}
		case ret == xdpRedirect:
			want := frame[innerEth:]
			if len(out) != len(want) || !bytes.Equal(out[6:], want[6:]) || !hasMAC(localMACs, out[:6]) {
				t.Fatalf("XDP_REDIRECT output is not the decapsulated inner frame\n in:\n%s\nout:\n%s", dump(frame), dump(out))
			}
		default:
			t.Fatalf("verdict %s for well-formed Geneve\n%s", verdictName(d.UnderlayProgram(), ret), dump(frame))
		}
	})
}

// classifyPod says whether the pod program may act on a frame (anything
// else must be dropped): an ARP request from pod1 for an on-link address or
// the gateway, or IPv4 from pod1's address with a complete header.
func classifyPod(f []byte) bool {
	if len(f) < 14 || !bytes.Equal(f[6:12], pod1.MAC) {
		return false
	}
	switch binary.BigEndian.Uint16(f[12:]) {
	case 0x0806:
		if len(f) < 42 || binary.BigEndian.Uint16(f[14:]) != 1 || binary.BigEndian.Uint16(f[16:]) != 0x0800 ||
			f[18] != 6 || f[19] != 4 || binary.BigEndian.Uint16(f[20:]) != 1 {
			return false
		}
		spa, tpa := f[28:32], f[38:42]
		own, gw := pod1.IP.As4(), pod1.GatewayIP.As4()
		onLink := pod1.Subnet.Contains(netip.AddrFrom4([4]byte(tpa)))
		return bytes.Equal(spa, own[:]) && !bytes.Equal(tpa, own[:]) && (bytes.Equal(tpa, gw[:]) || onLink)
	case 0x0800:
		if len(f) < 34 || f[14]>>4 != 4 || f[14]&0xf < 5 {
			return false
		}
		own := pod1.IP.As4()
		if !bytes.Equal(f[26:30], own[:]) {
			return false
		}
		frag := binary.BigEndian.Uint16(f[20:])
		proto := f[23]
		if frag&0x3fff == 0 && (proto == 6 || proto == 17 || proto == 132) {
			return len(f) >= 14+int(f[14]&0xf)*4+4
		}
		return true
	}
	return false
}

// sameExceptTTL compares two IPv4 packets ignoring TTL and header checksum.
func sameExceptTTL(a, b []byte) bool {
	if len(a) != len(b) || len(a) < 20 {
		return false
	}
	return bytes.Equal(a[:8], b[:8]) && a[9] == b[9] && bytes.Equal(a[12:], b[12:])
}

func podSeeds(tb testing.TB) [][]byte {
	zero := make(net.HardwareAddr, 6)
	arp := serialize(tb, false,
		&layers.Ethernet{SrcMAC: pod1.MAC, DstMAC: layers.EthernetBroadcast, EthernetType: layers.EthernetTypeARP},
		&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
			Operation: layers.ARPRequest, SourceHwAddress: pod1.MAC, SourceProtAddress: pod1.IP.AsSlice(),
			DstHwAddress: zero, DstProtAddress: pod1.GatewayIP.AsSlice()})
	frag := fromPod1("10.1.3.40")
	frag.flags = layers.IPv4MoreFragments
	return [][]byte{
		arp,
		fromPod1("10.1.1.11").frame(tb),
		fromPod1("10.1.2.11").frame(tb),
		fromPod1("10.1.1.20").frame(tb),
		fromPod1("10.1.1.30").frame(tb),
		fromPod1("10.1.2.30").frame(tb),
		fromPod1("10.9.0.1").frame(tb),
		frag.frame(tb),
		make([]byte, 60),
		bytes.Repeat([]byte{0xff}, 100),
	}
}

// FuzzPod: the pod program drops anything that is not a well-formed packet
// from its pod; what it redirects is an ARP reply, a same-host delivery or a
// Geneve encapsulation of exactly the input.
func FuzzPod(f *testing.F) {
	d := fixture(f)
	for _, s := range podSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14 || len(frame) > maxTestFrame {
			return
		}
		out := make([]byte, len(frame)+512)
		opts := &ebpf.RunOptions{Data: frame, DataOut: out}
		ret, err := d.PodProgram().Run(opts)
		if errors.Is(err, unix.EINVAL) {
			// The test harness itself refuses IPv4/IPv6 skbs shorter than
			// their fixed header; the kernel never runs the program then.
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		out = opts.DataOut
		valid := classifyPod(frame)
		switch {
		case ret == tcShot:
		case ret != tcRedirect:
			t.Fatalf("verdict %s: the pod program only drops or redirects\n%s", verdictName(d.PodProgram(), ret), dump(frame))
		case !valid:
			t.Fatalf("redirected a frame that is not a well-formed packet of pod1\n%s", dump(frame))
		case binary.BigEndian.Uint16(frame[12:]) == 0x0806:
			if len(out) != len(frame) || !bytes.Equal(out[:6], frame[6:12]) || !bytes.Equal(out[6:12], pod1.GatewayMAC) ||
				binary.BigEndian.Uint16(out[20:]) != 2 || !bytes.Equal(out[22:28], pod1.GatewayMAC) {
				t.Fatalf("ARP output is not a reply from the gateway\n%s", dump(out))
			}
		case len(out) == 70 && bytes.Equal(out[:6], pod1.MAC) && bytes.Equal(out[6:12], pod1.GatewayMAC):
			// An ICMP error (time exceeded, fragmentation needed) from the
			// gateway to pod1, quoting the packet.
			gw, own := pod1.GatewayIP.As4(), pod1.IP.As4()
			if !ipv4HeaderOK(out[14:34]) || out[23] != 1 || !bytes.Equal(out[26:30], gw[:]) || !bytes.Equal(out[30:34], own[:]) ||
				(out[34] != 11 && out[34] != 3) || !sameExceptTTL(out[42:70], frame[14:42]) {
				t.Fatalf("ICMP error does not quote the input\n in:\n%s\nout:\n%s", dump(frame), dump(out))
			}
		case len(out) == len(frame):
			if !sameExceptTTL(out[14:], frame[14:]) || !bytes.Equal(out[6:12], pod1.GatewayMAC) {
				t.Fatalf("same-host delivery altered the packet\n in:\n%s\nout:\n%s", dump(frame), dump(out))
			}
		case len(out) == len(frame)+GeneveOverhead || len(out) == len(frame)+GeneveOverhead+8:
			// Through a relay the sending-host option (8 bytes) comes along.
			inner := 64 + len(out) - len(frame) - GeneveOverhead
			if !ipv4HeaderOK(out[14:34]) || !bytes.Equal(out[26:30], hostH.IP.AsSlice()) ||
				binary.BigEndian.Uint16(out[36:]) != 6081 || binary.BigEndian.Uint32(out[46:])>>8 != vpc1 ||
				int(out[42]&0x3f)*4 != inner-64 || !sameExceptTTL(out[inner:], frame[14:]) {
				t.Fatalf("encapsulation does not carry the input\n in:\n%s\nout:\n%s", dump(frame), dump(out))
			}
		default:
			t.Fatalf("redirected output of unexpected length %d (input %d)\n%s", len(out), len(frame), dump(out))
		}
	})
}
