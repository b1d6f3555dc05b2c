package dataplane

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"mizar.dev/test/ci"
)

// Verdicts, from the uapi headers.
const (
	xdpDrop     = 1
	xdpPass     = 2
	xdpTX       = 3
	xdpRedirect = 4

	tcOK       = 0
	tcShot     = 2
	tcRedirect = 7
)

func verdictName(prog *ebpf.Program, v uint32) string {
	if prog.Type() == ebpf.XDP {
		return map[uint32]string{0: "XDP_ABORTED", 1: "XDP_DROP", 2: "XDP_PASS", 3: "XDP_TX", 4: "XDP_REDIRECT"}[v]
	}
	return map[uint32]string{0: "TC_ACT_OK", 2: "TC_ACT_SHOT", 7: "TC_ACT_REDIRECT"}[v]
}

// requireRoot skips when the process cannot load BPF or create netns, except
// under CI (CI=true), where a skipped privileged test would pass unseen: there
// it fails.
func requireRoot(tb testing.TB) {
	tb.Helper()
	ci.RequireRoot(tb, "loads BPF programs and creates network namespaces (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN)")
}

func randSuffix(tb testing.TB) string {
	tb.Helper()
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// testPinRoot returns a private pin root under /sys/fs/bpf, removed (with
// every link pinned in it) when the test ends, pass or fail.
func testPinRoot(tb testing.TB) string {
	tb.Helper()
	if err := MountBPFFS("/sys/fs/bpf"); err != nil {
		tb.Fatal(err)
	}
	root := filepath.Join("/sys/fs/bpf", "mizar-test-"+randSuffix(tb))
	tb.Cleanup(func() {
		if err := Purge(root); err != nil {
			tb.Errorf("purge %s: %v", root, err)
		}
	})
	return root
}

// The host whose programs the unit tests run, and its underlay peers.
var (
	hostH = Hop{IP: netip.MustParseAddr("198.18.0.1"), MAC: mustMAC("02:00:00:00:00:01")}
	hostA = Hop{IP: netip.MustParseAddr("198.18.0.11"), MAC: mustMAC("02:00:00:00:00:11")}
	hostB = Hop{IP: netip.MustParseAddr("198.18.0.12"), MAC: mustMAC("02:00:00:00:00:12")}
	hostC = Hop{IP: netip.MustParseAddr("198.18.0.13"), MAC: mustMAC("02:00:00:00:00:13")}
	hostD = Hop{IP: netip.MustParseAddr("198.18.0.14"), MAC: mustMAC("02:00:00:00:00:14")}
)

// loadTest loads a datapath for host H with a private pin root. Underlay
// ifindex 1 (lo) is only a redirect target that BPF_PROG_TEST_RUN never
// follows.
func loadTest(tb testing.TB) *Datapath {
	tb.Helper()
	requireRoot(tb)
	// Loopback's MTU is 64 KB: 1500 is a true lower bound of it.
	d, err := Load(Options{PinRoot: testPinRoot(tb), UnderlayIfindex: 1, HostIP: hostH.IP, HostMAC: hostH.MAC, UnderlayMTU: 1500})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = d.Close() })
	return d
}

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

// run executes prog once on frame through BPF_PROG_TEST_RUN. Without a
// context, skb programs see the caller netns' loopback device (ifindex 1)
// as skb->ifindex, which is why the pod tests describe ifindex 1.
func run(tb testing.TB, prog *ebpf.Program, frame []byte) (uint32, []byte) {
	tb.Helper()
	out := make([]byte, len(frame)+512)
	opts := &ebpf.RunOptions{Data: frame, DataOut: out}
	ret, err := prog.Run(opts)
	if err != nil {
		tb.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret, opts.DataOut
}

// expectVerdict runs frame and checks the verdict and, when want is not nil,
// the exact output bytes.
func expectVerdict(tb testing.TB, prog *ebpf.Program, frame []byte, verdict uint32, want []byte) []byte {
	tb.Helper()
	ret, out := run(tb, prog, frame)
	if ret != verdict {
		tb.Fatalf("verdict %s (%d), want %s (%d)\ninput:\n%s", verdictName(prog, ret), ret,
			verdictName(prog, verdict), verdict, dump(frame))
	}
	if want != nil && !bytes.Equal(out, want) {
		tb.Fatalf("output differs from the expected frame\n got:\n%s\nwant:\n%s", dump(out), dump(want))
	}
	return out
}

func dump(b []byte) string {
	return gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.Default).Dump()
}

