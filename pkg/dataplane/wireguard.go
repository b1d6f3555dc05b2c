package dataplane

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/crypto/curve25519"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
)

// The encrypted underlay, in userspace: wireguard-go (golang.zx2c4.com/
// wireguard) over a TAP device, for kernels without the WireGuard module.
//
// mizar's programs need an Ethernet underlay (XDP on its receive side, FIB
// lookups that yield MACs, XDP_TX), and a TUN or the kernel's wg device is an
// L3 device. So the underlay mizar attaches to is a TAP whose far side is
// WireGuard: what the kernel transmits on the TAP (Geneve from the pod
// programs, XDP_TX of a relay) is read here, stripped of its Ethernet header
// and handed to WireGuard, which encrypts it to the peer whose allowed IP is
// its destination; what WireGuard decrypts is given an Ethernet header and
// written to the TAP, where it arrives as the TAP's receive, through mizar's
// XDP program: the same programs and maps as on a plain underlay.
//
// Trust: WireGuard accepts a packet only from a peer whose key it holds, and
// only with an inner source inside that peer's allowed IPs (its droplet
// address), so every frame mizar's program sees on the TAP came from the
// droplet its outer source names. Geneve sent to a host's physical address
// or its TAP address from outside reaches no program: mizar runs on the TAP
// only, and the host stack has no Geneve socket.

// WireGuardOverhead is what the encrypted underlay adds to each packet:
// outer IPv4 (20) and UDP (8), WireGuard's data header (16) and tag (16).
const WireGuardOverhead = 20 + 8 + 16 + 16

// wgPeerMAC is the MAC of the TAP's far side: every frame WireGuard writes
// comes from it, and it answers ARP for every address.
var wgPeerMAC = net.HardwareAddr{0x02, 0x77, 0x67, 0x00, 0x00, 0x01}

// WireGuardKey is a Curve25519 key, private or public.
type WireGuardKey [32]byte

func (k WireGuardKey) String() string { return hex.EncodeToString(k[:]) }

// NewWireGuardKey makes a private key and returns it with its public key.
func NewWireGuardKey() (private, public WireGuardKey, err error) {
	if _, err = rand.Read(private[:]); err != nil {
		return private, public, err
	}
	private[0] &= 248
	private[31] = (private[31] & 127) | 64
	return private, PublicWireGuardKey(private), nil
}

// PublicWireGuardKey returns the public key of a private one.
func PublicWireGuardKey(private WireGuardKey) (public WireGuardKey) {
	pub, err := curve25519.X25519(private[:], curve25519.Basepoint)
	if err != nil {
		panic(err) // only for a low-order point, never the base point
	}
	copy(public[:], pub)
	return public
}

// WireGuardOptions configure StartWireGuard.
type WireGuardOptions struct {
	// Link is the TAP device's name; it becomes mizar's underlay.
	Link string
	// PrivateKey is this node's; ListenPort the UDP port of WireGuard on the
	// physical network (0: any).
	PrivateKey WireGuardKey
	ListenPort int
	// MTU of the TAP: the physical MTU less WireGuardOverhead.
	MTU int
}

// WireGuardPeer is another droplet: its key, where its WireGuard listens,
// and its droplet address (on its TAP), the only inner source accepted from
// it.
type WireGuardPeer struct {
	PublicKey WireGuardKey
	Endpoint  netip.AddrPort
	IP        netip.Addr
}

// WireGuard is a running userspace encrypted underlay.
type WireGuard struct {
	dev *device.Device
	tap *tapDevice

	mu    sync.Mutex
	pub   WireGuardKey
	peers map[WireGuardKey]WireGuardPeer // as configured
}

