package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// The host path (bpf/include/hostpath.h) makes one VPC, the host VPC, the
// network of a Kubernetes cluster's pods:
//
//   - its pods' traffic to addresses outside the VPC goes to the host stack,
//     marked MarkHostVPC: kube-proxy translates Services there, and the node's
//     routing takes egress, masqueraded by this package's nftables rules;
//     to another droplet's address it goes straight to that droplet through
//     the overlay (so the node's own connections to pods get their replies
//     untranslated);
//   - the node reaches the VPC's pods on any droplet through a host device,
//     a veth pair (HostDevice in the host stack with a route for the VPC's
//     CIDR, its peer HostDevicePeer described to the pod program as a "pod"
//     whose address is the droplet's): what the node sends there is
//     encapsulated as this droplet's own traffic, and anything with another
//     source is dropped (drop_spoof), since a droplet speaks only for itself;
//   - Service traffic that kube-proxy DNATs to a pod is SNATed to the droplet
//     (when it comes from a pod, or leaves through the host device), so the
//     replies come back through this node's conntrack; pods of other VPCs
//     reach only this node's addresses, marked MarkOtherVPC, and are never
//     forwarded.
//
// SetHostPath installs all of it in the calling thread's netns (the host's)
// and RemoveHostPath takes it away; both are idempotent.

// The skb marks the pod program gives what it hands to the host stack, by
// the VPC the pod is in; the nftables rules below match them. kube-proxy
// uses 0x4000 and 0x8000.
const (
	MarkHostVPC  uint32 = 0x00400000
	MarkOtherVPC uint32 = 0x00800000
)

// Names of the host device pair and of the nftables table (family ip) that
// SetHostPath installs.
const (
	HostDevice     = "mizar_host"
	HostDevicePeer = "mizar_hostp"
	HostPathTable  = "mizar-hostpath"
)

// HostPath describes the host VPC to SetHostPath.
type HostPath struct {
	// VNI and CIDR of the host VPC.
	VNI  uint32
	CIDR netip.Prefix
	// HostIP is this droplet's underlay address: the source the node speaks
	// with inside the VPC (Options.HostIP).
	HostIP netip.Addr
	// MTU of the host device: the pods' (PodMTU).
	MTU int
}

func (hp HostPath) validate() error {
	if err := checkVNI(hp.VNI); err != nil {
		return fmt.Errorf("host path: %w", err)
	}
	if err := checkPrefix(hp.CIDR); err != nil {
		return fmt.Errorf("host path CIDR: %w", err)
	}
	if hp.CIDR != hp.CIDR.Masked() {
		return fmt.Errorf("host path CIDR %s has host bits set", hp.CIDR)
	}
	if _, err := ipv4("host path host IP", hp.HostIP); err != nil {
		return err
	}
	if hp.CIDR.Contains(hp.HostIP.Unmap()) {
		// The node's own address would be routed into the overlay.
		return fmt.Errorf("host path CIDR %s contains the droplet's address %s", hp.CIDR, hp.HostIP)
	}
	if hp.MTU < 68 {
		return fmt.Errorf("host path MTU %d: at least 68", hp.MTU)
	}
	return nil
}

// SetHostPath installs or updates the host path for hp in the calling
// thread's netns: the host device pair, the pod program on its peer, the
// route to hp.CIDR through it, the nftables table HostPathTable, IPv4
// forwarding, and the programs' hostpath map.
func (d *Datapath) SetHostPath(ctx context.Context, hp HostPath) (err error) {
	if err := hp.validate(); err != nil {
		return err
	}
	host, peer, err := ensureHostDevice(hp.MTU)
	if err != nil {
		return err
	}
	hostMAC := host.Attrs().HardwareAddr
	peerMAC := peer.Attrs().HardwareAddr
	// The peer is the node's interface in the VPC: packets from the host
	// device must come from the droplet's address (anything else is
	// dropped as spoofed), and its subnet is the droplet alone, so every
	// destination is a routed one.
	if err := d.UpsertPodInterface(PodInterface{Ifindex: peer.Attrs().Index, VNI: hp.VNI, IP: hp.HostIP, MAC: hostMAC,
		Subnet: netip.PrefixFrom(hp.HostIP.Unmap(), 32), GatewayIP: hp.HostIP, GatewayMAC: peerMAC}); err != nil {
		return fmt.Errorf("host device: %w", err)
	}
	if err := d.AttachPodAt(nil, HostDevicePeer); err != nil {
		return fmt.Errorf("host device: %w", err)
	}
	if err := d.putHostPath(hp.VNI, hp.CIDR, peer.Attrs().Index, hostMAC); err != nil {
		return err
	}
	r := &netlink.Route{LinkIndex: host.Attrs().Index, Dst: prefixIPNet(hp.CIDR), Src: hp.HostIP.AsSlice(),
		Scope: netlink.SCOPE_LINK, Protocol: hostPathRouteProtocol}
	if err := netlink.RouteReplace(r); err != nil {
		return fmt.Errorf("route %s through %s: %w", hp.CIDR, HostDevice, err)
	}
	if err := writeSysctl("net/ipv4/ip_forward", "1"); err != nil {
		return err
	}
	return syncHostPathRules(ctx, hp)
}

