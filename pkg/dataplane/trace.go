package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Tracing: what would the programs do with this packet? The packet runs
// through the loaded programs and their live maps (BPF_PROG_TEST_RUN: the
// real code decides, nothing is sent), and the per-CPU counters of the CPU
// it ran on name the path it took or the reason it was dropped. The run
// counts like a real packet, may report a drop event, and leaves what a
// real packet would (a learned or introduced host, a policy connection).

// TraceNext says where a traced packet goes after this host.
type TraceNext string

const (
	// NextDrop: dropped here (Trace.Drop says why).
	NextDrop TraceNext = "drop"
	// NextUnderlay: sent over the underlay to Trace.Host, Geneve-encapsulated
	// (Trace.Out is the frame that host receives).
	NextUnderlay TraceNext = "underlay"
	// NextPod: delivered to a pod of this host (Trace.Out is what it gets).
	NextPod TraceNext = "pod"
	// NextHost: handed to this node's own stack (an address of the node, or
	// not Geneve for mizar).
	NextHost TraceNext = "host"
	// NextReply: answered on the spot (ARP for the gateway, an ICMP error)
	// back into the sending pod.
	NextReply TraceNext = "reply"
)

// Trace is what one program did with a packet.
type Trace struct {
	// Program is "pod" (TC on a pod's veth) or "underlay" (XDP).
	Program string
	// Verdict is the program's return code by name (TC_ACT_SHOT, XDP_TX, ...).
	Verdict string
	// Counters are the counters the packet moved (mizar_dataplane_packets_total's
	// reasons; NetworkPolicy's prefixed "policy_"), sorted.
	Counters []string
	// Drop is the drop reason when Next is NextDrop.
	Drop string
	Next TraceNext
	// Host is the underlay address the packet goes to (NextUnderlay).
	Host netip.Addr
	// Out is the frame as the program left it.
	Out []byte
}

// String is the trace in one line.
func (t Trace) String() string {
	s := fmt.Sprintf("%s: %s", t.Program, t.Verdict)
	switch t.Next {
	case NextDrop:
		s += ": dropped: " + t.Drop
	case NextUnderlay:
		s += fmt.Sprintf(": to %s over the underlay", t.Host)
	case NextPod:
		s += ": delivered to a pod of this host"
	case NextHost:
		s += ": to this node's stack"
	case NextReply:
		s += ": answered back into the pod"
	}
	return s + " (" + strings.Join(t.Counters, ", ") + ")"
}

// TracePod runs frame through the pod program as if the pod behind host-side
// veth ifindex had sent it. ifindex must name a device in the caller's netns
// (the host netns: see the package comment).
func (d *Datapath) TracePod(ifindex int, frame []byte) (Trace, error) {
	if ifindex < 1 {
		return Trace{}, fmt.Errorf("trace: pod ifindex %d", ifindex)
	}
	ctx := skbContext{Ifindex: uint32(ifindex)}
	t, err := d.trace(d.objs.MizarPod, frame, &ctx)
	if err != nil {
		return t.Trace, err
	}
	t.Program = "pod"
	t.Verdict = map[uint32]string{0: "TC_ACT_OK", 2: "TC_ACT_SHOT", 7: "TC_ACT_REDIRECT"}[t.ret]
	switch t.ret {
	case 0:
		t.Next = NextHost
	case 7:
		switch {
		case slices.Contains(t.Counters, "arp_reply") || slices.Contains(t.Counters, "icmp_time_exceeded") ||
			slices.Contains(t.Counters, "icmp_frag_needed"):
			t.Next = NextReply
		case outerDst(t.Out).IsValid():
			t.Next, t.Host = NextUnderlay, outerDst(t.Out)
		default:
			t.Next = NextPod
		}
	default:
		t.Next = NextDrop
	}
	t.dropReason()
	return t.Trace, nil
}

// TraceUnderlay runs frame through the underlay program as if it had arrived
// on the underlay interface (in the caller's netns).
func (d *Datapath) TraceUnderlay(frame []byte) (Trace, error) {
	ctx := xdpContext{DataEnd: uint32(len(frame)), IngressIfindex: uint32(d.opts.UnderlayIfindex)}
	t, err := d.trace(d.objs.MizarUnderlay, frame, &ctx)
	if err != nil {
		return t.Trace, err
	}
	t.Program = "underlay"
	t.Verdict = map[uint32]string{0: "XDP_ABORTED", 1: "XDP_DROP", 2: "XDP_PASS", 3: "XDP_TX", 4: "XDP_REDIRECT"}[t.ret]
	switch {
	case t.ret == 2:
		t.Next = NextHost
	case t.ret == 1 || t.ret == 0:
		t.Next = NextDrop
	case slices.Contains(t.Counters, "deliver"):
		t.Next = NextPod
	default:
		t.Next, t.Host = NextUnderlay, outerDst(t.Out)
	}
	t.dropReason()
	return t.Trace, nil
}

