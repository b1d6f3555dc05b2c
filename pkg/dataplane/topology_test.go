package dataplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// A test network on one machine, per DESIGN.md: hosts are network
// namespaces whose "ul0" veths hang off a bridge in a switch namespace (the
// underlay); pods are namespaces behind veths of their host. Nothing is
// created in the caller's namespace, and t.Cleanup removes every namespace
// (and with them every veth), process and pin, pass or fail.

// netNS is a named network namespace created for one test.
type netNS struct {
	name string
	ns   ns.NetNS
	nl   *netlink.Handle
}

func newNetNS(tb testing.TB, name string) *netNS {
	tb.Helper()
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: this thread moved into the new netns and dies
		// with the goroutine instead of going back to the scheduler.
		runtime.LockOSThread()
		h, err := netns.NewNamed(name)
		if err == nil {
			_ = h.Close()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		tb.Fatalf("create netns %s: %v", name, err)
	}
	n := &netNS{name: name}
	tb.Cleanup(func() {
		if n.nl != nil {
			n.nl.Close()
		}
		if n.ns != nil {
			_ = n.ns.Close()
		}
		if err := netns.DeleteNamed(name); err != nil {
			tb.Errorf("delete netns %s: %v", name, err)
		}
	})
	var err error
	if n.ns, err = ns.GetNS(n.path()); err != nil {
		tb.Fatalf("open netns %s: %v", name, err)
	}
	h, err := netns.GetFromPath(n.path())
	if err != nil {
		tb.Fatalf("open netns %s: %v", name, err)
	}
	defer h.Close()
	if n.nl, err = netlink.NewHandleAt(h); err != nil {
		tb.Fatalf("netlink in %s: %v", name, err)
	}
	lo, err := n.nl.LinkByName("lo")
	if err == nil {
		err = n.nl.LinkSetUp(lo)
	}
	if err != nil {
		tb.Fatalf("lo up in %s: %v", name, err)
	}
	return n
}

func (n *netNS) path() string { return filepath.Join("/run/netns", n.name) }

// do runs fn on a thread inside the namespace.
func (n *netNS) do(tb testing.TB, fn func() error) {
	tb.Helper()
	if err := n.ns.Do(func(ns.NetNS) error { return fn() }); err != nil {
		tb.Fatalf("in netns %s: %v", n.name, err)
	}
}

// exec runs a command inside the namespace and returns its output.
func (n *netNS) exec(ctx context.Context, name string, args ...string) (string, error) {
	var out []byte
	err := n.ns.Do(func(ns.NetNS) error {
		var err error
		// Forked from this locked thread, so the child is in the netns.
		out, err = exec.CommandContext(ctx, name, args...).CombinedOutput()
		return err
	})
	return string(out), err
}

// start runs a command in the background inside the namespace; it is killed
// when the test ends.
func (n *netNS) start(tb testing.TB, name string, args ...string) *exec.Cmd {
	tb.Helper()
	cmd := exec.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	n.do(tb, cmd.Start)
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// listen opens a TCP listener inside the namespace (the socket stays there
// whichever thread uses it later).
func (n *netNS) listen(tb testing.TB, addr string) net.Listener {
	tb.Helper()
	var l net.Listener
	n.do(tb, func() (err error) {
		l, err = net.Listen("tcp4", addr)
		return err
	})
	tb.Cleanup(func() { _ = l.Close() })
	return l
}

func (n *netNS) dial(ctx context.Context, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.ns.Do(func(ns.NetNS) error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp4", addr)
		return err
	})
	return c, err
}

// sendRaw writes whole Ethernet frames on an interface of the namespace
// through an AF_PACKET socket: they enter the kernel as if the namespace's
// stack had built them (a veth peer untags, runs tcx, and so on).
func (n *netNS) sendRaw(tb testing.TB, ifname string, frames ...[]byte) {
	tb.Helper()
	n.do(tb, func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6}
		for _, f := range frames {
			copy(to.Addr[:], f[:6])
			if err := unix.Sendto(fd, f, 0, to); err != nil {
				return fmt.Errorf("send on %s: %w", ifname, err)
			}
		}
		return nil
	})
}