// hostPathRouteProtocol marks the host device's route (rtnetlink's "static"
// range), as the pods' host routes are.
const hostPathRouteProtocol = netlink.RouteProtocol(0x6d)

func (d *Datapath) putHostPath(vni uint32, cidr netip.Prefix, peerIfindex int, hostMAC net.HardwareAddr) (err error) {
	defer d.invalidate(&err) // the flow caches hold host-path decisions
	v := mizarHostpathCfg{Vni: vni, DevIfindex: uint32(peerIfindex), MarkHostVpc: MarkHostVPC, MarkOtherVpc: MarkOtherVPC}
	if vni != 0 {
		v.Cidr = cidr.Addr().Unmap().As4()
		copy(v.Mask[:], net.CIDRMask(cidr.Bits(), 32))
		if v.DevMac, err = mac("host device MAC", hostMAC); err != nil {
			return err
		}
	}
	if err := d.objs.Hostpath.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("put host path: %w", err)
	}
	return nil
}

// HostPathVNI reports the host VPC the programs serve (0: none).
func (d *Datapath) HostPathVNI() (uint32, error) {
	var v mizarHostpathCfg
	if err := d.objs.Hostpath.Lookup(uint32(0), &v); err != nil {
		return 0, fmt.Errorf("read host path: %w", err)
	}
	return v.Vni, nil
}

// RemoveHostPath turns the host path off: the programs stop using it, and
// the host device (with its route), its pod interface entry and the
// nftables table go. Nothing installed is not an error.
func (d *Datapath) RemoveHostPath(ctx context.Context) error {
	var errs []error
	errs = append(errs, d.putHostPath(0, netip.Prefix{}, 0, nil))
	if l, err := netlink.LinkByName(HostDevicePeer); err == nil {
		errs = append(errs, d.DeletePodInterface(l.Attrs().Index))
	}
	errs = append(errs, RemoveHostPathNode(ctx))
	return errors.Join(errs...)
}

// RemoveHostPathNode removes what SetHostPath put into the calling thread's
// netns (the host device pair, its route, the nftables table), without a
// loaded Datapath: for uninstall, next to Purge.
func RemoveHostPathNode(ctx context.Context) error {
	var errs []error
	if l, err := netlink.LinkByName(HostDevice); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", HostDevice, err))
		}
	} else if !isLinkNotFound(err) {
		errs = append(errs, fmt.Errorf("find %s: %w", HostDevice, err))
	}
	if err := removeHostPathRules(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func isLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

// ensureHostDevice creates the host device pair if it is missing and sets
// it up: the MTU of the pods; no ARP on the host side (its neighbours are
// all "at" its own MAC, which the program behind the peer ignores); GRO on
// the host side, whose NAPI the underlay program's redirects into the peer
// need (see EnableGRO); no IPv6, which the pod program would only drop.
func ensureHostDevice(mtu int) (host, peer netlink.Link, err error) {
	host, err = netlink.LinkByName(HostDevice)
	if isLinkNotFound(err) {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: HostDevice, MTU: mtu}, PeerName: HostDevicePeer, PeerMTU: uint32(mtu)}
		if err := netlink.LinkAdd(v); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, nil, fmt.Errorf("create %s: %w", HostDevice, err)
		}
		host, err = netlink.LinkByName(HostDevice)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("find %s: %w", HostDevice, err)
	}
	if host.Type() != "veth" {
		return nil, nil, fmt.Errorf("%s exists and is a %s, not mizar's veth", HostDevice, host.Type())
	}
	if peer, err = netlink.LinkByName(HostDevicePeer); err != nil {
		return nil, nil, fmt.Errorf("find %s: %w", HostDevicePeer, err)
	}
	for _, l := range []netlink.Link{host, peer} {
		name := l.Attrs().Name
		if l.Attrs().MTU != mtu {
			if err := netlink.LinkSetMTU(l, mtu); err != nil {
				return nil, nil, fmt.Errorf("MTU of %s: %w", name, err)
			}
		}
		if err := writeSysctl(filepath.Join("net/ipv6/conf", name, "disable_ipv6"), "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, nil, err
		}
	}
	if err := netlink.LinkSetARPOff(host); err != nil {
		return nil, nil, fmt.Errorf("no ARP on %s: %w", HostDevice, err)
	}
	for _, l := range []netlink.Link{peer, host} {
		if err := netlink.LinkSetUp(l); err != nil {
			return nil, nil, fmt.Errorf("set %s up: %w", l.Attrs().Name, err)
		}
	}
	if err := EnableGRO(HostDevice); err != nil {
		return nil, nil, err
	}
	// Fresh attributes (flags, MTU) for the callers.
	if host, err = netlink.LinkByName(HostDevice); err != nil {
		return nil, nil, fmt.Errorf("find %s: %w", HostDevice, err)
	}
	return host, peer, nil
}

