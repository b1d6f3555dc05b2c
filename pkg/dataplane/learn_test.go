package dataplane

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"
)

// Direct-path learning through BPF_PROG_TEST_RUN: a relay stamps the sender
// it verified, the delivering host learns from relays only, a host goes
// direct to a learned destination once it has introduced its pod there, and
// a host that is no relay re-bounces under the sender's address.

// stampedFrom is Geneve from hop carrying mizar's option naming host, with
// a packet from inner source src to dst.
func stampedFrom(t testing.TB, from Hop, host netip.Addr, src, dst string) []byte {
	o := fromA(vpc1)
	o.src, o.srcMAC = from.IP, from.MAC
	o.options = srcHostOption(host)
	p := podPacket(dst)
	p.src = addr(src)
	return o.geneve(t, p.frame(t))
}

func TestLearnStampAtRelay(t *testing.T) {
	d := fixture(t)
	// A (plain) sends to 10.1.1.20 on B through H, a relay, naming some
	// other host in its option: H writes A, the sender it verified.
	o := fromA(vpc1)
	o.options = srcHostOption(addr("198.18.0.77"))
	in := podPacket("10.1.1.20").frame(t)
	want := o.toward(hostB)
	want.options = srcHostOption(hostA.IP)
	delta := counterDelta(t, d)
	expectVerdict(t, d.UnderlayProgram(), o.geneve(t, in), xdpTX, want.geneve(t, in))
	expectCounts(t, delta().Underlay, "rx", "stamp", "fwd_endpoint")

	// From a relay the option is kept as it is: the first relay wrote it.
	c := o
	c.src, c.srcMAC = hostC.IP, hostC.MAC
	expectVerdict(t, d.UnderlayProgram(), c.geneve(t, in), xdpTX, c.toward(hostB).geneve(t, in))
}

func TestLearnFromRelaysOnly(t *testing.T) {
	d := fixture(t)
	prog := d.UnderlayProgram()
	// 10.1.1.77 is unknown here; A may not speak for it.
	p := podPacket("10.1.1.10")
	p.src = addr("10.1.1.77")
	direct := fromA(vpc1).geneve(t, p.frame(t))
	expectVerdict(t, prog, direct, xdpDrop, nil)

	// A plain host's own claim teaches nothing.
	expectVerdict(t, prog, stampedFrom(t, hostA, hostA.IP, "10.1.1.77", "10.1.1.10"), xdpDrop, nil)
	if l, _ := d.Learned(); len(l) != 0 {
		t.Fatalf("learned %v from a plain host", l)
	}

	// Relay C vouches: 10.1.1.77 lives at A. Delivered, and learned.
	delta := counterDelta(t, d)
	expectVerdict(t, prog, stampedFrom(t, hostC, hostA.IP, "10.1.1.77", "10.1.1.10"), xdpRedirect, nil)
	expectCounts(t, delta().Underlay, "rx", "learn", "deliver")
	l, err := d.Learned()
	must(t, err)
	if len(l) != 1 || l[0].VNI != vpc1 || l[0].IP != addr("10.1.1.77") || l[0].HostIP != hostA.IP ||
		l[0].TTL <= DefaultLearnLifetime-time.Minute || l[0].TTL > DefaultLearnLifetime {
		t.Fatalf("learned %+v, want 10.1.1.77 at A for about %v", l, DefaultLearnLifetime)
	}

	// Now A may send for it directly; nobody else may.
	expectVerdict(t, prog, direct, xdpRedirect, nil)
	must(t, d.SetRelays(vpc1, []netip.Addr{hostC.IP, hostD.IP, hostH.IP})) // B plain now
	fromB := fromA(vpc1)
	fromB.src, fromB.srcMAC = hostB.IP, hostB.MAC
	delta = counterDelta(t, d)
	expectVerdict(t, prog, fromB.geneve(t, p.frame(t)), xdpDrop, nil)
	expectCounts(t, delta().Underlay, "rx", "drop_src_spoofed")

	// Forgotten (the agent saw the endpoint go): refused again.
	must(t, d.ForgetLearned(vpc1, addr("10.1.1.77")))
	delta = counterDelta(t, d)
	expectVerdict(t, prog, direct, xdpDrop, nil)
	expectCounts(t, delta().Underlay, "rx", "drop_src_unknown")
}