// StartWireGuard creates the TAP and the WireGuard device and opens its UDP
// socket. Call it in the network namespace they belong to (the TAP and the
// socket are made there, on the calling thread). The caller addresses the
// TAP, sets it up and attaches mizar to it.
func StartWireGuard(o WireGuardOptions) (*WireGuard, error) {
	tap, err := openTAP(o.Link, o.MTU)
	if err != nil {
		return nil, err
	}
	dev := device.NewDevice(tap, conn.NewDefaultBind(), device.NewLogger(device.LogLevelSilent, ""))
	conf := fmt.Sprintf("private_key=%s\nlisten_port=%d\n", o.PrivateKey, o.ListenPort)
	if err := dev.IpcSet(conf); err != nil {
		dev.Close()
		return nil, fmt.Errorf("configuring WireGuard: %w", err)
	}
	// Up here, not through a TUN event: its goroutine may run on a thread
	// of another network namespace, and the socket would open there.
	if err := dev.Up(); err != nil {
		dev.Close()
		return nil, fmt.Errorf("starting WireGuard: %w", err)
	}
	return &WireGuard{dev: dev, tap: tap, pub: PublicWireGuardKey(o.PrivateKey), peers: map[WireGuardKey]WireGuardPeer{}}, nil
}

// PublicKey is this node's current public key.
func (w *WireGuard) PublicKey() WireGuardKey {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pub
}

// Rotate replaces this node's key. Sessions are made anew as the peers
// learn the new public key (from the Droplet); packets meanwhile wait in
// WireGuard's queue or are lost and retransmitted, so established
// connections carry on.
func (w *WireGuard) Rotate(private WireGuardKey) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.dev.IpcSet(fmt.Sprintf("private_key=%s\n", private)); err != nil {
		return fmt.Errorf("rotating the WireGuard key: %w", err)
	}
	w.pub = PublicWireGuardKey(private)
	return nil
}

// SetPeers makes peers the set of peers. Only what changed is written: a
// peer kept keeps its session (a droplet's new key is a new peer, and the
// old key's sessions end when it is removed).
func (w *WireGuard) SetPeers(peers []WireGuardPeer) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	want := map[WireGuardKey]WireGuardPeer{}
	for _, p := range peers {
		want[p.PublicKey] = p
		if w.peers[p.PublicKey] == p {
			continue
		}
		fmt.Fprintf(&b, "public_key=%s\nendpoint=%s\nreplace_allowed_ips=true\nallowed_ip=%s/32\n", p.PublicKey, p.Endpoint, p.IP)
	}
	for k := range w.peers {
		if _, ok := want[k]; !ok {
			fmt.Fprintf(&b, "public_key=%s\nremove=true\n", k)
		}
	}
	if b.Len() == 0 {
		return nil
	}
	if err := w.dev.IpcSet(b.String()); err != nil {
		return fmt.Errorf("configuring WireGuard peers: %w", err)
	}
	w.peers = want
	return nil
}

// SetWireGuardNeighbours gives every droplet address the TAP's far side as
// its neighbour, in the current network namespace: the underlay program's
// FIB lookups (a relay's XDP_TX) find it at once, where ARP (answered too)
// would cost the first packets.
func SetWireGuardNeighbours(link string, ips []netip.Addr) error {
	l, err := netlink.LinkByName(link)
	if err != nil {
		return err
	}
	for _, ip := range ips {
		if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: wgPeerMAC}); err != nil {
			return fmt.Errorf("neighbour %s on %s: %w", ip, link, err)
		}
	}
	return nil
}

// ParseWireGuardKey reads a key as String writes it (hex).
func ParseWireGuardKey(s string) (WireGuardKey, error) {
	var k WireGuardKey
	b, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil || len(b) != len(k) {
		return k, fmt.Errorf("not a hex WireGuard key of %d bytes", len(k))
	}
	copy(k[:], b)
	return k, nil
}

// MAC is the TAP's MAC (keep it: frames written to the TAP are addressed to it).
func (w *WireGuard) MAC() net.HardwareAddr { return w.tap.mac }

// Close stops WireGuard and removes the TAP.
func (w *WireGuard) Close() error {
	w.dev.Close() // closes the TAP too
	return nil
}

// tapDevice is a tun.Device over a TAP: IPv4 packets in and out, Ethernet
// headers added and removed here, ARP answered here.
type tapDevice struct {
	f      *os.File
	name   string
	mtu    int
	mac    net.HardwareAddr
	events chan tun.Event
	once   sync.Once
}

