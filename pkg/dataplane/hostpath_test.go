package dataplane

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// The host path on two droplets with real netfilter in their netns, as
// kube-proxy would use it: iptables DNAT rules stand for a ClusterIP and a
// NodePort. VPC 100 (10.1.0.0/16) is the host VPC, VPC 200 another one; O
// is a host outside the cluster on the same underlay (no droplet).
//
//	pod a (A) VPC 100 10.1.1.10     pod b (B) VPC 100 10.1.1.20
//	pod a2 (A) VPC 100 10.1.1.11    pod x (A) VPC 200 10.2.1.10
func TestHostPath(t *testing.T) {
	tn := newTestNet(t, []string{"A", "B"}, []podSpec{
		{"a", "A", vpc1, "10.1.1.10/24"},
		{"a2", "A", vpc1, "10.1.1.11/24"},
		{"b", "B", vpc1, "10.1.1.20/24"},
		{"x", "A", vpc2, "10.2.1.10/24"},
	})
	A := tn.hosts["A"]
	a, a2, b, x := tn.pods["a"], tn.pods["a2"], tn.pods["b"], tn.pods["x"]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tn.wireMode(t) // what a NIC puts on a wire: checksums and segments done
	hostCIDR := netip.MustParsePrefix("10.1.0.0/16")
	for _, h := range tn.order {
		tn.loadMizar(t, h)
		must(t, h.dp.UpsertVPC(VPC{VNI: vpc1}))
		must(t, h.dp.UpsertVPC(VPC{VNI: vpc2}))
		must(t, h.dp.SetHostAddrs([]netip.Addr{h.ip}))
		for _, p := range tn.pods {
			if p.host == h {
				podHostRoute(t, p)
			} else {
				tn.remoteEndpoint(t, h, p)
			}
		}
		h.ns.do(t, func() error {
			return h.dp.SetHostPath(ctx, HostPath{VNI: vpc1, CIDR: hostCIDR, HostIP: h.ip, MTU: podMTU})
		})
		// Idempotent: a restarted agent sets it again.
		h.ns.do(t, func() error {
			return h.dp.SetHostPath(ctx, HostPath{VNI: vpc1, CIDR: hostCIDR, HostIP: h.ip, MTU: podMTU})
		})
	}
	// After loadMizar: no droplet of A or B. It is the nodes' way out.
	O := tn.addHost(t, "O")
	for _, h := range []*testHost{A, tn.hosts["B"]} {
		must(t, h.ns.nl.RouteAdd(&netlink.Route{Gw: O.ip.AsSlice(), LinkIndex: h.ulIndex}))
	}

	for _, p := range []*testPod{a, a2, b} {
		serveWho(t, p.ns, p.name, netip.AddrPortFrom(p.ip, identityPort))
	}
	serveWho(t, A.ns, "A", netip.AddrPortFrom(A.ip, 7001))
	serveWho(t, O.ns, "O", netip.AddrPortFrom(O.ip, 7002))
	echoUDP(t, b.ns, "b", netip.AddrPortFrom(b.ip, 5353))

	// What kube-proxy (iptables mode) writes for two ClusterIPs and a
	// NodePort, on node A: PREROUTING for pods and outside clients, OUTPUT
	// for the node's own.
	svcB, svcA2 := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("10.96.0.11")
	for _, chain := range []string{"PREROUTING", "OUTPUT"} {
		iptables(t, A, "-t", "nat", "-A", chain, "-d", svcB.String(), "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", b.ip, identityPort))
		iptables(t, A, "-t", "nat", "-A", chain, "-d", svcB.String(), "-p", "udp", "--dport", "53", "-j", "DNAT", "--to-destination", b.ip.String()+":5353")
		iptables(t, A, "-t", "nat", "-A", chain, "-d", svcA2.String(), "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", a2.ip, identityPort))
	}
	iptables(t, A, "-t", "nat", "-A", "PREROUTING", "-d", A.ip.String(), "-p", "tcp", "--dport", "30080", "-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", b.ip, identityPort))

	t.Run("ClusterIP to a pod of another node", func(t *testing.T) {
		// The backend sees node A: the reply must come back through A's
		// conntrack to be translated back.
		expectWho(t, a.ns, netip.AddrPortFrom(svcB, 80), "b", A.ip)
		if got := udpAsk(t, a.ns, netip.AddrPortFrom(svcB, 53), "ping"); got != "b ping" {
			t.Errorf("UDP ClusterIP from a: %q, want %q", got, "b ping")
		}
	})
	t.Run("ClusterIP to a pod of the same node", func(t *testing.T) {
		expectWho(t, a.ns, netip.AddrPortFrom(svcA2, 80), "a2", A.ip)
	})
	t.Run("node to a pod of another node", func(t *testing.T) {
		expectWho(t, A.ns, netip.AddrPortFrom(b.ip, identityPort), "b", A.ip)
		expectWho(t, A.ns, netip.AddrPortFrom(svcB, 80), "b", A.ip) // host-network client of a Service
	})
	t.Run("pod to another node", func(t *testing.T) {
		// Untranslated: the node sees the pod itself.
		expectWho(t, b.ns, netip.AddrPortFrom(A.ip, 7001), "A", b.ip)
	})
	t.Run("pod egress", func(t *testing.T) {
		expectWho(t, a.ns, netip.AddrPortFrom(O.ip, 7002), "O", A.ip)
	})
	t.Run("NodePort from outside", func(t *testing.T) {
		expectWho(t, O.ns, netip.AddrPortFrom(A.ip, 30080), "b", A.ip)
	})
	t.Run("other VPC isolated", func(t *testing.T) {
		delta := counterDelta(t, A.dp)
		// Its own node still answers it (kubelet probes)...
		expectWho(t, x.ns, netip.AddrPortFrom(A.ip, 7001), "A", x.ip)
		// ...but nothing behind it: not the Service, not the NodePort
		// (DNATed toward b), not b itself.
		for _, dst := range []netip.AddrPort{netip.AddrPortFrom(svcB, 80), netip.AddrPortFrom(A.ip, 30080), netip.AddrPortFrom(b.ip, identityPort)} {
			if c, err := x.ns.dial(shortCtx(t), dst.String()); err == nil {
				c.Close()
				t.Errorf("pod x of VPC %d reached %s", vpc2, dst)
			}
		}
		if got := delta().Pod; got["to_host"] == 0 || got["drop_unknown_dst"]+got["drop_unknown_vni"] == 0 {
			t.Errorf("pod counters %v: want x's packets to its node and drops of those to the host VPC", got)
		}
		out, err := A.ns.exec(ctx, "nft", "list", "chain", "ip", HostPathTable, "forward")
		if err != nil || !strings.Contains(out, "counter packets") || strings.Contains(out, "counter packets 0 ") {
			t.Errorf("the forward drop of other VPCs' packets counted nothing: %v\n%s", err, out)
		}
	})
	t.Run("forged source on the host device", func(t *testing.T) {
		// An outside host routing the VPC through node A: A forwards its
		// packets to the host device untranslated, and the program there
		// drops them, since the node speaks only for itself.
		must(t, O.ns.nl.RouteAdd(&netlink.Route{Dst: prefixNet(hostCIDR), Gw: A.ip.AsSlice()}))
		delta := counterDelta(t, A.dp)
		if c, err := O.ns.dial(shortCtx(t), netip.AddrPortFrom(b.ip, identityPort).String()); err == nil {
			c.Close()
			t.Fatal("an outside host reached pod b through node A")
		}
		if got := delta().Pod; got["drop_spoof"] == 0 || got["encap"] != 0 {
			t.Errorf("pod counters %v: want drop_spoof and nothing encapsulated", got)
		}
	})

	t.Run("removed", func(t *testing.T) {
		A.ns.do(t, func() error { return A.dp.RemoveHostPath(ctx) })
		A.ns.do(t, func() error { return A.dp.RemoveHostPath(ctx) }) // nothing left: still fine
		if _, err := A.ns.nl.LinkByName(HostDevice); err == nil {
			t.Errorf("%s still there", HostDevice)
		}
		if out, err := A.ns.exec(ctx, "nft", "list", "table", "ip", HostPathTable); err == nil {
			t.Errorf("table %s still there:\n%s", HostPathTable, out)
		}
		if vni, err := A.dp.HostPathVNI(); err != nil || vni != 0 {
			t.Errorf("host path VNI %d (%v), want 0", vni, err)
		}
		// Pods keep their node; the ClusterIP is gone from them.
		expectWho(t, a.ns, netip.AddrPortFrom(A.ip, 7001), "A", a.ip)
		if c, err := a.ns.dial(shortCtx(t), netip.AddrPortFrom(svcB, 80).String()); err == nil {
			c.Close()
			t.Error("pod a reached the ClusterIP with the host path removed")
		}
	})
}