func TestLearnExpires(t *testing.T) {
	requireRoot(t)
	d, err := Load(Options{PinRoot: testPinRoot(t), UnderlayIfindex: 1, HostIP: hostH.IP, HostMAC: hostH.MAC, LearnLifetime: time.Second})
	must(t, err)
	t.Cleanup(func() { _ = d.Close() })
	must(t, d.UpsertEndpoint(epPod1))
	must(t, d.UpsertVPC(VPC{VNI: vpc1, Dividers: []Hop{hostC}}))
	must(t, d.UpsertDroplet(hostA))
	must(t, d.UpsertDroplet(hostC))
	must(t, d.SetRelays(vpc1, []netip.Addr{hostC.IP}))
	expectVerdict(t, d.UnderlayProgram(), stampedFrom(t, hostC, hostA.IP, "10.1.1.77", "10.1.1.10"), xdpRedirect, nil)
	p := podPacket("10.1.1.10")
	p.src = addr("10.1.1.77")
	direct := fromA(vpc1).geneve(t, p.frame(t))
	expectVerdict(t, d.UnderlayProgram(), direct, xdpRedirect, nil)
	time.Sleep(1100 * time.Millisecond)
	expectVerdict(t, d.UnderlayProgram(), direct, xdpDrop, nil)
	if l, _ := d.Learned(); len(l) != 1 || l[0].TTL > 0 {
		t.Fatalf("learned %+v, want one expired entry", l)
	}
}

// The endpoint the agent names wins over what was learned, and replacing or
// deleting it drops what was learned.
func TestLearnInvalidatedByEndpointChanges(t *testing.T) {
	d := fixture(t)
	expectVerdict(t, d.UnderlayProgram(), stampedFrom(t, hostC, hostA.IP, "10.1.1.77", "10.1.1.10"), xdpRedirect, nil)
	must(t, d.DeleteEndpoint(vpc1, addr("10.1.1.77")))
	if l, _ := d.Learned(); len(l) != 0 {
		t.Fatalf("learned %v survived DeleteEndpoint", l)
	}
	expectVerdict(t, d.UnderlayProgram(), stampedFrom(t, hostC, hostA.IP, "10.1.1.77", "10.1.1.10"), xdpRedirect, nil)
	must(t, d.UpsertEndpoint(Endpoint{VNI: vpc1, IP: addr("10.1.1.77"), MAC: remoteMAC, HostIP: hostB.IP, HostMAC: hostB.MAC}))
	if l, _ := d.Learned(); len(l) != 0 {
		t.Fatalf("learned %v survived UpsertEndpoint", l)
	}
}

