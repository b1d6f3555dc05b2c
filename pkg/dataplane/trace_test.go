package dataplane

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	networkingv1 "k8s.io/api/networking/v1"

	"mizar.dev/pkg/netpol/netpoltest"
)

func TestTracePacketFrame(t *testing.T) {
	d := fixture(t)
	for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_ICMP} {
		f, err := TracePacket{SrcMAC: pod1.MAC, DstMAC: pod1.GatewayMAC, Src: pod1.IP, Dst: addr("10.1.1.20"), Proto: proto,
			SrcPort: 40000, DstPort: 80}.Frame()
		must(t, err)
		var e DropEvent
		e.parseFrame(f)
		if e.Src != pod1.IP || e.Dst != addr("10.1.1.20") || e.Proto != proto {
			t.Errorf("proto %d: frame parses as %+v", proto, e)
		}
		// The programs take it (encapsulated toward the bouncer).
		expectVerdict(t, d.PodProgram(), f, tcRedirect, nil)
	}
}

// traceHop is one host's part of a trace.
type traceHop struct {
	host *testHost
	Trace
}

// followTrace traces a packet pod p sends, host after host, the way
// mizarctl trace asks the agents: each host's output frame is the next
// host's input.
func followTrace(t *testing.T, tn *testNet, p *testPod, pkt TracePacket) []traceHop {
	t.Helper()
	frame, err := pkt.Frame()
	must(t, err)
	var hops []traceHop
	h := p.host
	var tr Trace
	h.ns.do(t, func() (err error) { tr, err = h.dp.TracePod(p.hostIndex, frame); return err })
	hops = append(hops, traceHop{h, tr})
	for len(hops) < 8 && tr.Next == NextUnderlay {
		h = nil
		for _, o := range tn.order {
			if o.ip == tr.Host {
				h = o
			}
		}
		if h == nil {
			t.Fatalf("trace goes to %s, no host of the test net", tr.Host)
		}
		out := tr.Out
		h.ns.do(t, func() (err error) { tr, err = h.dp.TraceUnderlay(out); return err })
		hops = append(hops, traceHop{h, tr})
	}
	for _, hp := range hops {
		t.Logf("trace at %s: %s", hp.host.name, hp.Trace)
	}
	return hops
}

// moved is what a real packet moved on every host: "host:counter".
func moved(t *testing.T, tn *testNet, send func()) []string {
	t.Helper()
	deltas := map[*testHost]func() Counters{}
	for _, h := range tn.order {
		deltas[h] = counterDelta(t, h.dp)
	}
	send()
	time.Sleep(300 * time.Millisecond)
	var out []string
	for _, h := range tn.order {
		c := deltas[h]()
		for k, v := range c.Pod {
			// The pod's ARP for a new neighbour is a frame of its own.
			if v > 0 && k != "arp_reply" {
				out = append(out, h.name+":pod:"+k)
			}
		}
		for k, v := range c.Underlay {
			if v > 0 && k != "rx" && k != "pass" {
				out = append(out, h.name+":underlay:"+k)
			}
		}
	}
	slices.Sort(out)
	return out
}

// traced is the same "host:program:counter" list from a trace.
func tracedCounters(hops []traceHop) []string {
	var out []string
	for _, hp := range hops {
		for _, c := range hp.Counters {
			out = append(out, hp.host.name+":"+hp.Program+":"+c)
		}
	}
	slices.Sort(out)
	return out
}