type traced struct {
	Trace
	ret uint32
}

// dropReason fills Drop from the counters of a dropped packet.
func (t *traced) dropReason() {
	if t.Next != NextDrop {
		return
	}
	t.Drop = "unknown"
	for _, c := range t.Counters {
		if strings.HasPrefix(c, "drop_") || strings.HasPrefix(c, "policy_drop_") {
			t.Drop = c
			return
		}
	}
}

// skbContext is the head of struct __sk_buff that BPF_PROG_TEST_RUN takes
// (fields up to ifindex; the rest zero).
type skbContext struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto, Priority, IngressIfindex, Ifindex uint32
}

// xdpContext is struct xdp_md.
type xdpContext struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// traceAttempts bounds the runs trace makes when real traffic on the same
// CPU moves the counters in between.
const traceAttempts = 8

// trace runs prog once on frame on one CPU and reads which of that CPU's
// counters moved. Real packets on the same CPU between the two reads would
// move others: a run whose counters do not tell one story is repeated.
func (d *Datapath) trace(prog *ebpf.Program, frame []byte, ctx any) (traced, error) {
	pod := prog == d.objs.MizarPod
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var was unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		return traced{}, fmt.Errorf("trace: CPU affinity: %w", err)
	}
	cpu := -1
	for i := range len(was) * 64 { // every CPU a CPUSet can name
		if was.IsSet(i) {
			cpu = i
			break
		}
	}
	if cpu < 0 {
		return traced{}, errors.New("trace: no CPU to run on")
	}
	var one unix.CPUSet
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		return traced{}, fmt.Errorf("trace: pin to CPU %d: %w", cpu, err)
	}
	defer func() { _ = unix.SchedSetaffinity(0, &was) }()

	var last traced
	for range traceAttempts {
		before, err := d.cpuCounters(cpu, pod)
		if err != nil {
			return traced{}, err
		}
		out := make([]byte, len(frame)+256)
		opts := &ebpf.RunOptions{Data: frame, DataOut: out, Context: ctx}
		ret, err := prog.Run(opts)
		if err != nil {
			return traced{}, fmt.Errorf("trace: BPF_PROG_TEST_RUN: %w", err)
		}
		after, err := d.cpuCounters(cpu, pod)
		if err != nil {
			return traced{}, err
		}
		var moved []string
		for k, v := range after {
			if v != before[k] {
				moved = append(moved, k)
			}
		}
		slices.Sort(moved)
		last = traced{Trace: Trace{Counters: moved, Out: opts.DataOut}, ret: ret}
		if oneStory(moved) {
			return last, nil
		}
	}
	return last, fmt.Errorf("trace: traffic on CPU %d kept moving other counters (%v): no clear answer", cpu, last.Counters)
}

// oneStory: a packet ends in exactly one verdict counter (besides learn,
// stamp, rebounce, learn_refused and the policy's allows, which come on top
// of one).
func oneStory(moved []string) bool {
	verdicts := 0
	for _, c := range moved {
		switch {
		case strings.HasPrefix(c, "policy_allow") || c == "policy_recheck_kept":
		case c == "learn" || c == "stamp" || c == "rebounce" || c == "learn_refused":
		default:
			verdicts++
		}
	}
	return verdicts == 1
}

// cpuCounters reads one CPU's counters of one program (pod or underlay:
// their names overlap) and NetworkPolicy's, prefixed "policy_".
func (d *Datapath) cpuCounters(cpu int, pod bool) (map[string]uint64, error) {
	out := map[string]uint64{}
	read := func(m *ebpf.Map, names []string, prefix string) error {
		var per []uint64
		for i, name := range names {
			if err := m.Lookup(uint32(i), &per); err != nil {
				return fmt.Errorf("trace: read counter %s: %w", name, err)
			}
			if cpu < len(per) {
				out[prefix+name] = per[cpu]
			}
		}
		return nil
	}
	m, names := d.objs.UnderlayStats, d.underlayNames
	if pod {
		m, names = d.objs.PodStats, d.podNames
	}
	if err := read(m, names, ""); err != nil {
		return nil, err
	}
	if err := read(d.objs.NpStats, d.npNames, "policy_"); err != nil {
		return nil, err
	}
	return out, nil
}

// outerDst is the destination of a Geneve frame, invalid for others.
func outerDst(b []byte) netip.Addr {
	l3, ok := ethIPv4(b)
	if !ok {
		return netip.Addr{}
	}
	ihl := int(l3[0]&0xf) * 4
	if l3[9] != unix.IPPROTO_UDP || ihl < 20 || len(l3) < ihl+8 || binary.BigEndian.Uint16(l3[ihl+2:]) != genevePort {
		return netip.Addr{}
	}
	return netip.AddrFrom4([4]byte(l3[16:20]))
}

