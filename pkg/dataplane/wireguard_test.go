package dataplane

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
)

const wgPort = 51820

// encrypt puts a userspace WireGuard underlay (StartWireGuard) under every
// host of tn, before loadMizar: each host gets the TAP mzwg0 with its
// droplet address 198.19.0.x/24, WireGuard listens on its segment address,
// and every other host is its peer, allowed only its own droplet address.
// mizar then runs on mzwg0 (generic XDP, as on every veth underlay), its
// droplets without MACs. Pods' MTUs shrink by WireGuardOverhead.
func (tn *testNet) encrypt(tb testing.TB) map[*testHost]*WireGuard {
	tb.Helper()
	wgs := map[*testHost]*WireGuard{}
	pubs := map[*testHost]WireGuardKey{}
	tapMTU := underlayMTU - WireGuardOverhead
	for i, h := range tn.order {
		priv, pub, err := NewWireGuardKey()
		must(tb, err)
		var wg *WireGuard
		h.ns.do(tb, func() (err error) {
			wg, err = StartWireGuard(WireGuardOptions{Link: "mzwg0", PrivateKey: priv, ListenPort: wgPort, MTU: tapMTU})
			return err
		})
		tb.Cleanup(func() { _ = wg.Close() })
		l, err := h.ns.nl.LinkByName("mzwg0")
		must(tb, err)
		must(tb, h.ns.nl.LinkSetMTU(l, tapMTU))
		ip := netip.AddrFrom4([4]byte{198, 19, 0, byte(11 + i)})
		must(tb, h.ns.nl.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(ip, 24))}))
		must(tb, h.ns.nl.LinkSetUp(l))
		h.phys, h.physMAC = h.ip, h.mac
		h.ip, h.mac, h.ulIndex, h.ul, h.routed = ip, wg.MAC(), l.Attrs().Index, "mzwg0", true
		wgs[h], pubs[h] = wg, pub
	}
	for _, h := range tn.order {
		var peers []WireGuardPeer
		for _, o := range tn.order {
			if o == h {
				continue
			}
			peers = append(peers, wgPeer(o, pubs[o]))
			// The neighbour a relay's XDP needs at once (the TAP's far
			// side also answers ARP, for the pod side's first packets).
			must(tb, h.ns.nl.NeighSet(&netlink.Neigh{LinkIndex: h.ulIndex, State: netlink.NUD_PERMANENT,
				IP: o.ip.AsSlice(), HardwareAddr: wgPeerMAC}))
		}
		must(tb, wgs[h].SetPeers(peers))
	}
	podMTU := tapMTU - GeneveOverhead
	for _, p := range tn.pods {
		hl, err := p.host.ns.nl.LinkByName(p.hostIf)
		must(tb, err)
		must(tb, p.host.ns.nl.LinkSetMTU(hl, podMTU))
		pl, err := p.ns.nl.LinkByName("eth0")
		must(tb, err)
		must(tb, p.ns.nl.LinkSetMTU(pl, podMTU))
	}
	tn.xdpMode, tn.ulMTU = XDPGeneric, tapMTU
	return wgs
}

// Encrypted mode: pods talk through relay C over WireGuard, nothing but
// WireGuard crosses the segment, and a stranger on the segment that writes
// relay C's address (its segment address or its droplet address) as the
// outer source, and C's MAC as its own (what plain mode's MAC check cannot
// refuse), to A's segment or droplet address, or to A's WireGuard port,
// injects nothing into pod a. The control: C itself, sending from
// its droplet address, reaches a through WireGuard.
func TestEncryptedUnderlayRefusesStrangers(t *testing.T) {
	tn := newTestNet(t, []string{"A", "B", "C"}, []podSpec{
		{"a", "A", vpc1, "10.1.1.10/24"},
		{"b", "B", vpc1, "10.1.1.20/24"},
	})
	tn.wireMode(t)
	tn.encrypt(t)
	tn.learn = -1 // bounced stays bounced: the relay's path is the one tested
	tn.mizarOneSubnet(t, false)
	a, b := tn.pods["a"], tn.pods["b"]
	A, C := tn.hosts["A"], tn.hosts["C"]

	capA := tn.sw.capture(t, "pA")
	relayed := counterDelta(t, C.dp)
	serveIdentity(t, b)
	if out, ok := a.pingArgs(t, b.ip, 20, "-i", "0.02"); !ok || !strings.Contains(out, " 0% packet loss") {
		t.Fatalf("a -> b over WireGuard through relay C:\n%s", out)
	}
	if got := identity(t, a, b.ip); got != "b" {
		t.Fatalf("a reached %q at %s, want b", got, b.ip)
	}
	if n := relayed().Underlay["fwd_endpoint"]; n == 0 {
		t.Fatal("relay C forwarded nothing: the traffic did not take the relay")
	}
	wg, plain := 0, 0
	for _, f := range capA.stop() {
		p := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
		if u, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP); ok {
			switch {
			case u.SrcPort == wgPort || u.DstPort == wgPort:
				wg++
			case u.SrcPort == 6081 || u.DstPort == 6081:
				plain++
			}
		}
		if strings.Contains(string(f), "mizar-") || containsAddr(f, a.ip) {
			t.Fatalf("plaintext of the overlay on the segment:\n%s", dump(f))
		}
	}
	if wg == 0 || plain != 0 {
		t.Fatalf("A's port carried %d WireGuard and %d Geneve datagrams, want WireGuard only", wg, plain)
	}

	M := addStranger(t, tn, "M", &testHost{name: "A", ip: A.phys})
	cases := []struct {
		name     string
		src, dst netip.Addr
	}{
		{"C's segment address to A's", C.phys, A.phys},
		{"C's segment address to A's droplet address", C.phys, A.ip},
		{"C's droplet address to A's", C.ip, A.ip},
		{"C's droplet address to A's segment address", C.ip, A.phys},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			marker := fmt.Sprintf("mizar-wgspoof-%d-%s", i, tn.sfx)
			in := markedUDP(tn.pods["b"].ip, a.ip, marker)
			in.srcMAC, in.dstMAC = b.mac, a.mac
			o := outer{src: c.src, srcMAC: C.physMAC, dst: c.dst, dstMAC: A.physMAC, vni: vpc1, sport: 0xC123, df: true}
			f := o.geneve(t, in.frame(t))
			capPod := a.ns.capture(t, "eth0")
			M.ns.sendRaw(t, "ul0", f, f, f)
			settle()
			if carries(capPod.stop(), marker) {
				t.Fatalf("a got the stranger's frame (%s -> %s)", c.src, c.dst)
			}
		})
	}
	t.Run("Geneve to A's WireGuard port", func(t *testing.T) {
		marker := "mizar-wgport-" + tn.sfx
		capPod := a.ns.capture(t, "eth0")
		M.ns.sendUDP(t, netip.AddrPortFrom(A.phys, wgPort), 0, genevePayload(t, vpc1, b.mac, a.mac, markedUDP(b.ip, a.ip, marker)))
		settle()
		if carries(capPod.stop(), marker) {
			t.Fatal("a got Geneve sent in the clear to A's WireGuard port")
		}
	})
	if !injects(t, C, A, b.ip, b.mac, a, "mizar-wg-control-"+tn.sfx) {
		t.Fatal("control: relay C's own frame through WireGuard did not reach a")
	}
}

