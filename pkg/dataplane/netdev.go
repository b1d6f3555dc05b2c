package dataplane

import (
	"fmt"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/safchain/ethtool"
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