// sendUDP sends one datagram with this IPv4 TOS byte from inside the
// namespace; its stack picks the source address and builds the headers.
func (n *netNS) sendUDP(tb testing.TB, dst netip.AddrPort, tos int, payload []byte) {
	tb.Helper()
	n.do(tb, func() error {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		defer c.Close()
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TOS, tos)
		}); err != nil || serr != nil {
			return fmt.Errorf("set IP_TOS: %w", errors.Join(err, serr))
		}
		_, err = c.Write(payload)
		return err
	})
}

func (n *netNS) sysctl(tb testing.TB, key, value string) {
	tb.Helper()
	n.do(tb, func() error {
		return os.WriteFile(filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/")), []byte(value), 0o644)
	})
}

type testHost struct {
	name    string
	ns      *netNS
	seg     *segment
	sw      *netNS // its segment's switch
	ip      netip.Addr
	mac     net.HardwareAddr
	ulIndex int
	dp      *Datapath
	// Encrypted underlay (encrypt): mizar's underlay is the WireGuard TAP
	// ul, ip and mac are its, phys the host's address on the segment, and
	// hops carry no MAC (the TAP's far side answers for every droplet).
	ul      string
	routed  bool
	phys    netip.Addr
	physMAC net.HardwareAddr
}

func (h *testHost) hop() Hop {
	if h.routed {
		return h.routedHop()
	}
	return Hop{IP: h.ip, MAC: h.mac}
}

// ulName is the link mizar's underlay program runs on.
func (h *testHost) ulName() string {
	if h.ul != "" {
		return h.ul
	}
	return "ul0"
}

// routedHop is h as a hop behind a router: no MAC, the FIB decides.
func (h *testHost) routedHop() Hop { return Hop{IP: h.ip} }

type testPod struct {
	name      string
	host      *testHost
	ns        *netNS
	vni       uint32
	ip        netip.Addr
	subnet    netip.Prefix
	mac       net.HardwareAddr
	hostIf    string
	hostIndex int
}

type podSpec struct {
	name, host string
	vni        uint32
	addr       string // ip/len
}

type testNet struct {
	sfx        string
	segs       []*segment
	routerLegs []routerLeg
	sw         *netNS // the first segment's switch
	// learn is Options.LearnLifetime for loadMizar (0: the default; < 0:
	// no direct-path learning, so bounced traffic stays bounced).
	learn time.Duration
	// xdpMode is Options.XDPMode for loadMizar.
	xdpMode XDPMode
	// netpol is Options.NetworkPolicy for loadMizar.
	netpol bool
	// services is Options.Services for loadMizar.
	services bool
	// ulMTU is the MTU of mizar's underlay (0: underlayMTU).
	ulMTU int
	hosts map[string]*testHost
	pods  map[string]*testPod
	order []*testHost
}

// gatewayMAC is what the pods' ARP for their gateway resolves to.
var gatewayMAC = mustMAC("02:fe:00:00:00:01")

const (
	underlayMTU = 1500
	podMTU      = underlayMTU - GeneveOverhead
)

// newTestNet builds the namespaces and links, every host on one underlay
// segment. Routing (plain, VXLAN, or mizar) is configured separately.
func newTestNet(tb testing.TB, hosts []string, pods []podSpec) *testNet {
	tb.Helper()
	requireRoot(tb)
	tn := &testNet{sfx: randSuffix(tb), hosts: map[string]*testHost{}, pods: map[string]*testPod{}}
	seg := tn.addSegment(tb, netip.MustParsePrefix("198.18.0.0/24"))
	tn.sw = seg.sw
	for _, name := range hosts {
		tn.addHost(tb, name)
	}
	for _, s := range pods {
		tn.addPod(tb, s)
	}
	return tn
}

// segment is one L2 underlay: a bridge in its own switch namespace.
type segment struct {
	sw     *netNS
	br     *netlink.Bridge
	prefix netip.Prefix
	router netip.Addr // the router's address here, once routedSegment ran
	hosts  int
}

func (tn *testNet) addSegment(tb testing.TB, prefix netip.Prefix) *segment {
	tb.Helper()
	seg := &segment{sw: newNetNS(tb, fmt.Sprintf("mzt-%s-sw%d", tn.sfx, len(tn.segs))), prefix: prefix,
		br: &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0", MTU: underlayMTU}}}
	must(tb, seg.sw.nl.LinkAdd(seg.br))
	must(tb, seg.sw.nl.LinkSetUp(seg.br))
	tn.segs = append(tn.segs, seg)
	return seg
}

// plug connects a namespace to a segment by a veth: "p"+name on the bridge,
// ifname inside, with addr and mac.
func (seg *segment) plug(tb testing.TB, n *netNS, name, ifname string, addr netip.Addr, mac net.HardwareAddr) netlink.Link {
	tb.Helper()
	port := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "p" + name, MTU: underlayMTU},
		PeerName: ifname, PeerHardwareAddr: mac, PeerNamespace: netlink.NsFd(n.ns.Fd()), PeerMTU: underlayMTU}
	must(tb, seg.sw.nl.LinkAdd(port))
	must(tb, seg.sw.nl.LinkSetMaster(port, seg.br))
	must(tb, seg.sw.nl.LinkSetUp(port))
	l, err := n.nl.LinkByName(ifname)
	must(tb, err)
	must(tb, n.nl.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(addr, seg.prefix.Bits()))}))
	must(tb, n.nl.LinkSetUp(l))
	return l
}