// TestTraceMatchesRealPackets: a trace through the hosts' real programs
// and maps names the path a real packet takes (pod a on A, through bouncer
// C, delivered on B) and the host and reason of a real packet's drop
// (unknown destination at the bouncer, spoofed source at the sender's
// host), which the drop events of the real packets confirm.
func TestTraceMatchesRealPackets(t *testing.T) {
	tn := newTestNet(t, []string{"A", "B", "C"}, []podSpec{
		{"a", "A", vpc1, "10.1.1.10/24"},
		{"b", "B", vpc1, "10.1.1.20/24"},
	})
	tn.learn = -1 // every packet bounces off C, traced or real
	for _, p := range tn.pods {
		// No IPv6 chatter (router solicitations, MLD) among the packets counted.
		p.ns.sysctl(t, "net.ipv6.conf.all.disable_ipv6", "1")
		p.ns.sysctl(t, "net.ipv6.conf.default.disable_ipv6", "1")
	}
	tn.wireMode(t)
	tn.mizarOneSubnet(t, false)
	A, B, C := tn.hosts["A"], tn.hosts["B"], tn.hosts["C"]
	a, b := tn.pods["a"], tn.pods["b"]
	if out, ok := a.ping(t, b.ip, 2); !ok { // ARP answered, paths warm
		t.Fatalf("a cannot ping b:\n%s", out)
	}
	evA, evC := collectDropEvents(t, A.dp), collectDropEvents(t, C.dp)
	udp := func(dst netip.Addr) TracePacket {
		return TracePacket{SrcMAC: a.mac, DstMAC: gatewayMAC, Src: a.ip, Dst: dst, Proto: unix.IPPROTO_UDP, SrcPort: 40000, DstPort: 9}
	}

	t.Run("delivered", func(t *testing.T) {
		// A socket on b's port 9: no ICMP error comes back.
		b.ns.do(t, func() error {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: b.ip.AsSlice(), Port: 9})
			if err == nil {
				t.Cleanup(func() { _ = c.Close() })
			}
			return err
		})
		hops := followTrace(t, tn, a, udp(b.ip))
		if len(hops) != 3 || hops[0].host != A || hops[0].Next != NextUnderlay || hops[0].Host != C.ip ||
			hops[1].host != C || hops[1].Host != B.ip || hops[2].host != B || hops[2].Next != NextPod {
			t.Fatalf("trace a -> b: want A -> C -> B, delivered; got %v", hops)
		}
		real := moved(t, tn, func() { a.ns.sendUDP(t, netip.AddrPortFrom(b.ip, 9), 0, []byte("real")) })
		if want := tracedCounters(hops); !slices.Equal(real, want) {
			t.Fatalf("the real packet moved %v, the trace %v", real, want)
		}
	})

	t.Run("unknown-destination", func(t *testing.T) {
		nobody := addr("10.1.1.77")
		hops := followTrace(t, tn, a, udp(nobody))
		last := hops[len(hops)-1]
		if last.host != C || last.Next != NextDrop || last.Drop != "drop_unknown_dst" {
			t.Fatalf("trace a -> %s: want dropped at C for drop_unknown_dst, got %v", nobody, hops)
		}
		nextJiffy()
		real := moved(t, tn, func() { a.ns.sendUDP(t, netip.AddrPortFrom(nobody, 9), 0, []byte("real")) })
		if want := tracedCounters(hops); !slices.Equal(real, want) {
			t.Fatalf("the real packet moved %v, the trace %v", real, want)
		}
		waitDropEvent(t, evC, func(e DropEvent) bool {
			return e.Reason == "drop_unknown_dst" && e.Dst == nobody && e.Src == a.ip && e.Proto == unix.IPPROTO_UDP && e.VNI == vpc1
		})
	})

	t.Run("spoofed-source", func(t *testing.T) {
		spoofed := udp(b.ip)
		spoofed.Src = addr("10.1.1.66")
		hops := followTrace(t, tn, a, spoofed)
		if len(hops) != 1 || hops[0].host != A || hops[0].Next != NextDrop || hops[0].Drop != "drop_spoof" {
			t.Fatalf("trace of a spoofed packet: want dropped at A for drop_spoof, got %v", hops)
		}
		frame, err := spoofed.Frame()
		must(t, err)
		nextJiffy()
		real := moved(t, tn, func() { a.ns.sendRaw(t, "eth0", frame) })
		if want := tracedCounters(hops); !slices.Equal(real, want) {
			t.Fatalf("the real packet moved %v, the trace %v", real, want)
		}
		waitDropEvent(t, evA, func(e DropEvent) bool {
			return e.Program == "pod" && e.Reason == "drop_spoof" && e.Src == spoofed.Src && e.Ifindex == uint32(a.hostIndex)
		})
	})
}

