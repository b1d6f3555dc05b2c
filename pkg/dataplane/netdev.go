package dataplane

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"

	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/safchain/ethtool"
	"github.com/vishvananda/netlink"
)

// GeneveOverhead is what mizar adds to every pod packet on the underlay:
// outer IPv4 20 + UDP 8 + Geneve 8 (no options) + inner Ethernet 14.
const GeneveOverhead = 50

// PodMTU is the MTU to give a pod's interface (and its host-side veth) so
// that its packets fit the underlay after encapsulation.
func PodMTU(underlayMTU int) (int, error) {
	const minIPv4MTU = 68
	if underlayMTU-GeneveOverhead < minIPv4MTU {
		return 0, fmt.Errorf("underlay MTU %d leaves less than %d bytes for pods", underlayMTU, minIPv4MTU)
	}
	return underlayMTU - GeneveOverhead, nil
}

// EnableGRO turns GRO on for ifname in the calling thread's netns.
//
// The node agent must do this for every pod's eth0 (inside the pod netns,
// EnableGROInNetns): the underlay program delivers into a pod by redirecting
// to its host-side veth, and a veth drops redirected frames unless its peer
// has NAPI, which GRO switches on (kernel >= 5.13). It also lets the pod's
// stack receive aggregated segments.
func EnableGRO(ifname string) error {
	return SetFeatures(ifname, map[string]bool{"rx-gro": true})
}

// EnableGROInNetns is EnableGRO inside the netns at nsPath (e.g. the pod's
// /var/run/netns/... or /proc/<pid>/ns/net).
func EnableGROInNetns(nsPath, ifname string) error {
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error { return EnableGRO(ifname) })
	if err != nil {
		return fmt.Errorf("in netns %s: %w", nsPath, err)
	}
	return nil
}

// vlanStripping are the ethtool features that move a received frame's VLAN
// tags into metadata (`ethtool -K dev rxvlan off` and its 802.1ad twin).
var vlanStripping = []string{"rx-vlan-hw-parse", "rx-vlan-stag-hw-parse"}

// DisableVLANStripping turns off the NIC's VLAN tag stripping on ifname
// (calling thread's netns), where the driver lets it: the underlay program
// drops Geneve that arrives tagged, and can only see a tag that stays in the
// frame. An error names the features the driver keeps on. (On a veth the
// tag a peer hands over in metadata stays there whatever this says.)
func DisableVLANStripping(ifname string) error {
	_, err := turnOffWhereOn(ifname, vlanStripping)
	return err
}

// turnOffWhereOn turns off those of features that are on on ifname (calling
// thread's netns) and returns their names, sorted.
func turnOffWhereOn(ifname string, features []string) ([]string, error) {
	e, err := ethtool.NewEthtool()
	if err != nil {
		return nil, fmt.Errorf("ethtool socket: %w", err)
	}
	defer e.Close()
	have, err := e.Features(ifname)
	if err != nil {
		return nil, fmt.Errorf("ethtool %s: read features: %w", ifname, err)
	}
	var on []string
	off := map[string]bool{}
	for _, f := range features {
		if have[f] {
			on = append(on, f)
			off[f] = false
		}
	}
	if len(on) == 0 {
		return nil, nil
	}
	slices.Sort(on)
	return on, SetFeatures(ifname, off)
}

// WireFeatures are the ethtool features (as `ethtool -k` names them) that
// make a veth behave like a NIC's wire when turned off: no segmentation and
// no checksum offload left for the receiver, so every frame is MTU-sized with
// complete checksums. A veth would otherwise pass 64 KB GSO packets no wire
// carries, and hand CHECKSUM_PARTIAL skbs to its peer, which an XDP program
// there sees as bytes only: a native XDP redirect into a pod loses the
// "checksum still to do" mark (the pod gets a TCP segment with only a
// pseudo-header sum), and a frame larger than a page is dropped before a
// program without frags support runs.
var WireFeatures = map[string]bool{
	"tx-checksum-ip-generic":       false,
	"tx-tcp-segmentation":          false,
	"tx-tcp6-segmentation":         false,
	"tx-generic-segmentation":      false,
	"tx-udp_tnl-segmentation":      false,
	"tx-udp_tnl-csum-segmentation": false,
}