// routedSegment adds a second underlay segment, 198.18.1.0/24, and a router
// namespace between it and the first; hosts on either side route the other
// segment through it. Droplets on the two segments are not L2 neighbours.
func (tn *testNet) routedSegment(tb testing.TB) *segment {
	tb.Helper()
	near := tn.segs[0]
	far := tn.addSegment(tb, netip.MustParsePrefix("198.18.1.0/24"))
	r := newNetNS(tb, "mzt-"+tn.sfx+"-router")
	r.sysctl(tb, "net.ipv4.ip_forward", "1")
	near.router = netip.MustParseAddr("198.18.0.254")
	far.router = netip.MustParseAddr("198.18.1.254")
	tn.routerLegs = append(tn.routerLegs,
		routerLeg{r, "eth0", near, near.plug(tb, r, "R", "eth0", near.router, net.HardwareAddr{2, 0, 0, 0, 0xfe, 0})},
		routerLeg{r, "eth1", far, far.plug(tb, r, "R", "eth1", far.router, net.HardwareAddr{2, 0, 0, 0, 0xfe, 1})})
	for _, h := range tn.order {
		tn.routeAcross(tb, h)
	}
	return far
}

type routerLeg struct {
	ns     *netNS
	ifname string
	seg    *segment
	link   netlink.Link
}

// routeAcross routes, on host h, every other segment through the router.
func (tn *testNet) routeAcross(tb testing.TB, h *testHost) {
	tb.Helper()
	if !h.seg.router.IsValid() {
		return
	}
	for _, o := range tn.segs {
		if o != h.seg {
			must(tb, h.ns.nl.RouteAdd(&netlink.Route{Dst: prefixNet(o.prefix), Gw: h.seg.router.AsSlice(), LinkIndex: h.ulIndex}))
		}
	}
}

// addHost plugs a new host namespace into the first underlay segment.
// Hosts added after loadMizar are not droplets of the others: strangers on
// the underlay.
func (tn *testNet) addHost(tb testing.TB, name string) *testHost {
	tb.Helper()
	return tn.addHostOn(tb, tn.segs[0], name)
}

// addHostOn plugs a new host into a segment, with the next free address.
func (tn *testNet) addHostOn(tb testing.TB, seg *segment, name string) *testHost {
	tb.Helper()
	i := len(tn.order)
	base := seg.prefix.Addr().As4()
	base[3] = byte(11 + seg.hosts)
	seg.hosts++
	h := &testHost{
		name: name,
		ns:   newNetNS(tb, "mzt-"+tn.sfx+"-"+name),
		seg:  seg,
		ip:   netip.AddrFrom4(base),
		mac:  net.HardwareAddr{2, 0, 0, 0, 0, byte(0x11 + i)},
	}
	h.sw = seg.sw
	h.ulIndex = seg.plug(tb, h.ns, name, "ul0", h.ip, h.mac).Attrs().Index
	tn.hosts[name] = h
	tn.order = append(tn.order, h)
	tn.routeAcross(tb, h)
	return h
}

