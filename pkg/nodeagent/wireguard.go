package nodeagent

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/dataplane"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// Encrypted mode (--encryption=wireguard): the droplets talk over WireGuard,
// and mizar's underlay is the TAP whose far side is WireGuard
// (dataplane.StartWireGuard): the same programs and maps as in plain mode.
// This is the userspace device (wireguard-go) in every case: the kernel's
// wireguard device is an L3 device, where mizar's XDP program (which needs
// Ethernet frames) cannot run; running its decisions at TC on that device
// is not built.

// EncryptionWireGuard is --encryption's one value besides "" (plain).
const EncryptionWireGuard = "wireguard"

// WireGuardLink is the TAP the encrypted underlay runs on.
const WireGuardLink = "mzwg0"

// DefaultWireGuardPort is WireGuard's port on the physical network.
const DefaultWireGuardPort = 51820

// wireGuardKey reads this node's private key from path, or makes one there
// (0600): made on the node, never sent anywhere.
func wireGuardKey(path string) (dataplane.WireGuardKey, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		return dataplane.ParseWireGuardKey(string(b))
	}
	if !errors.Is(err, os.ErrNotExist) {
		return dataplane.WireGuardKey{}, err
	}
	priv, _, err := dataplane.NewWireGuardKey()
	if err != nil {
		return priv, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return priv, err
	}
	if err := os.WriteFile(path, []byte(priv.String()+"\n"), 0o600); err != nil {
		return priv, err
	}
	klog.InfoS("Made this node's WireGuard key", "path", path)
	return priv, nil
}

// encryptedUnderlay starts WireGuard on the physical underlay phys (in the
// host netns) and the TAP with this droplet's address addr, and returns them
// with the annotations the droplet publishes.
func encryptedUnderlay(hostNetns string, phys *Underlay, keyPath string, port int, addr netip.Prefix) (*dataplane.WireGuard, map[string]string, error) {
	priv, err := wireGuardKey(keyPath)
	if err != nil {
		return nil, nil, fmt.Errorf("the WireGuard key: %w", err)
	}
	mtu := phys.MTU - dataplane.WireGuardOverhead
	var wg *dataplane.WireGuard
	start := func() error {
		if l, err := netlink.LinkByName(WireGuardLink); err == nil {
			_ = netlink.LinkDel(l) // an earlier run's, if it outlived it
		}
		wg, err = dataplane.StartWireGuard(dataplane.WireGuardOptions{Link: WireGuardLink, PrivateKey: priv, ListenPort: port, MTU: mtu})
		if err != nil {
			return err
		}
		l, err := netlink.LinkByName(WireGuardLink)
		if err == nil {
			err = netlink.LinkSetMTU(l, mtu)
		}
		if err == nil {
			err = netlink.AddrReplace(l, &netlink.Addr{IPNet: ipnet(addr)})
		}
		if err == nil {
			err = netlink.LinkSetUp(l)
		}
		if err != nil {
			_ = wg.Close()
		}
		return err
	}
	if hostNetns == "" {
		err = start()
	} else {
		err = ns.WithNetNSPath(hostNetns, func(ns.NetNS) error { return start() })
	}
	if err != nil {
		return nil, nil, fmt.Errorf("the encrypted underlay: %w", err)
	}
	klog.InfoS("Encrypted underlay: userspace WireGuard (wireguard-go) over a TAP", "tap", WireGuardLink, "address", addr,
		"physical", phys.Name, "port", port, "publicKey", dataplane.PublicWireGuardKey(priv))
	return wg, map[string]string{
		v1alpha1.DropletWireGuardKeyAnnotation:      dataplane.PublicWireGuardKey(priv).String(),
		v1alpha1.DropletWireGuardEndpointAnnotation: netip.AddrPortFrom(phys.HostIP.Addr(), uint16(port)).String(),
	}, nil
}

// rotateOnSIGHUP gives this node a new WireGuard key on every SIGHUP
// (rotateWireGuardKey) until ctx ends.
func rotateOnSIGHUP(ctx context.Context, client versioned.Interface, droplet string, wg *dataplane.WireGuard, keyPath string) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	defer signal.Stop(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
		if err := rotateWireGuardKey(ctx, client, droplet, wg, keyPath); err != nil {
			klog.ErrorS(err, "Rotating the WireGuard key failed; the old key stays in use")
			continue
		}
		klog.InfoS("Rotated the WireGuard key", "publicKey", wg.PublicKey())
	}
}

// rotateWireGuardKey makes a new key, keeps it on disk, uses it, and
// publishes its public key on the droplet: the other agents replace this
// peer's key, and established connections carry on across the new
// handshakes (dataplane.WireGuard.Rotate).
func rotateWireGuardKey(ctx context.Context, client versioned.Interface, droplet string, wg *dataplane.WireGuard, keyPath string) error {
	priv, pub, err := dataplane.NewWireGuardKey()
	if err != nil {
		return err
	}
	tmp := keyPath + ".new"
	if err := os.WriteFile(tmp, []byte(priv.String()+"\n"), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, keyPath); err != nil {
		return err
	}
	if err := wg.Rotate(priv); err != nil {
		return err
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.DropletWireGuardKeyAnnotation: pub.String()}}})
	if _, err := client.NetworkingV1alpha1().Droplets().Patch(ctx, droplet, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("publishing the new public key on droplet %s: %w", droplet, err)
	}
	return nil
}

// wireGuardAddress is --wireguard-address: as given, or for a bare prefix
// (its network address) the prefix with the host part of the node's physical
// address, so one chart value serves every node.
func wireGuardAddress(given netip.Prefix, phys netip.Addr) (netip.Prefix, error) {
	if given.Addr() != given.Masked().Addr() {
		return given, nil
	}
	p, h := given.Addr().As4(), phys.As4()
	pv, hv := binary.BigEndian.Uint32(p[:]), binary.BigEndian.Uint32(h[:])
	mask := uint32(0xffffffff) << (32 - given.Bits())
	var out [4]byte
	binary.BigEndian.PutUint32(out[:], pv&mask|hv&^mask)
	addr := netip.AddrFrom4(out)
	if addr == given.Addr() || hv&^mask == ^mask {
		return netip.Prefix{}, fmt.Errorf("--wireguard-address %s: the host part of %s makes %s, the prefix's network or broadcast address: give this node's address", given, phys, addr)
	}
	return netip.PrefixFrom(addr, given.Bits()), nil
}

// syncWireGuardPeers makes every other droplet that publishes a key a peer,
// allowed only its droplet address, with the TAP's far side as the
// neighbour of that address.
func (d *Datapath) syncWireGuardPeers(drops []*v1alpha1.Droplet) error {
	var peers []dataplane.WireGuardPeer
	var ips []netip.Addr
	for _, dr := range drops {
		if dr.Name == d.droplet {
			continue
		}
		ip, err1 := netip.ParseAddr(dr.Spec.IP)
		key, err2 := dataplane.ParseWireGuardKey(dr.Annotations[v1alpha1.DropletWireGuardKeyAnnotation])
		ep, err3 := netip.ParseAddrPort(dr.Annotations[v1alpha1.DropletWireGuardEndpointAnnotation])
		if err1 != nil || err2 != nil || err3 != nil {
			continue // a plain-mode droplet, or not yet published: unreachable from here
		}
		peers = append(peers, dataplane.WireGuardPeer{PublicKey: key, Endpoint: ep, IP: ip})
		ips = append(ips, ip)
	}
	if err := d.pods.inHost(func() error { return dataplane.SetWireGuardNeighbours(d.underlay, ips) }); err != nil {
		return err
	}
	return d.wg.SetPeers(peers)
}