// waitDropEvent waits for an event that match accepts.
func waitDropEvent(t *testing.T, c *dropEvents, match func(DropEvent) bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, e := range c.wait(0) {
			if match(e) {
				t.Logf("drop event: %s", e)
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	var all []string
	for _, e := range c.wait(0) {
		all = append(all, e.String())
	}
	t.Fatalf("no matching drop event; got:\n%s", strings.Join(all, "\n"))
}

func TestWithoutGeneveOptions(t *testing.T) {
	d := fixture(t)
	in := podPacket("10.1.1.10").frame(t)
	with := fromA(vpc1)
	with.options = srcHostOption(hostA.IP)
	got := WithoutGeneveOptions(with.geneve(t, in))
	want := fromA(vpc1).geneve(t, in)
	if string(got) != string(want) {
		t.Fatalf("stripped:\n%s\nwant:\n%s", dump(got), dump(want))
	}
	// Still what the program takes.
	expectVerdict(t, d.UnderlayProgram(), got, xdpRedirect, nil)
	if plain := fromA(vpc1).geneve(t, in); string(WithoutGeneveOptions(plain)) != string(plain) {
		t.Fatal("a frame without options changed")
	}
}

// Policy drops are traced as such, in both programs, and reported as drop
// events with the policy's reason.
func TestTracePolicyDrops(t *testing.T) {
	d, in := policyFixture(t)
	evs := collectDropEvents(t, d)
	self := map[string]string{"pod": "10"}
	// pod1 (10.1.1.10) may neither send nor receive anything.
	applyTo(t, d, in, netpoltest.Policy("bench", "pod1", self,
		[]networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, nil, nil))

	nextJiffy()
	out, err := TracePacket{SrcMAC: pod1.MAC, DstMAC: pod1.GatewayMAC, Src: pod1.IP, Dst: addr("10.1.1.20"), Proto: unix.IPPROTO_TCP,
		SrcPort: 40000, DstPort: 80}.Frame()
	must(t, err)
	tr, err := d.TracePod(pod1.Ifindex, out)
	must(t, err)
	t.Log(tr)
	if tr.Next != NextDrop || tr.Drop != "policy_drop_egress" {
		t.Fatalf("pod1's egress: %v, want dropped for policy_drop_egress", tr)
	}
	nextJiffy()
	tr, err = d.TraceUnderlay(fromA(vpc1).geneve(t, podPacket("10.1.1.10").frame(t)))
	must(t, err)
	t.Log(tr)
	if tr.Next != NextDrop || tr.Drop != "policy_drop_ingress" {
		t.Fatalf("to pod1 from A: %v, want dropped for policy_drop_ingress", tr)
	}
	// Traffic the policy does not touch still goes: 10.1.1.99 on A to the
	// unisolated 10.1.1.11 here.
	tr, err = d.TraceUnderlay(fromA(vpc1).geneve(t, podPacket("10.1.1.11").frame(t)))
	must(t, err)
	if tr.Next != NextPod {
		t.Fatalf("to 10.1.1.11 from A: %v, want delivered", tr)
	}
	waitDropEvent(t, evs, func(e DropEvent) bool {
		return e.Program == "pod" && e.Reason == "policy_drop_egress" && e.Src == pod1.IP && e.Dst == addr("10.1.1.20")
	})
	waitDropEvent(t, evs, func(e DropEvent) bool {
		return e.Program == "underlay" && e.Reason == "policy_drop_ingress" && e.Dst == pod1.IP && e.VNI == vpc1
	})
}