// addPod creates a pod namespace behind a veth of its host.
func (tn *testNet) addPod(tb testing.TB, s podSpec) *testPod {
	tb.Helper()
	h := tn.hosts[s.host]
	pfx := netip.MustParsePrefix(s.addr)
	p := &testPod{
		name: s.name, host: h, vni: s.vni, ip: pfx.Addr(), subnet: pfx.Masked(),
		ns:     newNetNS(tb, "mzt-"+tn.sfx+"-"+s.name),
		mac:    net.HardwareAddr{2, 0xaa, 0, 0, 0, byte(len(tn.pods) + 1)},
		hostIf: "mz" + s.name,
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p.hostIf, MTU: podMTU},
		PeerName: "eth0", PeerHardwareAddr: p.mac, PeerNamespace: netlink.NsFd(p.ns.ns.Fd()), PeerMTU: podMTU}
	must(tb, h.ns.nl.LinkAdd(veth))
	hl, err := h.ns.nl.LinkByName(p.hostIf)
	must(tb, err)
	must(tb, h.ns.nl.LinkSetUp(hl))
	p.hostIndex = hl.Attrs().Index
	eth0, err := p.ns.nl.LinkByName("eth0")
	must(tb, err)
	must(tb, p.ns.nl.AddrAdd(eth0, &netlink.Addr{IPNet: prefixNet(pfx)}))
	must(tb, p.ns.nl.LinkSetUp(eth0))
	gw := gatewayOf(p.subnet)
	must(tb, p.ns.nl.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw.AsSlice(), Flags: int(netlink.FLAG_ONLINK)}))
	// The underlay program redirects into the host-side veth; the veth
	// delivers only if this end has NAPI (GRO on).
	must(tb, EnableGROInNetns(p.ns.path(), "eth0"))
	tn.pods[s.name] = p
	return p
}

func gatewayOf(subnet netip.Prefix) netip.Addr { return subnet.Addr().Next() }

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

// wireMode applies WireFeatures to both ends of every underlay veth.
func (tn *testNet) wireMode(tb testing.TB) {
	tb.Helper()
	for _, h := range tn.order {
		h.ns.do(tb, func() error { return SetFeatures("ul0", WireFeatures) })
		h.sw.do(tb, func() error { return SetFeatures("p"+h.name, WireFeatures) })
	}
	for _, l := range tn.routerLegs {
		l.ns.do(tb, func() error { return SetFeatures(l.ifname, WireFeatures) })
		l.seg.sw.do(tb, func() error { return SetFeatures("pR", WireFeatures) })
	}
}

// xdpTXToSwitch lets host's XDP_TX reach the bridge: a pass-only XDP
// program on the switch-side peer (see AttachXDPPass for why GRO is not
// enough). A NIC needs nothing of the kind.
func (tn *testNet) xdpTXToSwitch(tb testing.TB, host string) {
	tb.Helper()
	tn.hosts[host].sw.do(tb, func() error {
		l, err := AttachXDPPass("p" + host)
		if err != nil {
			return err
		}
		tb.Cleanup(func() { _ = l.Close() })
		return nil
	})
}

