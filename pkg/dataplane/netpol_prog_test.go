package dataplane

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket/layers"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"mizar.dev/pkg/netpol"
	"mizar.dev/pkg/netpol/netpoltest"
)

// policyFixture is the unit-test world (fixture) loaded with
// Options.NetworkPolicy, and its VPC 100 pods as a policy Input: namespace
// "bench", label pod=<last octet>.
func policyFixture(tb testing.TB) (*Datapath, *netpol.Input) {
	tb.Helper()
	requireRoot(tb)
	d, err := Load(Options{PinRoot: testPinRoot(tb), UnderlayIfindex: 1, HostIP: hostH.IP, HostMAC: hostH.MAC, UnderlayMTU: 1500, NetworkPolicy: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = d.Close() })
	populate(tb, d)
	in := &netpol.Input{Namespaces: map[string]map[string]string{"bench": {"ns": "bench"}}}
	for _, ep := range []Endpoint{epPod1, epLocal, epLocalS2, epRemote, epFromA} {
		in.Pods = append(in.Pods, netpol.Pod{Namespace: "bench", Name: ep.IP.String(), VNI: ep.VNI, IP: ep.IP,
			Labels: map[string]string{"pod": fmt.Sprint(ep.IP.As4()[3])}})
	}
	return d, in
}

func applyTo(tb testing.TB, d *Datapath, in *netpol.Input, ps ...*networkingv1.NetworkPolicy) {
	tb.Helper()
	in.Policies = ps
	comp, err := netpol.NewCompiler().Compile(in)
	must(tb, err)
	if _, err := d.ApplyPolicy(comp); err != nil {
		tb.Fatal(err)
	}
}

// asSCTP turns an IPv4 UDP frame into SCTP (protocol 132, same first L4
// word: the ports are all policy reads).
func asSCTP(f []byte) []byte {
	f[14+9] = 132
	f[14+10], f[14+11] = 0, 0
	var sum uint32
	for i := 14; i < 34; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(f[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(f[24:], ^uint16(sum))
	return f
}

// TestNetworkPolicyPrograms: SCTP port ranges, UDP and TCP through both
// programs (pod egress, decapsulated ingress), each verdict held against
// netpol.Decide.
func TestNetworkPolicyPrograms(t *testing.T) {
	d, in := policyFixture(t)
	sctp := corev1.ProtocolSCTP
	self := map[string]string{"pod": "10"}
	applyTo(t, d, in, netpoltest.Policy("bench", "pod1", self,
		[]networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &sctp, Port: netpoltest.Num(80), EndPort: netpoltest.I32(90)}}}},
		[]networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "20"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &sctp, Port: netpoltest.Num(7000)}, {Port: netpoltest.Num(8080)}}}}))
	cases := []struct {
		name  string
		egr   bool // pod1 sends (pod program), else it receives from A (underlay)
		proto uint8
		port  uint16
	}{
		{"egress sctp 7000", true, netpol.ProtoSCTP, 7000},
		{"egress sctp 7001", true, netpol.ProtoSCTP, 7001},
		{"egress tcp 8080", true, netpol.ProtoTCP, 8080},
		{"egress udp 8080", true, netpol.ProtoUDP, 8080},
		{"ingress sctp 80", false, netpol.ProtoSCTP, 80},
		{"ingress sctp 90", false, netpol.ProtoSCTP, 90},
		{"ingress sctp 91", false, netpol.ProtoSCTP, 91},
		{"ingress udp 85", false, netpol.ProtoUDP, 85},
		{"ingress tcp 85", false, netpol.ProtoTCP, 85},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var p inner
			var pkt netpol.Packet
			if c.egr {
				p = fromPod1(epRemote.IP.String())
				pkt = netpol.Packet{VNI: vpc1, Src: pod1.IP, Dst: epRemote.IP, Proto: c.proto, DstPort: c.port}
			} else {
				p = podPacket(pod1.IP.String())
				pkt = netpol.Packet{VNI: vpc1, Src: epFromA.IP, Dst: pod1.IP, Proto: c.proto, DstPort: c.port}
			}
			p.sport = uint16(20000 + i) // a new connection each
			p.dport = c.port
			if c.proto != netpol.ProtoTCP {
				p.proto = layers.IPProtocolUDP
			}
			f := p.frame(t)
			if c.proto == netpol.ProtoSCTP {
				f = asSCTP(f)
			}
			want := netpol.Decide(in, pkt)
			var ret uint32
			var ok bool
			if c.egr {
				ret, _ = run(t, d.PodProgram(), f)
				ok = ret == tcRedirect
			} else {
				ret, _ = run(t, d.UnderlayProgram(), fromA(vpc1).geneve(t, f))
				ok = ret == xdpRedirect
			}
			if ok != want {
				t.Fatalf("verdict %d (passed=%v), Decide says %v", ret, ok, want)
			}
		})
	}
}