// CompleteFrames turns off on ifname (calling thread's netns) those of
// WireFeatures that are on, and returns their names (sorted) so that they
// can be turned on again: what a node sends on a veth underlay then reaches
// the peer node's underlay program as a wire would carry it.
func CompleteFrames(ifname string) ([]string, error) {
	return turnOffWhereOn(ifname, slices.Collect(maps.Keys(WireFeatures)))
}

// SetFeatures sets ethtool features (names as `ethtool -k` prints them, e.g.
// "rx-gro", "tx-tcp-segmentation", "tx-generic-segmentation",
// "tx-checksum-ip-generic") on ifname in the calling thread's netns, and
// checks that the kernel applied them: a feature can be refused because
// another one it depends on is off.
func SetFeatures(ifname string, features map[string]bool) error {
	e, err := ethtool.NewEthtool()
	if err != nil {
		return fmt.Errorf("ethtool socket: %w", err)
	}
	defer e.Close()
	if err := e.Change(ifname, features); err != nil {
		return fmt.Errorf("ethtool %s: set %v: %w", ifname, features, err)
	}
	got, err := e.Features(ifname)
	if err != nil {
		return fmt.Errorf("ethtool %s: read features: %w", ifname, err)
	}
	for name, want := range features {
		if got[name] != want {
			return fmt.Errorf("ethtool %s: %s stayed %v (fixed, or depends on another feature)", ifname, name, got[name])
		}
	}
	return nil
}

// AttachXDPPass attaches a pass-only XDP program to ifname (calling thread's
// netns) in driver mode and returns the link; closing it detaches.
//
// Needed on the peer of a veth whose XDP program returns XDP_TX (a bouncer
// or divider on a veth underlay, as in netns test clusters): the veth hands
// XDP_TX frames to the peer's NAPI but, on kernel 6.18, kicks that NAPI only
// when the peer has an XDP program of its own (veth_xdp_flush); with GRO
// alone the frames wait in the ring until unrelated traffic arrives
// (measured: ping 300-900 ms, TCP handshakes timing out). Redirects into a
// veth (delivery to pods) flush unconditionally, so GRO suffices there.
func AttachXDPPass(ifname string) (link.Link, error) {
	iface, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("xdp pass on %s: %w", ifname, err)
	}
	var objs passObjects
	if err := loadPassObjects(&objs, nil); err != nil {
		return nil, fmt.Errorf("load pass program: %w", err)
	}
	defer objs.Close() // the link keeps the program alive
	l, err := link.AttachXDP(link.XDPOptions{Program: objs.MizarXdpPass, Interface: iface.Index, Flags: link.XDPDriverMode})
	if err != nil {
		return nil, fmt.Errorf("xdp pass on %s: %w", ifname, err)
	}
	return l, nil
}

// LinkDrops are the kernel's drop and error counters of one interface, from
// its netlink link statistics: losses after the programs returned, which
// their own counters cannot see (a redirect into a veth whose peer has no
// NAPI, a full queue, a peer that is down). The node agent exports them
// beside Counters.
type LinkDrops struct {
	Ifname    string
	Ifindex   int
	RxDropped uint64
	TxDropped uint64
	RxErrors  uint64
	TxErrors  uint64
}

// KernelDrops reads LinkDrops of the underlay interface and of every pod
// interface described in the pod_ifaces map, in the calling thread's netns
// (the host's). Pod interfaces that no longer exist are left out.
func (d *Datapath) KernelDrops() ([]LinkDrops, error) {
	pods, err := d.PodInterfaces()
	if err != nil {
		return nil, err
	}
	idx := []int{d.opts.UnderlayIfindex}
	for _, p := range pods {
		idx = append(idx, p.Ifindex)
	}
	out := make([]LinkDrops, 0, len(idx))
	for i, ifindex := range idx {
		l, err := netlink.LinkByIndex(ifindex)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if i > 0 && errors.As(err, &nf) {
				continue
			}
			return nil, fmt.Errorf("link statistics of ifindex %d: %w", ifindex, err)
		}
		a := l.Attrs()
		ld := LinkDrops{Ifname: a.Name, Ifindex: a.Index}
		if s := a.Statistics; s != nil {
			ld.RxDropped, ld.TxDropped, ld.RxErrors, ld.TxErrors = s.RxDropped, s.TxDropped, s.RxErrors, s.TxErrors
		}
		out = append(out, ld)
	}
	return out, nil
}
