package dataplane

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Three hosts on a bridge: A and B host pods, C is the bouncer of VPC 100's
// subnet 10.1.1.0/24 and of VPC 200's 10.1.1.0/24, and the divider of both
// VPCs; B is the bouncer of VPC 100's 10.1.2.0/24. The two VPCs overlap.
//
//	pod a  (A) VPC 100 10.1.1.10     pod x (A) VPC 200 10.1.1.30
//	pod b  (B) VPC 100 10.1.1.20     pod y (B) VPC 200 10.1.1.20  <- same IP as b
//	pod b2 (B) VPC 100 10.1.2.20
func buildThreeHosts(t *testing.T) *testNet {
	tn := newTestNet(t, []string{"A", "B", "C"}, []podSpec{
		{"a", "A", vpc1, "10.1.1.10/24"},
		{"b", "B", vpc1, "10.1.1.20/24"},
		{"b2", "B", vpc1, "10.1.2.20/24"},
		{"x", "A", vpc2, "10.1.1.30/24"},
		{"y", "B", vpc2, "10.1.1.20/24"},
	})
	tn.wireMode(t)
	tn.xdpTXToSwitch(t, "C") // C bounces with XDP_TX
	A, B, C := tn.hosts["A"], tn.hosts["B"], tn.hosts["C"]
	for _, h := range tn.order {
		tn.loadMizar(t, h)
	}
	s1 := netip.MustParsePrefix("10.1.1.0/24")
	s2 := netip.MustParsePrefix("10.1.2.0/24")
	for _, h := range tn.order {
		must(t, h.dp.UpsertVPC(VPC{VNI: vpc1, Dividers: []Hop{C.hop()}}))
		must(t, h.dp.UpsertVPC(VPC{VNI: vpc2, Dividers: []Hop{C.hop()}}))
		must(t, h.dp.UpsertSubnet(Subnet{VNI: vpc1, Prefix: s1, Bouncers: []Hop{C.hop()}}))
		must(t, h.dp.UpsertSubnet(Subnet{VNI: vpc2, Prefix: s1, Bouncers: []Hop{C.hop()}}))
	}
	tn.setRelays(t, vpc1, B, C)
	tn.setRelays(t, vpc2, C)
	// A knows only its own subnets; B also holds S2 (it is its bouncer); C,
	// the divider, holds every subnet of both VPCs.
	must(t, B.dp.UpsertSubnet(Subnet{VNI: vpc1, Prefix: s2, Bouncers: []Hop{B.hop()}}))
	must(t, C.dp.UpsertSubnet(Subnet{VNI: vpc1, Prefix: s2, Bouncers: []Hop{B.hop()}}))
	// C bounces for S1 of both VPCs: it holds their endpoints.
	for _, p := range []string{"a", "b", "x", "y"} {
		tn.remoteEndpoint(t, C, tn.pods[p])
	}
	_ = A
	return tn
}