func wgPeer(h *testHost, pub WireGuardKey) WireGuardPeer {
	return WireGuardPeer{PublicKey: pub, Endpoint: netip.AddrPortFrom(h.phys, wgPort), IP: h.ip}
}

// A key rotation keeps established connections: a TCP stream from a (on
// A) to b (on B) runs while A takes a new key and B and C are told its new
// public key (as the Droplet's annotation would tell their agents); every
// byte arrives, and B no longer accepts A's old key.
func TestEncryptedKeyRotationKeepsFlows(t *testing.T) {
	tn := newTestNet(t, []string{"A", "B", "C"}, []podSpec{
		{"a", "A", vpc1, "10.1.1.10/24"},
		{"b", "B", vpc1, "10.1.1.20/24"},
	})
	tn.wireMode(t)
	wgs := tn.encrypt(t)
	tn.learn = -1
	tn.mizarOneSubnet(t, true)
	a, b := tn.pods["a"], tn.pods["b"]
	A, B, C := tn.hosts["A"], tn.hosts["B"], tn.hosts["C"]
	serveIdentity(t, b)
	if out, ok := a.pingArgs(t, b.ip, 3, "-i", "0.05"); !ok {
		t.Fatalf("a -> b before the rotation:\n%s", out)
	}
	old := wgs[A].PublicKey()

	c, err := dialFrom(a, b.ip)
	must(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	h := sha256.New()
	chunk := make([]byte, 32<<10)
	done := make(chan error, 1)
	go func() {
		for i := range 100 { // ~3 MB over ~2 s
			_, _ = rand.Read(chunk)
			h.Write(chunk)
			if _, err := c.Write(chunk); err != nil {
				done <- fmt.Errorf("write %d: %w", i, err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		done <- nil
	}()
	time.Sleep(500 * time.Millisecond)
	priv, pub, err := NewWireGuardKey()
	must(t, err)
	must(t, wgs[A].Rotate(priv))
	for _, o := range []*testHost{B, C} {
		var peers []WireGuardPeer
		for _, p := range tn.order {
			if p != o {
				peers = append(peers, wgPeer(p, wgs[p].PublicKey()))
			}
		}
		must(t, wgs[o].SetPeers(peers))
	}
	if err := <-done; err != nil {
		t.Fatalf("the stream broke across the rotation: %v", err)
	}
	must(t, c.(*net.TCPConn).CloseWrite())
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("the stream's answer after the rotation: %v", err)
	}
	if want := fmt.Sprintf("b %x\n", h.Sum(nil)); line != want {
		t.Fatalf("b hashed %q, want %q: bytes lost or changed across the rotation", line, want)
	}
	if wgs[A].PublicKey() != pub || pub == old {
		t.Fatal("A's key did not change")
	}
	conf, err := wgs[B].dev.IpcGet()
	must(t, err)
	if strings.Contains(conf, "public_key="+old.String()) || !strings.Contains(conf, "public_key="+pub.String()) {
		t.Fatalf("B's peers after the rotation:\n%s", conf)
	}
}

func containsAddr(f []byte, ip netip.Addr) bool {
	return strings.Contains(string(f), string(ip.AsSlice()))
}