const ethHeaderLen = 14

func openTAP(name string, mtu int) (*tapDevice, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("creating TAP %s: %w", name, err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	t := &tapDevice{f: os.NewFile(uintptr(fd), "/dev/net/tun"), name: name, mtu: mtu, events: make(chan tun.Event)}
	i, err := net.InterfaceByName(name)
	if err != nil {
		t.f.Close()
		return nil, err
	}
	t.mac = i.HardwareAddr
	return t, nil
}

func (t *tapDevice) File() *os.File           { return t.f }
func (t *tapDevice) MTU() (int, error)        { return t.mtu, nil }
func (t *tapDevice) Name() (string, error)    { return t.name, nil }
func (t *tapDevice) Events() <-chan tun.Event { return t.events }
func (t *tapDevice) BatchSize() int           { return 1 }

func (t *tapDevice) Close() error {
	t.once.Do(func() { close(t.events) })
	return t.f.Close()
}

// Read returns the next IPv4 packet the kernel transmitted on the TAP; ARP
// requests are answered on the way, anything else is dropped.
func (t *tapDevice) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if offset < ethHeaderLen {
		return 0, errors.New("tap: no room for the Ethernet header")
	}
	frame := bufs[0][offset-ethHeaderLen:]
	for {
		n, err := t.f.Read(frame)
		if err != nil {
			return 0, err
		}
		if n < ethHeaderLen {
			continue
		}
		switch binary.BigEndian.Uint16(frame[12:14]) {
		case unix.ETH_P_IP:
			sizes[0] = n - ethHeaderLen
			return 1, nil
		case unix.ETH_P_ARP:
			t.answerARP(frame[:n])
		}
	}
}

// answerARP replies to an ARP request for any address with wgPeerMAC: every
// droplet is behind the TAP's far side.
func (t *tapDevice) answerARP(req []byte) {
	arp := req[ethHeaderLen:]
	// Ethernet/IPv4 request: htype 1, ptype 0x0800, hlen 6, plen 4, op 1.
	if len(arp) < 28 || binary.BigEndian.Uint16(arp[0:2]) != 1 || binary.BigEndian.Uint16(arp[2:4]) != unix.ETH_P_IP ||
		arp[4] != 6 || arp[5] != 4 || binary.BigEndian.Uint16(arp[6:8]) != 1 {
		return
	}
	rep := make([]byte, ethHeaderLen+28)
	copy(rep[0:6], req[6:12])
	copy(rep[6:12], wgPeerMAC)
	binary.BigEndian.PutUint16(rep[12:14], unix.ETH_P_ARP)
	a := rep[ethHeaderLen:]
	copy(a[0:6], arp[0:6])
	binary.BigEndian.PutUint16(a[6:8], 2)
	copy(a[8:14], wgPeerMAC)
	copy(a[14:18], arp[24:28]) // sender: the address asked for
	copy(a[18:24], arp[8:14])  // target: the asker
	copy(a[24:28], arp[14:18])
	_, _ = t.f.Write(rep)
}

// Write hands packets WireGuard decrypted to the kernel as frames received
// on the TAP (from wgPeerMAC to the TAP's MAC).
func (t *tapDevice) Write(bufs [][]byte, offset int) (int, error) {
	if offset < ethHeaderLen {
		return 0, errors.New("tap: no room for the Ethernet header")
	}
	for i, b := range bufs {
		if len(b) <= offset || b[offset]>>4 != 4 {
			continue // IPv4 only: mizar's underlay is IPv4
		}
		h := b[offset-ethHeaderLen : offset]
		copy(h[0:6], t.mac)
		copy(h[6:12], wgPeerMAC)
		binary.BigEndian.PutUint16(h[12:14], unix.ETH_P_IP)
		if _, err := t.f.Write(b[offset-ethHeaderLen:]); err != nil {
			return i, err
		}
	}
	return len(bufs), nil
}