func TestHostPathRefusesBadConfig(t *testing.T) {
	d := loadTest(t)
	ctx := context.Background()
	for _, hp := range []HostPath{
		{VNI: 0, CIDR: netip.MustParsePrefix("10.1.0.0/16"), HostIP: hostH.IP, MTU: 1450},
		{VNI: vpc1, CIDR: netip.MustParsePrefix("10.1.0.1/16"), HostIP: hostH.IP, MTU: 1450},
		{VNI: vpc1, CIDR: netip.MustParsePrefix("198.18.0.0/16"), HostIP: hostH.IP, MTU: 1450},
		{VNI: vpc1, CIDR: netip.MustParsePrefix("10.1.0.0/16"), MTU: 1450},
		{VNI: vpc1, CIDR: netip.MustParsePrefix("10.1.0.0/16"), HostIP: hostH.IP, MTU: 0},
	} {
		if err := d.SetHostPath(ctx, hp); err == nil {
			t.Errorf("SetHostPath(%+v) accepted", hp)
		}
	}
	if vni, err := d.HostPathVNI(); err != nil || vni != 0 {
		t.Errorf("host path VNI %d (%v) after refusals, want 0", vni, err)
	}
}

// podHostRoute does what the CNI server does at ADD for the host side of a
// pod: the gateway MAC on the host-side veth (the host stack takes what the
// pod program passes up as its own), a permanent neighbour and a /32 route
// from the node's address.
func podHostRoute(t *testing.T, p *testPod) {
	t.Helper()
	nl := p.host.ns.nl
	hl, err := nl.LinkByName(p.hostIf)
	must(t, err)
	must(t, nl.LinkSetHardwareAddr(hl, gatewayMAC))
	must(t, nl.NeighSet(&netlink.Neigh{LinkIndex: p.hostIndex, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: p.ip.AsSlice(), HardwareAddr: p.mac}))
	must(t, nl.RouteAdd(&netlink.Route{LinkIndex: p.hostIndex, Dst: prefixNet(netip.PrefixFrom(p.ip, 32)),
		Src: p.host.ip.AsSlice(), Scope: netlink.SCOPE_LINK}))
}