// The pod side: bounced (introducing the pod, option included) until
// INTRODUCE_DELAY_NS after the introduction, then direct to the learned host.
func TestLearnPodGoesDirect(t *testing.T) {
	d := fixture(t)
	// 10.1.1.30 is unknown to the agent: through bouncer C. A relay taught
	// H that it lives at A.
	expectVerdict(t, d.UnderlayProgram(), stampedFrom(t, hostC, hostA.IP, "10.1.1.30", "10.1.1.10"), xdpRedirect, nil)
	p := fromPod1("10.1.1.30")
	bounced := encapTo(hostC, p, vpc1).geneve(t, p.frame(t))
	delta := counterDelta(t, d)
	introduced := time.Now()
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, bounced)
	expectCounts(t, delta().Pod, "introduce")
	// Within the introduction delay (5 ms) still through the bouncer; a
	// machine too loaded to run the next packet that soon skips the check.
	ret, out := run(t, d.PodProgram(), p.frame(t))
	if time.Since(introduced) < 4*time.Millisecond && (ret != tcRedirect || string(out) != string(bounced)) {
		t.Fatalf("went direct before the introduction arrived:\n%s", dump(out))
	}

	// Then straight to A, at the MAC the agent gave for droplet A (same L2
	// segment: no FIB lookup), also for the flow's later packets.
	time.Sleep(6 * time.Millisecond)
	direct := encapTo(hostA, p, vpc1).direct().geneve(t, p.frame(t))
	delta = counterDelta(t, d)
	for range 2 {
		expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, direct)
	}
	expectCounts(t, delta().Pod, "encap_learned", "encap_learned")

	// Droplet A behind a router (no MAC): the outer MACs come from the FIB
	// of the netns running the test, so only what follows them is compared.
	must(t, d.UpsertDroplet(Hop{IP: hostA.IP}))
	delta = counterDelta(t, d)
	out = expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, nil)
	if string(out[:6]) == string(hostA.MAC) || string(out[12:]) != string(direct[12:]) {
		t.Fatalf("learned path to a routed droplet:\n%s\nwant (MACs from the FIB)\n%s", dump(out), dump(direct))
	}
	expectCounts(t, delta().Pod, "encap_learned")

	// Forgotten: back through the bouncer.
	must(t, d.ForgetLearned(vpc1, addr("10.1.1.30")))
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, bounced)
}

// A host that is no relay sends what it cannot deliver on to a relay under
// the sender's address (re-bounce); from a relay it drops it instead.
func TestLearnRebounce(t *testing.T) {
	d := fixture(t)
	must(t, d.SetRelays(vpc1, []netip.Addr{hostB.IP, hostC.IP, hostD.IP})) // H plain
	in := podPacket("10.1.1.20").frame(t)
	want := fromA(vpc1).toward(hostB)
	want.src = hostA.IP
	delta := counterDelta(t, d)
	expectVerdict(t, d.UnderlayProgram(), fromA(vpc1).geneve(t, in), xdpTX, want.geneve(t, in))
	expectCounts(t, delta().Underlay, "rx", "rebounce", "fwd_endpoint")

	fromC := fromA(vpc1)
	fromC.src, fromC.srcMAC = hostC.IP, hostC.MAC
	delta = counterDelta(t, d)
	expectVerdict(t, d.UnderlayProgram(), fromC.geneve(t, in), xdpDrop, nil)
	expectCounts(t, delta().Underlay, "rx", "drop_unknown_dst")
}

// Through the kernel: a and b on plain hosts A and B, C the only relay.
// During a long flow the hosts learn each other's pods from C and stop
// bouncing; when b goes away, nothing reaches a pod that is not a's peer.
func TestLearnedPathThroughKernel(t *testing.T) {
	tn := newTestNet(t, []string{"A", "B", "C"}, []podSpec{
		{"a", "A", vpc1, "10.1.1.10/24"},
		{"b", "B", vpc1, "10.1.1.20/24"},
		{"y", "B", vpc2, "10.1.1.20/24"}, // b's address in another VPC
	})
	tn.wireMode(t)
	tn.xdpTXToSwitch(t, "B") // B re-bounces with XDP_TX
	tn.mizarOneSubnet(t, false)
	a, b, y := tn.pods["a"], tn.pods["b"], tn.pods["y"]
	A, B, C := tn.hosts["A"], tn.hosts["B"], tn.hosts["C"]
	serveIdentity(t, b)

	pingLearns(t, a, b, A, C)
	if got := identity(t, a, b.ip); got != "b" {
		t.Fatalf("a reached %q at %s on the learned path, want b", got, b.ip)
	}

	// b goes away (its agent deletes it on B and on C; A is not told):
	// A's direct packets reach B, which no longer hosts b and hands them
	// back to the relay, which has no b. Nothing reaches b or y.
	must(t, B.dp.DeleteEndpoint(vpc1, b.ip))
	must(t, C.dp.DeleteEndpoint(vpc1, b.ip))
	capB, capY := b.ns.capture(t, "eth0"), y.ns.capture(t, "eth0")
	before := counters(t, C)
	if out, ok := a.ping(t, b.ip, 3); ok {
		t.Fatalf("a still reached b after b was deleted:\n%s", out)
	}
	settle()
	for name, c := range map[string]*capture{"b": capB, "y": capY} {
		for _, f := range c.stop() {
			if tosOf(t, [][]byte{f}, func(ip *layers.IPv4) bool { return ip.SrcIP.Equal(a.ip.AsSlice()) }) >= 0 {
				t.Fatalf("pod %s got a packet from a after b was deleted", name)
			}
		}
	}
	if n := counters(t, C).Underlay["drop_unknown_dst"] - before.Underlay["drop_unknown_dst"]; n < 3 {
		t.Fatalf("C dropped %d packets for the deleted b, want 3 (B re-bounced %d)", n, counters(t, B).Underlay["rebounce"])
	}
	// A's agent hears of it too: A forgets, and goes through C again.
	must(t, A.dp.ForgetLearned(vpc1, b.ip))
	if l, _ := A.dp.Learned(); len(l) != 0 {
		t.Fatalf("A still has %v", l)
	}
}