func TestThreeHosts(t *testing.T) {
	tn := buildThreeHosts(t)
	a, b, b2, x, y := tn.pods["a"], tn.pods["b"], tn.pods["b2"], tn.pods["x"], tn.pods["y"]
	A, B, C := tn.hosts["A"], tn.hosts["B"], tn.hosts["C"]

	// Every pod runs a TCP service that names itself and hashes what it got.
	for _, p := range tn.pods {
		serveIdentity(t, p)
	}

	t.Run("same subnet through the bouncer", func(t *testing.T) {
		before := counters(t, C)
		caps := captureUnderlay(t, tn)
		if out, ok := a.ping(t, b.ip, 3); !ok {
			t.Fatalf("a -> b ping failed:\n%s", out)
		}
		expectGeneve(t, caps["A"].stop(), A, C, vpc1, a.ip, b.ip)
		expectGeneve(t, caps["C"].stop(), C, B, vpc1, a.ip, b.ip)
		transfer(t, a, b, 4<<20)
		after := counters(t, C)
		if after.Underlay["fwd_endpoint"] <= before.Underlay["fwd_endpoint"] {
			t.Fatalf("C forwarded nothing as bouncer: %v", after.Underlay)
		}
	})

	t.Run("across subnets through the divider", func(t *testing.T) {
		before := counters(t, C)
		caps := captureUnderlay(t, tn)
		if out, ok := a.ping(t, b2.ip, 3); !ok {
			t.Fatalf("a -> b2 ping failed:\n%s", out)
		}
		// A knows no subnet for b2: to the divider C, which sends it to
		// S2's bouncer B, which hosts b2. One TTL is taken on the way out
		// of a's subnet.
		frames := caps["A"].stop()
		pkt := expectGeneve(t, frames, A, C, vpc1, a.ip, b2.ip)
		if ttl := pkt.Layers()[5].(*layers.IPv4).TTL; ttl != 63 {
			t.Errorf("inner TTL on the underlay %d, want 63 (64 - the gateway hop)", ttl)
		}
		expectGeneve(t, caps["C"].stop(), C, B, vpc1, a.ip, b2.ip)
		transfer(t, a, b2, 4<<20)
		after := counters(t, C)
		if after.Underlay["fwd_subnet"] <= before.Underlay["fwd_subnet"] {
			t.Fatalf("C forwarded nothing as divider: %v", after.Underlay)
		}
	})

	t.Run("direct path once the host is known", func(t *testing.T) {
		tn.remoteEndpoint(t, A, b)
		tn.remoteEndpoint(t, B, a)
		before := counters(t, C)
		caps := captureUnderlay(t, tn)
		if out, ok := a.ping(t, b.ip, 3); !ok {
			t.Fatalf("a -> b ping failed:\n%s", out)
		}
		expectGeneve(t, caps["A"].stop(), A, B, vpc1, a.ip, b.ip)
		transfer(t, a, b, 4<<20)
		if after := counters(t, C); after.Underlay["rx"] != before.Underlay["rx"] {
			t.Fatalf("C still saw Geneve: %v -> %v", before.Underlay, after.Underlay)
		}
	})

	t.Run("VPCs with overlapping CIDRs stay apart", func(t *testing.T) {
		// 10.1.1.20 is b in VPC 100 and y in VPC 200.
		if got := identity(t, a, b.ip); got != "b" {
			t.Fatalf("a reached %q at %s, want b", got, b.ip)
		}
		if got := identity(t, x, y.ip); got != "y" {
			t.Fatalf("x reached %q at %s, want y", got, y.ip)
		}
		transfer(t, x, y, 1<<20)
		// a's VPC has no 10.1.1.30 (that is x, in VPC 200), x's has no
		// 10.1.1.10 (that is a).
		before := counters(t, C)
		if out, ok := a.ping(t, x.ip, 2); ok {
			t.Fatalf("a (VPC 100) reached x (VPC 200):\n%s", out)
		}
		if out, ok := x.ping(t, a.ip, 2); ok {
			t.Fatalf("x (VPC 200) reached a (VPC 100):\n%s", out)
		}
		if c, err := dialFrom(a, x.ip); err == nil {
			_ = c.Close()
			t.Fatal("a opened a TCP connection into VPC 200")
		}
		after := counters(t, C)
		if after.Underlay["drop_unknown_dst"] < before.Underlay["drop_unknown_dst"]+4 {
			t.Fatalf("C dropped %d as unknown, want >= 4",
				after.Underlay["drop_unknown_dst"]-before.Underlay["drop_unknown_dst"])
		}
	})

	t.Run("reload keeps links, maps and traffic", func(t *testing.T) {
		ids := linkIDs(t, C)
		eps, err := C.dp.Endpoints()
		must(t, err)
		// x -> y goes through bouncer C: ping it every 10 ms while C's agent
		// "restarts" twice (Close, Load on the same pins, re-attach).
		const pings = 150
		type result struct {
			out string
			err error
		}
		done := make(chan result, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			out, err := x.ns.exec(ctx, "ping", "-n", "-q", "-c", fmt.Sprint(pings), "-i", "0.01", "-W", "1", y.ip.String())
			done <- result{out, err}
		}()
		for i := 0; i < 2; i++ {
			time.Sleep(400 * time.Millisecond)
			must(t, C.dp.Close())
			C.ns.do(t, func() error {
				dp, err := Load(Options{PinRoot: C.dp.PinRoot(), UnderlayIfindex: C.ulIndex, HostIP: C.ip, HostMAC: C.mac})
				if err != nil {
					return err
				}
				t.Cleanup(func() { _ = dp.Close() })
				C.dp = dp
				return dp.AttachUnderlay("ul0")
			})
		}
		res := <-done
		if res.err != nil || !strings.Contains(res.out, fmt.Sprintf("%d received", pings)) {
			t.Fatalf("pings lost across reloads (%v):\n%s", res.err, res.out)
		}
		if got := linkIDs(t, C); fmt.Sprint(got) != fmt.Sprint(ids) {
			t.Fatalf("links after reload %v, want the same %v (updated in place)", got, ids)
		}
		again, err := C.dp.Endpoints()
		must(t, err)
		if len(again) != len(eps) {
			t.Fatalf("endpoints after reload %d, want %d", len(again), len(eps))
		}
	})
}

func counters(t *testing.T, h *testHost) Counters {
	t.Helper()
	c, err := h.dp.Counters()
	must(t, err)
	return c
}