// loadMizar loads and attaches mizar on a host and registers its pods:
// interface description, local endpoint, pod-side program.
func (tn *testNet) loadMizar(tb testing.TB, h *testHost) {
	tb.Helper()
	ulMTU := tn.ulMTU
	if ulMTU == 0 {
		ulMTU = underlayMTU
	}
	h.ns.do(tb, func() error {
		dp, err := Load(Options{PinRoot: testPinRoot(tb), UnderlayIfindex: h.ulIndex, HostIP: h.ip, HostMAC: h.mac, LearnLifetime: tn.learn, XDPMode: tn.xdpMode,
			UnderlayMTU: ulMTU, NetworkPolicy: tn.netpol, Services: tn.services})
		if err != nil {
			return err
		}
		tb.Cleanup(func() { _ = dp.Close() })
		h.dp = dp
		return dp.AttachUnderlay(h.ulName())
	})
	// Every host of the test net is a droplet, as the agent would learn
	// from the Droplets in the API, with their MACs when on h's segment.
	for _, o := range tn.order {
		if o.seg == h.seg {
			must(tb, h.dp.UpsertDroplet(o.hop()))
		} else {
			must(tb, h.dp.UpsertDroplet(o.routedHop()))
		}
	}
	for _, p := range tn.pods {
		if p.host != h {
			continue
		}
		must(tb, h.dp.UpsertPodInterface(PodInterface{
			Ifindex: p.hostIndex, VNI: p.vni, IP: p.ip, MAC: p.mac, Subnet: p.subnet,
			GatewayIP: gatewayOf(p.subnet), GatewayMAC: gatewayMAC,
		}))
		must(tb, h.dp.UpsertEndpoint(Endpoint{VNI: p.vni, IP: p.ip, MAC: p.mac, HostIP: h.ip, HostMAC: h.mac, Ifindex: p.hostIndex}))
		h.ns.do(tb, func() error { return h.dp.AttachPod(p.hostIf) })
	}
}

// setRelays tells every loaded host which hosts bounce or divide for a VPC.
func (tn *testNet) setRelays(tb testing.TB, vni uint32, relays ...*testHost) {
	tb.Helper()
	ips := make([]netip.Addr, 0, len(relays))
	for _, r := range relays {
		ips = append(ips, r.ip)
	}
	for _, h := range tn.order {
		if h.dp != nil {
			must(tb, h.dp.SetRelays(vni, ips))
		}
	}
}

// remoteEndpoint tells host h where pod p lives.
func (tn *testNet) remoteEndpoint(tb testing.TB, h *testHost, p *testPod) {
	tb.Helper()
	var hostMAC net.HardwareAddr // behind a router: the FIB decides
	if h.seg == p.host.seg && !p.host.routed {
		hostMAC = p.host.mac
	}
	must(tb, h.dp.UpsertEndpoint(Endpoint{VNI: p.vni, IP: p.ip, MAC: p.mac, HostIP: p.host.ip, HostMAC: hostMAC}))
}

// ping runs count pings from pod src to dst and reports success.
func (p *testPod) ping(tb testing.TB, dst netip.Addr, count int) (string, bool) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(count+3)*time.Second)
	defer cancel()
	out, err := p.ns.exec(ctx, "ping", "-n", "-q", "-c", fmt.Sprint(count), "-i", "0.2", "-W", "1", dst.String())
	return out, err == nil
}

// capture records frames seen on an interface of a namespace.
type capture struct {
	h      *pcapgo.EthernetHandle
	mu     sync.Mutex
	frames [][]byte
	done   chan struct{}
}

func (n *netNS) capture(tb testing.TB, ifname string) *capture {
	tb.Helper()
	c := &capture{done: make(chan struct{})}
	n.do(tb, func() (err error) {
		c.h, err = pcapgo.NewEthernetHandle(ifname)
		return err
	})
	go func() {
		defer close(c.done)
		for {
			data, _, err := c.h.ReadPacketData()
			if err != nil {
				return
			}
			c.mu.Lock()
			c.frames = append(c.frames, append([]byte(nil), data...))
			c.mu.Unlock()
		}
	}()
	tb.Cleanup(func() { c.stop() })
	return c
}

func (c *capture) stop() [][]byte {
	_ = c.h.Close()
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames
}

// plainRouting routes pod addresses between hosts without encapsulation:
// each host proxies ARP for remote pods on the pod's veth and routes them to
// their host over the underlay.
func (tn *testNet) plainRouting(tb testing.TB) {
	tb.Helper()
	tn.hostRoutes(tb, func(o *testHost, p *testPod) {
		must(tb, o.ns.nl.RouteAdd(&netlink.Route{Dst: prefixNet(netip.PrefixFrom(p.ip, 32)), Gw: p.host.ip.AsSlice(), LinkIndex: o.ulIndex}))
	})
}

