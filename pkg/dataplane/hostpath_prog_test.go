package dataplane

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// The programs' host path decisions through BPF_PROG_TEST_RUN, on the unit
// fixture with VPC 100 (10.1.0.0/16) as the host VPC.
var (
	hostDevMAC     = mustMAC("02:fe:00:00:00:42")
	hostDevIfindex = 42 // no device: test runs do not follow redirects
)

func hostPathFixture(tb testing.TB) *Datapath {
	tb.Helper()
	d := fixture(tb)
	must(tb, d.putHostPath(vpc1, netip.MustParsePrefix("10.1.0.0/16"), hostDevIfindex, hostDevMAC))
	return d
}

// runMark runs the pod program on frame and returns its verdict and the
// skb mark it left.
func runMark(tb testing.TB, prog *ebpf.Program, frame []byte) (uint32, uint32) {
	tb.Helper()
	ctx := make([]byte, 192) // struct __sk_buff; mark at offset 8
	ctxOut := make([]byte, len(ctx))
	out := make([]byte, len(frame)+512)
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, DataOut: out, Context: ctx, ContextOut: ctxOut})
	if err != nil {
		tb.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret, binary.NativeEndian.Uint32(ctxOut[8:])
}

func TestHostPathPod(t *testing.T) {
	d := hostPathFixture(t)
	// Outside the VPC: to the host stack, marked as the host VPC's.
	delta := counterDelta(t, d)
	ret, mark := runMark(t, d.PodProgram(), fromPod1("10.96.0.10").frame(t))
	if ret != tcOK || mark != MarkHostVPC {
		t.Fatalf("pod1 -> ClusterIP: verdict %s mark %#x, want %s mark %#x", verdictName(d.PodProgram(), ret), mark,
			verdictName(d.PodProgram(), tcOK), MarkHostVPC)
	}
	expectCounts(t, delta().Pod, "to_host")

	// Another droplet's address: straight to it, in the host VPC, the
	// inner packet untouched but for the gateway hop.
	p := fromPod1(hostA.IP.String())
	out := expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, nil)
	g := expectGeneve(t, [][]byte{out}, &testHost{ip: hostH.IP, mac: hostH.MAC}, &testHost{ip: hostA.IP, mac: hostA.MAC}, vpc1, pod1.IP, hostA.IP)
	if g == nil {
		t.Fatal("no Geneve to A")
	}

	// Inside the VPC nothing changes: an unknown address goes to the
	// divider, as without a host path.
	expectVerdict(t, d.PodProgram(), fromPod1("10.1.9.9").frame(t), tcRedirect, nil)

	// The node's own address: host stack, marked too.
	must(t, d.SetHostAddrs([]netip.Addr{hostH.IP}))
	if ret, mark := runMark(t, d.PodProgram(), fromPod1(hostH.IP.String()).frame(t)); ret != tcOK || mark != MarkHostVPC {
		t.Fatalf("pod1 -> its node: verdict %d mark %#x", ret, mark)
	}

	// A pod of another VPC: its node only, marked as foreign; nothing else.
	must(t, d.UpsertPodInterface(PodInterface{Ifindex: 1, VNI: vpc2, IP: pod1.IP, MAC: pod1.MAC, Subnet: pod1.Subnet,
		GatewayIP: pod1.GatewayIP, GatewayMAC: pod1.GatewayMAC}))
	if ret, mark := runMark(t, d.PodProgram(), fromPod1(hostH.IP.String()).frame(t)); ret != tcOK || mark != MarkOtherVPC {
		t.Fatalf("other VPC's pod -> its node: verdict %d mark %#x, want OK, %#x", ret, mark, MarkOtherVPC)
	}
	for _, dst := range []string{"10.96.0.10", hostA.IP.String()} {
		if ret, _ := run(t, d.PodProgram(), fromPod1(dst).frame(t)); ret == tcOK {
			t.Errorf("other VPC's pod -> %s: passed to the host", dst)
		}
	}

	// Without a host path, a pod's node is still its own, unmarked.
	must(t, d.putHostPath(0, netip.Prefix{}, 0, nil))
	if ret, mark := runMark(t, d.PodProgram(), fromPod1(hostH.IP.String()).frame(t)); ret != tcOK || mark != 0 {
		t.Fatalf("no host path, pod -> its node: verdict %d mark %#x, want OK unmarked", ret, mark)
	}
}