// TracePacket describes a packet to trace.
type TracePacket struct {
	SrcMAC, DstMAC net.HardwareAddr
	Src, Dst       netip.Addr
	// Proto is unix.IPPROTO_TCP (a SYN), IPPROTO_UDP or IPPROTO_ICMP (an
	// echo request); 0 means TCP.
	Proto            uint8
	SrcPort, DstPort uint16
	TTL              uint8 // 0 means 64
}

// Frame serializes p as a pod would send it: Ethernet, IPv4 with its
// checksum, and a TCP SYN, a UDP datagram or an ICMP echo request carrying
// "mizar trace".
func (p TracePacket) Frame() ([]byte, error) {
	if !p.Src.Is4() || !p.Dst.Is4() || len(p.SrcMAC) != 6 || len(p.DstMAC) != 6 {
		return nil, fmt.Errorf("trace packet: need IPv4 addresses and MACs, got %v -> %v, %v -> %v", p.Src, p.Dst, p.SrcMAC, p.DstMAC)
	}
	payload := []byte("mizar trace")
	var l4 []byte
	proto := p.Proto
	if proto == 0 {
		proto = unix.IPPROTO_TCP
	}
	switch proto {
	case unix.IPPROTO_TCP:
		l4 = make([]byte, 20)
		binary.BigEndian.PutUint16(l4[0:], p.SrcPort)
		binary.BigEndian.PutUint16(l4[2:], p.DstPort)
		binary.BigEndian.PutUint32(l4[4:], 1)
		l4[12] = 5 << 4
		l4[13] = 0x02 // SYN
		binary.BigEndian.PutUint16(l4[14:], 65535)
	case unix.IPPROTO_UDP:
		l4 = make([]byte, 8, 8+len(payload))
		binary.BigEndian.PutUint16(l4[0:], p.SrcPort)
		binary.BigEndian.PutUint16(l4[2:], p.DstPort)
		l4 = append(l4, payload...)
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	case unix.IPPROTO_ICMP:
		l4 = append([]byte{8, 0, 0, 0, 0x6d, 0x7a, 0, 1}, payload...)
		binary.BigEndian.PutUint16(l4[2:], InternetChecksum(l4, 0))
	default:
		return nil, fmt.Errorf("trace packet: protocol %d: want TCP, UDP or ICMP", proto)
	}
	ttl := p.TTL
	if ttl == 0 {
		ttl = 64
	}
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
	ip[8], ip[9] = ttl, proto
	src, dst := p.Src.As4(), p.Dst.As4()
	copy(ip[12:], src[:])
	copy(ip[16:], dst[:])
	binary.BigEndian.PutUint16(ip[10:], InternetChecksum(ip, 0))
	if proto != unix.IPPROTO_ICMP {
		// Pseudo-header: addresses, protocol, length.
		var sum uint32
		for i := 0; i < 8; i += 2 {
			sum += uint32(binary.BigEndian.Uint16(ip[12+i:]))
		}
		sum += uint32(proto) + uint32(len(l4))
		off := 16
		if proto == unix.IPPROTO_UDP {
			off = 6
		}
		binary.BigEndian.PutUint16(l4[off:], InternetChecksum(l4, sum))
	}
	f := make([]byte, 0, 14+len(ip)+len(l4))
	f = append(f, p.DstMAC...)
	f = append(f, p.SrcMAC...)
	f = append(f, 0x08, 0x00)
	f = append(f, ip...)
	return append(f, l4...), nil
}

// InternetChecksum is the Internet checksum (RFC 1071) of b, starting from sum.
func InternetChecksum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// WithoutGeneveOptions returns a Geneve frame without its options (others
// as they are): a traced frame from whoever asks must not teach this host
// a direct path the way a relay's sending-host option does.
func WithoutGeneveOptions(frame []byte) []byte {
	l3, ok := ethIPv4(frame)
	if !ok || !outerDst(frame).IsValid() {
		return frame
	}
	ihl := int(l3[0]&0xf) * 4
	if len(l3) < ihl+16 {
		return frame
	}
	g := l3[ihl+8:]
	optlen := int(g[0]&0x3f) * 4
	if optlen == 0 || len(g) < 8+optlen {
		return frame
	}
	at := 14 + ihl + 8 + 8 // the first option
	out := append(append([]byte(nil), frame[:at]...), frame[at+optlen:]...)
	ip := out[14:]
	binary.BigEndian.PutUint16(ip[2:], binary.BigEndian.Uint16(ip[2:])-uint16(optlen))
	binary.BigEndian.PutUint16(ip[10:], 0)
	binary.BigEndian.PutUint16(ip[10:], InternetChecksum(ip[:ihl], 0))
	udp := ip[ihl:]
	binary.BigEndian.PutUint16(udp[4:], binary.BigEndian.Uint16(udp[4:])-uint16(optlen))
	udp[8] &^= 0x3f // Geneve option length 0
	return out
}