// BenchmarkNetworkPolicy: per-packet cost of the pod path (to a remote pod
// and to a pod of this host) and of the decapsulation path with policy
// compiled in, with 0, 10 and 1,000 policies selecting the pod, on an
// established connection and on its re-check after a policy change, as a
// ratio to the same path with policy compiled out (x-no-policy: "main"),
// measured interleaved round by round in the same run.
func BenchmarkNetworkPolicy(b *testing.B) {
	off := fixture(b)
	on, in := policyFixture(b)

	remote := fromPod1(epRemote.IP.String())
	local := fromPod1(epLocal.IP.String())
	decap := fromA(vpc1).geneve(b, podPacket(pod1.IP.String()).frame(b))
	paths := []struct {
		name    string
		frame   []byte
		under   bool
		verdict uint32
	}{
		{"pod-encap-direct", remote.frame(b), false, tcRedirect},
		{"pod-same-host", local.frame(b), false, tcRedirect},
		{"underlay-decap-deliver", decap, true, xdpRedirect},
	}
	// Policies selecting every pod of the namespace: one allows the VPC's
	// pods both ways; the others each allow one /32 somewhere else, so the
	// rule and prefix maps grow with their number.
	policies := func(n int) []*networkingv1.NetworkPolicy {
		both := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
		all := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}
		if n == 0 {
			return nil
		}
		ps := []*networkingv1.NetworkPolicy{netpoltest.Policy("bench", "vpc", nil, both,
			[]networkingv1.NetworkPolicyIngressRule{{From: all}}, []networkingv1.NetworkPolicyEgressRule{{To: all}})}
		for i := 1; i < n; i++ {
			blk := []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{
				CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16, byte(i >> 8), byte(i)}), 32).String()}}}
			ps = append(ps, netpoltest.Policy("bench", fmt.Sprintf("p%d", i), nil, both,
				[]networkingv1.NetworkPolicyIngressRule{{From: blk, Ports: []networkingv1.NetworkPolicyPort{{Port: netpoltest.Num(9000)}}}},
				[]networkingv1.NetworkPolicyEgressRule{{To: blk}}))
		}
		return ps
	}
	for _, n := range []int{0, 10, 1000} {
		start := time.Now()
		applyTo(b, on, in, policies(n)...)
		b.Logf("%d policies compiled and applied in %v", n, time.Since(start).Round(time.Millisecond))
		for _, recheck := range []bool{false, true} {
			if recheck && n == 0 {
				continue
			}
			for _, p := range paths {
				name := fmt.Sprintf("%s/policies-%d", p.name, n)
				if recheck {
					name += "/recheck"
				}
				b.Run(name, func(b *testing.B) {
					progOff, progOn := off.PodProgram(), on.PodProgram()
					if p.under {
						progOff, progOn = off.UnderlayProgram(), on.UnderlayProgram()
					}
					for _, prog := range []*benchProg{{progOff, "off"}, {progOn, "on"}} {
						if ret, _ := run(b, prog.p, p.frame); ret != p.verdict {
							b.Fatalf("%s: verdict %s, want %s", prog.name, verdictName(prog.p, ret), verdictName(prog.p, p.verdict))
						}
					}
					var offT, onT []time.Duration
					for b.Loop() {
						if recheck {
							// A policy change before every packet: the
							// connection is re-decided from the maps.
							if _, err := on.bumpPolicyGeneration(); err != nil {
								b.Fatal(err)
							}
						}
						offT = append(offT, benchOnce(b, progOff, p.frame))
						onT = append(onT, benchOnce(b, progOn, p.frame))
					}
					o, w := midMean(offT), midMean(onT)
					b.ReportMetric(w, "ns/op")
					b.ReportMetric(o, "no-policy-ns")
					b.ReportMetric(w/o, "x-no-policy")
				})
			}
		}
	}
}

type benchProg struct {
	p    *ebpf.Program
	name string
}

// TestNetworkPolicyApplyScale: 10,000 pods and 100 policies compiled and
// written to the maps, then one more policy: the agent's share of the
// "applied within 1 s" budget, logged; a change rewrites only what changed.
func TestNetworkPolicyApplyScale(t *testing.T) {
	d, _ := policyFixture(t)
	in := netpoltest.Scale(10000, 100)
	c := netpol.NewCompiler()
	apply := func(what string) PolicyApplied {
		start := time.Now()
		comp, err := c.Compile(in)
		must(t, err)
		compiled := time.Since(start)
		st, err := d.ApplyPolicy(comp)
		must(t, err)
		t.Logf("%s: compiled in %v, applied in %v more (%d written, %d deleted)", what, compiled.Round(time.Millisecond),
			(time.Since(start) - compiled).Round(time.Millisecond), st.Written, st.Deleted)
		return st
	}
	first := apply("10,000 pods, 100 policies, first apply")
	if first.Written < 10000 {
		t.Fatalf("first apply wrote %d entries", first.Written)
	}
	// ns7's a3 pods were selected by no policy: now they take nothing in.
	np := netpoltest.Policy("ns7", "one-more", map[string]string{"app": "a3"}, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, nil, nil)
	in.Policies = append(in.Policies, np)
	st := apply("one policy more")
	if st.Written != 10 || st.Deleted != 0 {
		t.Errorf("one policy more wrote %d and deleted %d entries, want the 10 endpoints it isolates", st.Written, st.Deleted)
	}
}