// counterDelta returns a function reporting how much each counter grew.
func counterDelta(tb testing.TB, d *Datapath) func() Counters {
	tb.Helper()
	before, err := d.Counters()
	if err != nil {
		tb.Fatal(err)
	}
	return func() Counters {
		after, err := d.Counters()
		if err != nil {
			tb.Fatal(err)
		}
		diff := Counters{Underlay: map[string]uint64{}, Pod: map[string]uint64{}}
		for k, v := range after.Underlay {
			if v != before.Underlay[k] {
				diff.Underlay[k] = v - before.Underlay[k]
			}
		}
		for k, v := range after.Pod {
			if v != before.Pod[k] {
				diff.Pod[k] = v - before.Pod[k]
			}
		}
		return diff
	}
}

// expectCounts checks that exactly the named counters moved, by one each.
func expectCounts(tb testing.TB, got map[string]uint64, names ...string) {
	tb.Helper()
	want := map[string]uint64{}
	for _, n := range names {
		want[n]++
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		tb.Fatalf("counters moved %v, want %v", got, want)
	}
}

// --- Frames, built with gopacket ---------------------------------------

func serialize(tb testing.TB, checksums bool, ls ...gopacket.SerializableLayer) []byte {
	tb.Helper()
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: checksums}, ls...); err != nil {
		tb.Fatalf("serialize: %v", err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

// inner describes a pod's packet.
type inner struct {
	srcMAC, dstMAC net.HardwareAddr
	src, dst       netip.Addr
	ttl, tos       uint8
	proto          layers.IPProtocol // TCP (default), UDP or ICMPv4
	sport, dport   uint16
	options        []layers.IPv4Option
	flags          layers.IPv4Flag
	fragOffset     uint16
	id             uint16
	payload        []byte
}

func (p inner) ip() *layers.IPv4 {
	ttl := p.ttl
	if ttl == 0 {
		ttl = 64
	}
	proto := p.proto
	if proto == 0 {
		proto = layers.IPProtocolTCP
	}
	return &layers.IPv4{
		Version: 4, TTL: ttl, TOS: p.tos, Protocol: proto, Id: p.id, Flags: p.flags, FragOffset: p.fragOffset,
		SrcIP: p.src.AsSlice(), DstIP: p.dst.AsSlice(), Options: p.options,
	}
}

// frame serializes the packet as the pod's eth0 sends it.
func (p inner) frame(tb testing.TB) []byte {
	tb.Helper()
	eth := &layers.Ethernet{SrcMAC: p.srcMAC, DstMAC: p.dstMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := p.ip()
	payload := gopacket.Payload(p.payload)
	if ip.Flags&layers.IPv4MoreFragments != 0 || ip.FragOffset != 0 {
		return serialize(tb, true, eth, ip, payload)
	}
	switch ip.Protocol {
	case layers.IPProtocolUDP:
		udp := &layers.UDP{SrcPort: layers.UDPPort(p.sport), DstPort: layers.UDPPort(p.dport)}
		_ = udp.SetNetworkLayerForChecksum(ip)
		return serialize(tb, true, eth, ip, udp, payload)
	case layers.IPProtocolICMPv4:
		icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 1, Seq: 1}
		return serialize(tb, true, eth, ip, icmp, payload)
	default:
		tcp := &layers.TCP{SrcPort: layers.TCPPort(p.sport), DstPort: layers.TCPPort(p.dport), Seq: 1, SYN: true, Window: 65535}
		_ = tcp.SetNetworkLayerForChecksum(ip)
		return serialize(tb, true, eth, ip, tcp, payload)
	}
}

// hash is the flow hash the pod-side program computes for this packet.
func (p inner) hash() uint32 {
	var ports uint32
	fragmented := p.flags&layers.IPv4MoreFragments != 0 || p.fragOffset != 0
	proto := p.proto
	if proto == 0 {
		proto = layers.IPProtocolTCP
	}
	if !fragmented && (proto == layers.IPProtocolTCP || proto == layers.IPProtocolUDP || proto == layers.IPProtocolSCTP) {
		ports = uint32(p.sport)<<16 | uint32(p.dport)
	}
	return flowHash(p.src, p.dst, ports, uint8(proto))
}

// outer describes the underlay headers of a Geneve frame.
type outer struct {
	srcMAC, dstMAC net.HardwareAddr
	src, dst       netip.Addr
	ttl, tos       uint8
	id             uint16
	sport          uint16
	udpCsum        uint16
	vni            uint32
	df             bool
	options        []*layers.GeneveOption
	ipOptions      []layers.IPv4Option
	flags          layers.IPv4Flag
	fragOffset     uint16
	geneveVersion  uint8
	protocol       layers.EthernetType // default TEB
	critical, oam  bool
}

// geneve wraps an inner frame: UDP (checksum as given, 0 by default, which
// is what mizar writes) and Geneve first, then outer Ethernet and IPv4 with a
// computed header checksum.
func (o outer) geneve(tb testing.TB, innerFrame []byte) []byte {
	tb.Helper()
	proto := o.protocol
	if proto == 0 {
		proto = layers.EthernetTypeTransparentEthernetBridging
	}
	udp := &layers.UDP{SrcPort: layers.UDPPort(o.sport), DstPort: 6081, Checksum: o.udpCsum}
	gnv := &layers.Geneve{Version: o.geneveVersion, Protocol: proto, VNI: o.vni, Options: o.options,
		CriticalOption: o.critical, OAMPacket: o.oam}
	l4 := serialize(tb, false, udp, gnv, gopacket.Payload(innerFrame))
	ttl := o.ttl
	if ttl == 0 {
		ttl = 64
	}
	flags := o.flags
	if o.df {
		flags |= layers.IPv4DontFragment
	}
	ip := &layers.IPv4{Version: 4, TTL: ttl, TOS: o.tos, Protocol: layers.IPProtocolUDP, Id: o.id, Flags: flags, FragOffset: o.fragOffset,
		SrcIP: o.src.AsSlice(), DstIP: o.dst.AsSlice(), Options: o.ipOptions}
	eth := &layers.Ethernet{SrcMAC: o.srcMAC, DstMAC: o.dstMAC, EthernetType: layers.EthernetTypeIPv4}
	return serialize(tb, true, eth, ip, gopacket.Payload(l4))
}

// mizarOptClass is MIZAR_OPT_CLASS (bpf/include/mizar.h): an experimental
// Geneve option class; legacyOptClass is the one mizar wrote before.
const (
	mizarOptClass  = 0xFF4D
	legacyOptClass = 0x0111
)

// srcHostOption is mizar's Geneve option naming the sending host.
func srcHostOption(host netip.Addr) []*layers.GeneveOption {
	return []*layers.GeneveOption{{Class: mizarOptClass, Type: 0x01, Data: host.AsSlice()}}
}

// withMACs returns a copy of an Ethernet frame with new MACs (nil = keep).
func withMACs(frame []byte, dst, src net.HardwareAddr) []byte {
	out := append([]byte(nil), frame...)
	if dst != nil {
		copy(out[0:6], dst)
	}
	if src != nil {
		copy(out[6:12], src)
	}
	return out
}

// --- The flow hash, mirrored from bpf/include/pkt.h ---------------------

func mix32(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x7feb352d
	h ^= h >> 15
	h *= 0x846ca68b
	h ^= h >> 16
	return h
}

func flowHash(src, dst netip.Addr, ports uint32, proto uint8) uint32 {
	s, d := src.As4(), dst.As4()
	h := binary.BigEndian.Uint32(s[:]) * 0x9e3779b1
	h ^= binary.BigEndian.Uint32(d[:]) * 0x85ebca77
	h ^= ports * 0xc2b2ae3d
	h ^= uint32(proto) * 0x27d4eb2f
	return mix32(h)
}

func flowSport(h uint32) uint16 { return 0xC000 | uint16(h&0x3FFF) }