// vxlan is the kernel's overlay on the same topology: one VXLAN device per
// host (VNI 42, UDP 4789, no learning) with static neighbour and FDB entries
// for remote pods, as flannel's vxlan backend programs them.
func (tn *testNet) vxlan(tb testing.TB) {
	tb.Helper()
	vxMAC := func(h *testHost) net.HardwareAddr { return net.HardwareAddr{2, 0xfd, 0, 0, 0, h.mac[5]} }
	vx := map[*testHost]int{}
	for _, h := range tn.order {
		l := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vx0", MTU: podMTU, HardwareAddr: vxMAC(h)},
			VxlanId: 42, SrcAddr: h.ip.AsSlice(), Port: 4789, VtepDevIndex: h.ulIndex}
		must(tb, h.ns.nl.LinkAdd(l))
		must(tb, h.ns.nl.LinkSetUp(l))
		vx[h] = l.Attrs().Index
	}
	tn.hostRoutes(tb, func(o *testHost, p *testPod) {
		must(tb, o.ns.nl.RouteAdd(&netlink.Route{Dst: prefixNet(netip.PrefixFrom(p.ip, 32)), LinkIndex: vx[o], Scope: netlink.SCOPE_LINK}))
		must(tb, o.ns.nl.NeighSet(&netlink.Neigh{LinkIndex: vx[o], IP: p.ip.AsSlice(), HardwareAddr: vxMAC(p.host),
			State: netlink.NUD_PERMANENT, Family: netlink.FAMILY_V4}))
		must(tb, o.ns.nl.NeighSet(&netlink.Neigh{LinkIndex: vx[o], IP: p.host.ip.AsSlice(), HardwareAddr: vxMAC(p.host),
			State: netlink.NUD_PERMANENT, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF}))
	})
}

// hostRoutes enables forwarding, routes each pod on its own host and proxies
// ARP for the others on its veth; remote(o, p) adds host o's route to pod p.
func (tn *testNet) hostRoutes(tb testing.TB, remote func(o *testHost, p *testPod)) {
	tb.Helper()
	for _, h := range tn.order {
		h.ns.sysctl(tb, "net.ipv4.ip_forward", "1")
	}
	for _, p := range tn.pods {
		p.host.ns.sysctl(tb, "net.ipv4.conf."+p.hostIf+".proxy_arp", "1")
		must(tb, p.host.ns.nl.RouteAdd(&netlink.Route{Dst: prefixNet(netip.PrefixFrom(p.ip, 32)), LinkIndex: p.hostIndex}))
		for _, o := range tn.order {
			if o != p.host {
				remote(o, p)
			}
		}
	}
}

// mizarOneSubnet runs mizar with every pod in VPC 100's 10.1.1.0/24 and C
// as its bouncer and divider. direct: every host also knows where every pod
// lives, so traffic goes host to host; otherwise it bounces off C.
func (tn *testNet) mizarOneSubnet(tb testing.TB, direct bool) {
	tb.Helper()
	C := tn.hosts["C"]
	if !direct && tn.xdpMode == XDPDriver {
		tn.xdpTXToSwitch(tb, "C") // generic XDP_TX is an skb transmit
	}
	for _, h := range tn.order {
		tn.loadMizar(tb, h)
		must(tb, h.dp.UpsertVPC(VPC{VNI: vpc1, Dividers: []Hop{C.hop()}}))
		must(tb, h.dp.UpsertSubnet(Subnet{VNI: vpc1, Prefix: netip.MustParsePrefix("10.1.1.0/24"), Bouncers: []Hop{C.hop()}}))
	}
	tn.setRelays(tb, vpc1, C)
	for _, p := range tn.pods {
		for _, h := range tn.order {
			if h != p.host && (direct || h == C) {
				tn.remoteEndpoint(tb, h, p)
			}
		}
	}
}
