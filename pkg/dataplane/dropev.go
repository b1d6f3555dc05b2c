package dataplane

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// Drop events (bpf/include/dropev.h): the programs report dropped packets,
// the reason with the packet's first bytes, into a ring buffer, at most
// Options.DropEventBurst a jiffy per CPU; the rest are counted (as every
// drop is) and carried by the next report as Suppressed.

// DefaultDropEventBurst is Options.DropEventBurst's default: one report a
// jiffy per CPU (250 a second per CPU at HZ=250).
const DefaultDropEventBurst = 1

// DropEventPoll is how often ReadDropEvents looks for new reports.
const DropEventPoll = 100 * time.Millisecond

// DropEvent is one dropped packet as a program reported it.
type DropEvent struct {
	// Time is when the program dropped it.
	Time time.Time
	// Program is "underlay" (XDP on the underlay) or "pod" (TC on a pod's
	// veth); Reason is the drop counter it bumped (mizar_dataplane_packets_total's
	// reason), or "policy_<np counter>" for a NetworkPolicy drop.
	Program, Reason string
	// Ifindex is the interface it came in on (in the host netns).
	Ifindex uint32
	// Len is the packet's length.
	Len uint32
	// Suppressed counts the drops on the same CPU that were not reported
	// since the previous report (over the budget).
	Suppressed uint32
	// OuterSrc and OuterDst are the underlay addresses of a Geneve frame
	// (invalid for pod frames); VNI is its VNI (the pod's VNI is not in
	// its frame: 0).
	OuterSrc, OuterDst netip.Addr
	VNI                uint32
	// Src, Dst, Proto, SrcPort, DstPort describe the (inner) IPv4 packet,
	// where the frame held one.
	Src, Dst         netip.Addr
	Proto            uint8
	SrcPort, DstPort uint16
}

// String is the event in one line, as the agent logs it.
func (e DropEvent) String() string {
	s := fmt.Sprintf("%s %s ifindex %d", e.Program, e.Reason, e.Ifindex)
	if e.OuterSrc.IsValid() {
		s += fmt.Sprintf(" outer %s->%s vni %d", e.OuterSrc, e.OuterDst, e.VNI)
	}
	if e.Src.IsValid() {
		s += fmt.Sprintf(" %s %s", protoName(e.Proto), addrPort(e.Src, e.SrcPort))
		s += "->" + addrPort(e.Dst, e.DstPort)
	}
	return s
}

func addrPort(a netip.Addr, p uint16) string {
	if p == 0 {
		return a.String()
	}
	return netip.AddrPortFrom(a, p).String()
}

func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	}
	return fmt.Sprintf("proto-%d", p)
}

// DropEventsEnabled reports whether the programs were loaded to report drops.
func (d *Datapath) DropEventsEnabled() bool { return d.opts.DropEventBurst >= 0 }

// ReadDropEvents calls fn with every drop event the programs report until
// ctx ends (then it returns nil) or reading fails. One reader per Datapath.
func (d *Datapath) ReadDropEvents(ctx context.Context, fn func(DropEvent)) error {
	r, err := ringbuf.NewReader(d.objs.DropEvents)
	if err != nil {
		return fmt.Errorf("open the drop event ring: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = r.Close() })
	defer stop()
	defer r.Close()
	boot := monotonicOffset()
	var rec ringbuf.Record
	for {
		// The programs wake no reader (a wakeup per report would cost
		// them microseconds): poll.
		r.SetDeadline(time.Now().Add(DropEventPoll))
		if err := r.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue
			}
			if ctx.Err() != nil || errors.Is(err, os.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read the drop event ring: %w", err)
		}
		var raw mizarDropEvent
		if len(rec.RawSample) < int(unsafe.Sizeof(raw)) {
			continue
		}
		raw = *(*mizarDropEvent)(unsafe.Pointer(&rec.RawSample[0]))
		fn(d.decodeDropEvent(&raw, boot))
	}
}

// monotonicOffset is wall time minus CLOCK_MONOTONIC (bpf_ktime_get_ns).
func monotonicOffset() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(time.Now().UnixNano() - ts.Nano())
}

func (d *Datapath) decodeDropEvent(raw *mizarDropEvent, boot time.Duration) DropEvent {
	e := DropEvent{Time: time.Unix(0, int64(raw.Ns)+int64(boot)), Ifindex: raw.Ifindex, Len: raw.Len, Suppressed: raw.Suppressed}
	switch mizarDropHook(raw.Hook) {
	case mizarDropHookDROP_HOOK_UNDERLAY:
		e.Program = "underlay"
	case mizarDropHookDROP_HOOK_POD:
		e.Program = "pod"
	default:
		e.Program = fmt.Sprintf("hook-%d", raw.Hook)
	}
	e.Reason = d.reasonName(mizarDropSet(raw.Set), raw.Reason)
	n := min(int(raw.SnapLen), len(raw.Snap))
	e.parseFrame(raw.Snap[:n])
	return e
}

// reasonName names reason of set as the counters do.
func (d *Datapath) reasonName(set mizarDropSet, reason uint32) string {
	var names []string
	prefix := ""
	switch set {
	case mizarDropSetDROP_SET_UNDERLAY:
		names = d.underlayNames
	case mizarDropSetDROP_SET_POD:
		names = d.podNames
	case mizarDropSetDROP_SET_POLICY:
		names, prefix = d.npNames, "policy_"
	}
	if int(reason) < len(names) {
		return prefix + names[reason]
	}
	return fmt.Sprintf("set-%d-reason-%d", set, reason)
}

// parseFrame fills the addresses from an Ethernet frame: Geneve to the
// Geneve port (outer, then inner), or a plain IPv4 packet. What the frame
// is too short for stays unset.
func (e *DropEvent) parseFrame(b []byte) {
	l3, ok := ethIPv4(b)
	if !ok {
		return
	}
	ihl := int(l3[0]&0xf) * 4
	if l3[9] == unix.IPPROTO_UDP && ihl >= 20 && len(l3) >= ihl+16 && binary.BigEndian.Uint16(l3[ihl+2:]) == genevePort {
		e.OuterSrc, e.OuterDst = netip.AddrFrom4([4]byte(l3[12:16])), netip.AddrFrom4([4]byte(l3[16:20]))
		g := l3[ihl+8:]
		e.VNI = uint32(g[4])<<16 | uint32(g[5])<<8 | uint32(g[6])
		optlen := int(g[0]&0x3f) * 4
		if len(g) < 8+optlen {
			return
		}
		if l3, ok = ethIPv4(g[8+optlen:]); !ok {
			return
		}
		ihl = int(l3[0]&0xf) * 4
	}
	e.Src, e.Dst = netip.AddrFrom4([4]byte(l3[12:16])), netip.AddrFrom4([4]byte(l3[16:20]))
	e.Proto = l3[9]
	fragment := binary.BigEndian.Uint16(l3[6:])&0x1fff != 0
	switch e.Proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP:
		if !fragment && ihl >= 20 && len(l3) >= ihl+4 {
			e.SrcPort, e.DstPort = binary.BigEndian.Uint16(l3[ihl:]), binary.BigEndian.Uint16(l3[ihl+2:])
		}
	}
}

const genevePort = 6081

// ethIPv4 returns the IPv4 header and what follows in an untagged Ethernet
// frame, if it holds one (at least the fixed 20 bytes).
func ethIPv4(b []byte) ([]byte, bool) {
	if len(b) < 14+20 || binary.BigEndian.Uint16(b[12:]) != unix.ETH_P_IP || b[14]>>4 != 4 {
		return nil, false
	}
	return b[14:], true
}