// linkIDs lists the IDs of the links a host has pinned.
func linkIDs(t *testing.T, h *testHost) []string {
	t.Helper()
	links, err := h.dp.Links()
	must(t, err)
	var ids []string
	for _, l := range links {
		ids = append(ids, fmt.Sprintf("%s/%s:%d", l.Ifname, l.Program, l.LinkID))
	}
	return ids
}

func captureUnderlay(t *testing.T, tn *testNet) map[string]*capture {
	t.Helper()
	caps := map[string]*capture{}
	for _, h := range tn.order {
		caps[h.name] = h.sw.capture(t, "p"+h.name)
	}
	return caps
}

// expectGeneve finds, among frames captured on a switch port, Geneve from
// host src to host dst carrying inner IPv4 from -> to in VPC vni, decoded by
// gopacket, and returns it.
func expectGeneve(t *testing.T, frames [][]byte, src, dst *testHost, vni uint32, from, to netip.Addr) gopacket.Packet {
	t.Helper()
	var seen []string
	for _, f := range frames {
		pkt := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
		ls := pkt.Layers()
		if len(ls) < 6 {
			continue
		}
		oip, ok1 := ls[1].(*layers.IPv4)
		udp, ok2 := ls[2].(*layers.UDP)
		gnv, ok3 := ls[3].(*layers.Geneve)
		iip, ok4 := ls[5].(*layers.IPv4)
		if !ok1 || !ok2 || !ok3 || !ok4 {
			continue
		}
		seen = append(seen, fmt.Sprintf("%s->%s vni %d %s->%s", oip.SrcIP, oip.DstIP, gnv.VNI, iip.SrcIP, iip.DstIP))
		if oip.SrcIP.Equal(src.ip.AsSlice()) && oip.DstIP.Equal(dst.ip.AsSlice()) && gnv.VNI == vni &&
			iip.SrcIP.Equal(from.AsSlice()) && iip.DstIP.Equal(to.AsSlice()) {
			if udp.DstPort != 6081 || udp.SrcPort < 49152 {
				t.Fatalf("Geneve UDP ports %d -> %d", udp.SrcPort, udp.DstPort)
			}
			eth := ls[0].(*layers.Ethernet)
			if src.seg == dst.seg && (!bytesEq(eth.SrcMAC, src.mac) || !bytesEq(eth.DstMAC, dst.mac)) {
				t.Fatalf("outer MACs %s -> %s, want %s -> %s", eth.SrcMAC, eth.DstMAC, src.mac, dst.mac)
			}
			return pkt
		}
	}
	t.Fatalf("no Geneve %s -> %s (VNI %d, %s -> %s) among %d frames; Geneve seen: %v",
		src.name, dst.name, vni, from, to, len(frames), seen)
	return nil
}

func bytesEq(a, b []byte) bool { return string(a) == string(b) }

const identityPort = 7000

// serveIdentity runs, inside pod p, a TCP service that reads until EOF and
// answers "<pod name> <sha256 of what it read>".
func serveIdentity(t *testing.T, p *testPod) {
	l := p.ns.listen(t, fmt.Sprintf("%s:%d", p.ip, identityPort))
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				h := sha256.New()
				if _, err := io.Copy(h, c); err != nil {
					return
				}
				fmt.Fprintf(c, "%s %x\n", p.name, h.Sum(nil))
			}()
		}
	}()
}

func dialFrom(p *testPod, dst netip.Addr) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return p.ns.dial(ctx, fmt.Sprintf("%s:%d", dst, identityPort))
}

// exchange sends data from pod src to dst's identity service and returns
// the name and hash it answers.
func exchange(t *testing.T, src *testPod, dst netip.Addr, data []byte) (string, string) {
	t.Helper()
	c, err := dialFrom(src, dst)
	if err != nil {
		t.Fatalf("%s -> %s: %v", src.name, dst, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(data); err != nil {
		t.Fatalf("%s -> %s: write: %v", src.name, dst, err)
	}
	must(t, c.(*net.TCPConn).CloseWrite())
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("%s -> %s: read answer: %v", src.name, dst, err)
	}
	name, sum, _ := strings.Cut(strings.TrimSpace(line), " ")
	return name, sum
}

func identity(t *testing.T, src *testPod, dst netip.Addr) string {
	t.Helper()
	name, _ := exchange(t, src, dst, []byte("who are you"))
	return name
}

// transfer sends n random bytes from src to dst over TCP and checks that
// dst hashed exactly them.
func transfer(t *testing.T, src, dst *testPod, n int) {
	t.Helper()
	data := make([]byte, n)
	_, _ = rand.Read(data)
	name, sum := exchange(t, src, dst.ip, data)
	want := sha256.Sum256(data)
	if name != dst.name || sum != hex.EncodeToString(want[:]) {
		t.Fatalf("%s -> %s: answer %q %s, want %q %x", src.name, dst.name, name, sum, dst.name, want)
	}
}