func TestHostPathUnderlay(t *testing.T) {
	d := hostPathFixture(t)
	prog := d.UnderlayProgram()

	// A's pod to this droplet's address: into the host stack through the
	// host device, addressed to its MAC.
	in := podPacket(hostH.IP.String()).frame(t)
	delta := counterDelta(t, d)
	expectVerdict(t, prog, fromA(vpc1).geneve(t, in), xdpRedirect, withMACs(in, hostDevMAC, nil))
	expectCounts(t, delta().Underlay, "rx", "deliver")

	// A's host stack to pod1 (host traffic): delivered.
	host := podPacket(pod1.IP.String())
	host.src = hostA.IP
	in = host.frame(t)
	expectVerdict(t, prog, fromA(vpc1).geneve(t, in), xdpRedirect, withMACs(in, pod1.MAC, nil))

	for _, c := range []struct {
		name, src, dst string
		vni            uint32
		counter        string
	}{
		// Not the host VPC: no host traffic there.
		{"host traffic in another VPC", hostA.IP.String(), "10.1.1.20", vpc2, "drop_src_unknown"},
		// A speaks only for itself.
		{"A speaking as B", hostB.IP.String(), pod1.IP.String(), vpc1, "drop_src_unknown"},
		// Host to host is the underlay's business, not the overlay's.
		{"A's host to this host", hostA.IP.String(), hostH.IP.String(), vpc1, "drop_src_unknown"},
	} {
		p := podPacket(c.dst)
		p.src = addr(c.src)
		delta := counterDelta(t, d)
		if ret, _ := run(t, prog, fromA(c.vni).geneve(t, p.frame(t))); ret != xdpDrop {
			t.Errorf("%s: verdict %s, want drop", c.name, verdictName(prog, ret))
		}
		if got := delta().Underlay; got[c.counter] != 1 {
			t.Errorf("%s: counters %v, want %s", c.name, got, c.counter)
		}
	}
}

// BenchmarkHostPathPrograms: the fast paths of BenchmarkPrograms with a host
// path set (its lookups sit only on a flow's first packet and on packets
// to the host, so these must not move), and the host path's own paths.
// Same method: kernel-measured ns per run, interleaved with an empty
// program of the hook (x-empty-hook).
func BenchmarkHostPathPrograms(b *testing.B) {
	d := hostPathFixture(b)
	var pass passObjects
	must(b, loadPassObjects(&pass, nil))
	b.Cleanup(func() { _ = pass.Close() })
	hostTraffic := podPacket(pod1.IP.String())
	hostTraffic.src = hostA.IP
	for _, c := range []struct {
		name    string
		prog    *ebpf.Program
		frame   []byte
		verdict uint32
	}{
		{"underlay/decap-deliver", d.UnderlayProgram(), fromA(vpc1).geneve(b, podPacket("10.1.1.10").frame(b)), xdpRedirect},
		{"underlay/bouncer", d.UnderlayProgram(), fromA(vpc1).geneve(b, podPacket("10.1.1.20").frame(b)), xdpTX},
		{"pod/encap-bouncer", d.PodProgram(), fromPod1("10.1.1.30").frame(b), tcRedirect},
		{"pod/encap-direct", d.PodProgram(), fromPod1(epRemote.IP.String()).frame(b), tcRedirect},
		{"pod/same-host", d.PodProgram(), fromPod1(epLocal.IP.String()).frame(b), tcRedirect},
		{"hostpath/pod-to-service", d.PodProgram(), fromPod1("10.96.0.10").frame(b), tcOK},
		{"hostpath/pod-to-droplet", d.PodProgram(), fromPod1(hostA.IP.String()).frame(b), tcRedirect},
		{"hostpath/underlay-to-host", d.UnderlayProgram(), fromA(vpc1).geneve(b, podPacket(hostH.IP.String()).frame(b)), xdpRedirect},
		{"hostpath/underlay-host-traffic", d.UnderlayProgram(), fromA(vpc1).geneve(b, hostTraffic.frame(b)), xdpRedirect},
	} {
		b.Run(c.name, func(b *testing.B) {
			if ret, _ := run(b, c.prog, c.frame); ret != c.verdict {
				b.Fatalf("verdict %s, want %s: not the path this case measures", verdictName(c.prog, ret), verdictName(c.prog, c.verdict))
			}
			empty := pass.MizarXdpPass
			if c.prog.Type() == ebpf.SchedCLS {
				empty = pass.MizarTcPass
			}
			var progT, emptyT []time.Duration
			for b.Loop() {
				progT = append(progT, benchOnce(b, c.prog, c.frame))
				emptyT = append(emptyT, benchOnce(b, empty, c.frame))
			}
			per, hook := midMean(progT), midMean(emptyT)
			b.ReportMetric(per, "ns/op")
			b.ReportMetric(per/hook, "x-empty-hook")
		})
	}
}