// writeSysctl writes a sysctl of the calling thread's netns (/proc/sys
// shows the netns of the thread that opens it).
func writeSysctl(key, value string) error {
	path := filepath.Join("/proc/sys", key)
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
	}
	return nil
}

func prefixIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// syncHostPathRules writes the table HostPathTable in one nft transaction,
// replacing what an earlier call wrote. Its own table, so kube-proxy (either
// mode) and the node's other rules are left alone; its NAT chain runs just
// before the usual srcnat priority, so for Service flows into the VPC the
// droplet's address is chosen here and not by a MASQUERADE that picks the
// first address of any device (the host device has none).
func syncHostPathRules(ctx context.Context, hp HostPath) error {
	nft, err := knftables.New(knftables.IPv4Family, HostPathTable)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	cidr, self := hp.CIDR.String(), hp.HostIP.String()
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("mizar host path: Services and egress of the host VPC's pods")})
	post := &knftables.Chain{Name: "postrouting", Type: knftables.PtrTo(knftables.NATType),
		Hook: knftables.PtrTo(knftables.PostroutingHook), Priority: knftables.PtrTo(knftables.SNATPriority + "-1")}
	fwd := &knftables.Chain{Name: "forward", Type: knftables.PtrTo(knftables.FilterType),
		Hook: knftables.PtrTo(knftables.ForwardHook), Priority: knftables.PtrTo(knftables.FilterPriority + "-1")}
	for _, c := range []*knftables.Chain{post, fwd} {
		tx.Add(c)
		tx.Flush(c)
	}
	for _, r := range []struct{ chain, rule, why string }{
		// A pod's Service flow DNATed to a pod (here or elsewhere): the
		// backend's reply would go straight to the client pod, untranslated.
		{"postrouting", fmt.Sprintf("ct status dnat ip saddr %s ip daddr %s snat to %s", cidr, cidr, self),
			"Service flows between pods return through this node"},
		// NodePort and host-network clients DNATed to a pod of another
		// droplet: into the VPC the node speaks only as itself.
		{"postrouting", fmt.Sprintf("oifname %q ct status dnat ip saddr != %s snat to %s", HostDevice, self, self),
			"the node speaks for itself into the VPC"},
		{"postrouting", fmt.Sprintf("meta mark & %#x == %#x ip daddr != %s masquerade", MarkHostVPC, MarkHostVPC, cidr),
			"egress of the host VPC's pods"},
		{"forward", fmt.Sprintf("meta mark & %#x == %#x counter drop", MarkOtherVPC, MarkOtherVPC),
			"pods of other VPCs reach this node, never through it"},
	} {
		tx.Add(&knftables.Rule{Chain: r.chain, Rule: r.rule, Comment: knftables.PtrTo(r.why)})
	}
	if err := nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("nftables table %s: %w", HostPathTable, err)
	}
	return nil
}

// removeHostPathRules deletes the table HostPathTable; a missing one is not
// an error.
func removeHostPathRules(ctx context.Context) error {
	nft, err := knftables.New(knftables.IPv4Family, HostPathTable)
	if errors.Is(err, exec.ErrNotFound) {
		return nil // no nft here: nothing could have installed the table
	}
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{}) // so that the delete finds one
	tx.Delete(&knftables.Table{})
	if err := nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("delete nftables table %s: %w", HostPathTable, err)
	}
	return nil
}