func iptables(t *testing.T, h *testHost, args ...string) {
	t.Helper()
	if out, err := h.ns.exec(context.Background(), "iptables", append([]string{"-w"}, args...)...); err != nil {
		t.Fatalf("iptables %v on %s: %v: %s", args, h.name, err, out)
	}
}

func shortCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// serveWho answers every TCP connection to addr in n with "<name> <the
// client's address as seen here>".
func serveWho(t *testing.T, n *netNS, name string, addr netip.AddrPort) {
	l := n.listen(t, addr.String())
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			from := c.RemoteAddr().(*net.TCPAddr).IP
			fmt.Fprintf(c, "%s %s\n", name, from)
			_ = c.Close()
		}
	}()
}

// expectWho connects from n to dst and checks who answers and whom it saw.
func expectWho(t *testing.T, n *netNS, dst netip.AddrPort, name string, seen netip.Addr) {
	t.Helper()
	c, err := n.dial(shortCtx(t), dst.String())
	if err != nil {
		t.Fatalf("%s -> %s: %v", n.name, dst, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("%s -> %s: read: %v", n.name, dst, err)
	}
	if want := fmt.Sprintf("%s %s", name, seen); strings.TrimSpace(line) != want {
		t.Fatalf("%s -> %s: answer %q, want %q", n.name, dst, strings.TrimSpace(line), want)
	}
}

// echoUDP answers every datagram to addr in n with "<name> <payload>".
func echoUDP(t *testing.T, n *netNS, name string, addr netip.AddrPort) {
	var c *net.UDPConn
	n.do(t, func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
		return err
	})
	t.Cleanup(func() { _ = c.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			k, from, err := c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteToUDP([]byte(name+" "+string(buf[:k])), from)
		}
	}()
}

// udpAsk sends msg from n to dst (a connected socket: only replies from dst
// itself are taken) and returns the answer, retrying while none comes.
func udpAsk(t *testing.T, n *netNS, dst netip.AddrPort, msg string) string {
	t.Helper()
	var c *net.UDPConn
	n.do(t, func() (err error) {
		c, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(dst))
		return err
	})
	defer c.Close()
	buf := make([]byte, 2048)
	for range 5 {
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatalf("%s -> %s: %v", n.name, dst, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		k, err := c.Read(buf)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		if err != nil {
			t.Fatalf("%s -> %s: %v", n.name, dst, err)
		}
		return string(buf[:k])
	}
	t.Fatalf("%s -> %s: no UDP answer", n.name, dst)
	return ""
}