// A pod on a relay's node: B relays for the VPC too, so it knows where a
// lives and answers a's packets straight to A; those answers introduce b
// (B's word is a relay's), so A learns b's host and stops bouncing its side
// of the flow off C.
func TestLearnedPathToRelayNode(t *testing.T) {
	tn := newTestNet(t, []string{"A", "B", "C"}, []podSpec{
		{"a", "A", vpc1, "10.1.1.10/24"},
		{"b", "B", vpc1, "10.1.1.20/24"},
	})
	tn.wireMode(t)
	tn.mizarOneSubnet(t, false) // C bounces and divides; a and b known to it
	A, B, C := tn.hosts["A"], tn.hosts["B"], tn.hosts["C"]
	a, b := tn.pods["a"], tn.pods["b"]
	tn.setRelays(t, vpc1, B, C)
	tn.remoteEndpoint(t, B, a)

	pingLearns(t, a, b, A, C)
	if got := counters(t, B).Pod["introduce"]; got == 0 {
		t.Fatal("B never introduced b to A")
	}
}

// pingLearns sends 3 s of pings every 10 ms from a (on host A) to b: the
// first ones teach the hosts (through relay C), then the path is direct: none
// is lost, C sees none of the last 2 s, and A sent most on the learned path.
func pingLearns(t *testing.T, a, b *testPod, A, C *testHost) {
	t.Helper()
	done := make(chan string, 1)
	go func() {
		out, _ := a.pingArgs(t, b.ip, 300, "-i", "0.01", "-q")
		done <- out
	}()
	time.Sleep(time.Second)
	mid := counters(t, C).Underlay["rx"]
	out := <-done
	end := counters(t, C).Underlay["rx"]
	if !strings.Contains(out, " 0% packet loss") {
		t.Fatalf("pings lost while the path was learned:\n%s", out)
	}
	if end != mid {
		t.Fatalf("relay %s still saw %d Geneve frames in the last 2 s of the flow", C.name, end-mid)
	}
	if got := counters(t, A).Pod["encap_learned"]; got < 150 {
		t.Fatalf("%s sent %d packets on the learned path, want most of 300", A.name, got)
	}
}

// A learned path goes stale: b's address moves from B to a new pod b2 on D
// and A is not told. A's direct packets reach B, which re-bounces them to
// the relay under A's address; the relay delivers to b2. Nothing is lost,
// nothing reaches the old pod, and A learns the new host.
func TestLearnedPathStaleHost(t *testing.T) {
	tn := newTestNet(t, []string{"A", "B", "C", "D"}, []podSpec{
		{"a", "A", vpc1, "10.1.1.10/24"},
		{"b", "B", vpc1, "10.1.1.20/24"},
		{"b2", "D", vpc1, "10.1.1.20/24"}, // where b's address moves to
	})
	tn.wireMode(t)
	tn.xdpTXToSwitch(t, "B") // re-bounces
	tn.xdpTXToSwitch(t, "C") // the relay
	A, B, C, D := tn.hosts["A"], tn.hosts["B"], tn.hosts["C"], tn.hosts["D"]
	for _, h := range tn.order {
		tn.loadMizar(t, h)
		must(t, h.dp.UpsertVPC(VPC{VNI: vpc1, Dividers: []Hop{C.hop()}}))
		must(t, h.dp.UpsertSubnet(Subnet{VNI: vpc1, Prefix: netip.MustParsePrefix("10.1.1.0/24"), Bouncers: []Hop{C.hop()}}))
	}
	tn.setRelays(t, vpc1, C)
	a, b, b2 := tn.pods["a"], tn.pods["b"], tn.pods["b2"]
	tn.remoteEndpoint(t, C, a)
	tn.remoteEndpoint(t, C, b)
	serveIdentity(t, b)
	serveIdentity(t, b2)

	if out, ok := a.pingArgs(t, b.ip, 20, "-i", "0.02"); !ok {
		t.Fatalf("a -> b failed:\n%s", out)
	}
	if l, _ := A.dp.Learned(); len(l) != 1 || l[0].HostIP != B.ip {
		t.Fatalf("A learned %+v, want b at B", l)
	}

	// The move, as the agents of B and C see it.
	must(t, B.dp.DeleteEndpoint(vpc1, b.ip))
	tn.remoteEndpoint(t, C, b2)
	capB := b.ns.capture(t, "eth0")
	before := counters(t, B)
	if out, ok := a.pingArgs(t, b2.ip, 20, "-i", "0.02"); !ok || !strings.Contains(out, " 0% packet loss") {
		t.Fatalf("packets lost after the move:\n%s", out)
	}
	if got := identity(t, a, b2.ip); got != "b2" {
		t.Fatalf("a reached %q at %s after the move, want b2", got, b2.ip)
	}
	settle()
	for _, f := range capB.stop() {
		if tosOf(t, [][]byte{f}, func(ip *layers.IPv4) bool { return ip.SrcIP.Equal(a.ip.AsSlice()) }) >= 0 {
			t.Fatal("the old pod b got a packet from a after the move")
		}
	}
	if n := counters(t, B).Underlay["rebounce"] - before.Underlay["rebounce"]; n == 0 {
		t.Fatal("B re-bounced nothing: the stale path was not exercised")
	}
	if l, _ := A.dp.Learned(); len(l) != 1 || l[0].HostIP != D.ip {
		t.Fatalf("A learned %+v, want 10.1.1.20 at D now", l)
	}
}

// The option class moved to the experimental range; a host still writing
// the old class (an upgrade in progress) is delivered and relayed as
// before, but its option teaches nothing and is not stamped.
func TestLegacyOptionClassSkipped(t *testing.T) {
	d := fixture(t)
	legacy := func(from Hop) []byte {
		o := fromA(vpc1)
		o.src, o.srcMAC = from.IP, from.MAC
		o.options = []*layers.GeneveOption{{Class: legacyOptClass, Type: 0x01, Data: hostA.IP.AsSlice()}}
		p := podPacket("10.1.1.10")
		p.src = addr("10.1.1.77")
		return o.geneve(t, p.frame(t))
	}
	delta := counterDelta(t, d)
	expectVerdict(t, d.UnderlayProgram(), legacy(hostC), xdpRedirect, nil)
	expectCounts(t, delta().Underlay, "rx", "deliver")
	if l, _ := d.Learned(); len(l) != 0 {
		t.Fatalf("learned %v from the legacy option class", l)
	}
	// The same from the new class is learned.
	expectVerdict(t, d.UnderlayProgram(), stampedFrom(t, hostC, hostA.IP, "10.1.1.77", "10.1.1.10"), xdpRedirect, nil)
	if l, _ := d.Learned(); len(l) != 1 || l[0].HostIP != hostA.IP {
		t.Fatalf("learned %+v, want 10.1.1.77 at A", l)
	}
}
