package dataplane

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"mizar.dev/pkg/netpol"
	"mizar.dev/pkg/netpol/netpoltest"
)

// The policy world of pkg/netpol's tests (netpoltest.World), for real: its
// namespaces x, y, z x pods a, b, c of VNI 1 become VPC 100 pods spread over
// hosts A and B, its overlapping VNI 2 pods (same addresses as x/a and x/b)
// VPC 200 pods. All sit in one subnet, 10.0.0.0/16; C is its bouncer, and
// every host knows every pod (traffic goes host to host: both the pod
// program and the decapsulating underlay program enforce).
func buildPolicyNet(t *testing.T) (*testNet, *netpol.Input, map[string]*testPod) {
	in := netpoltest.World()
	var specs []podSpec
	byPod := map[string]*testPod{}
	names := make([]string, len(in.Pods))
	for i, p := range in.Pods {
		names[i] = fmt.Sprintf("%s%s", p.Namespace, p.Name)
		host := []string{"A", "B"}[i%2]
		specs = append(specs, podSpec{names[i], host, vniOf(p.VNI), p.IP.String() + "/16"})
	}
	tn := newTestNet(t, []string{"A", "B", "C"}, specs)
	tn.netpol = true
	tn.wireMode(t)
	C := tn.hosts["C"]
	for _, h := range tn.order {
		tn.loadMizar(t, h)
		for _, vni := range []uint32{vpc1, vpc2} {
			must(t, h.dp.UpsertVPC(VPC{VNI: vni, Dividers: []Hop{C.hop()}}))
			must(t, h.dp.UpsertSubnet(Subnet{VNI: vni, Prefix: netip.MustParsePrefix("10.0.0.0/16"), Bouncers: []Hop{C.hop()}}))
		}
	}
	tn.setRelays(t, vpc1, C)
	tn.setRelays(t, vpc2, C)
	for _, p := range tn.pods {
		for _, h := range tn.order {
			if h != p.host {
				tn.remoteEndpoint(t, h, p)
			}
		}
	}
	for i := range in.Pods {
		byPod[names[i]] = tn.pods[names[i]]
	}
	return tn, in, byPod
}

// vniOf maps netpoltest's VNIs to the test net's VPCs.
func vniOf(v uint32) uint32 {
	if v == 1 {
		return vpc1
	}
	return vpc2
}

// policyInput is in with the test net's VNIs.
func policyInput(in *netpol.Input) *netpol.Input {
	out := *in
	out.Pods = make([]netpol.Pod, len(in.Pods))
	for i, p := range in.Pods {
		p.VNI = vniOf(p.VNI)
		out.Pods[i] = p
	}
	return &out
}

// applyPolicies compiles in (with policies ps) and applies it on every host.
func applyPolicies(t *testing.T, tn *testNet, c *netpol.Compiler, in *netpol.Input, ps []*networkingv1.NetworkPolicy) *netpol.Input {
	t.Helper()
	in.Policies = ps
	pin := policyInput(in)
	comp, err := c.Compile(pin)
	must(t, err)
	for _, h := range tn.order {
		if _, err := h.dp.ApplyPolicy(comp); err != nil {
			t.Fatalf("%s: %v", h.name, err)
		}
	}
	return pin
}

// servePolicyPorts runs, in every pod, TCP services on 80 and on its
// serve-<name> port and a UDP echo on 81, each answering the pod's name.
func servePolicyPorts(t *testing.T, pods map[string]*testPod, in *netpol.Input) {
	for _, p := range in.Pods {
		tp := pods[p.Namespace+p.Name]
		for _, port := range p.Ports {
			switch port.Protocol {
			case netpol.ProtoTCP:
				serveName(t, tp, port.Port)
			case netpol.ProtoUDP:
				echoName(t, tp, port.Port)
			}
		}
	}
}

func serveName(t *testing.T, p *testPod, port uint16) {
	l := p.ns.listen(t, fmt.Sprintf("%s:%d", p.ip, port))
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(p.name))
			_ = c.Close()
		}
	}()
}

func echoName(t *testing.T, p *testPod, port uint16) {
	var pc net.PacketConn
	p.ns.do(t, func() (err error) {
		pc, err = net.ListenPacket("udp4", fmt.Sprintf("%s:%d", p.ip, port))
		return err
	})
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(p.name), from)
		}
	}()
}

// probe says whether src reached dst's service (and the right pod: the
// VPCs overlap) within timeout.
func probe(src *testPod, dst *testPod, proto uint8, port uint16, timeout time.Duration) bool {
	addr := netip.AddrPortFrom(dst.ip, port).String()
	var got string
	err := src.ns.ns.Do(func(ns.NetNS) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if proto == netpol.ProtoTCP {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp4", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(timeout))
			b := make([]byte, 64)
			n, _ := c.Read(b) // the name, then EOF
			got = string(b[:n])
			return nil
		}
		c, err := net.Dial("udp4", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		b := make([]byte, 64)
		for i := 0; i < 3; i++ { // UDP may lose the first one to ARP
			if _, err := c.Write([]byte("who")); err != nil {
				return err
			}
			_ = c.SetReadDeadline(time.Now().Add(timeout / 3))
			n, err := c.Read(b)
			if err == nil {
				got = string(b[:n])
				return nil
			}
		}
		return errors.New("no answer")
	})
	return err == nil && got == dst.name
}

type probeCase struct {
	src, dst *testPod
	pkt      netpol.Packet
}

// truthTable probes every ordered pair of pods of one VPC on TCP 80, TCP
// on the destination's serve-<name> port and UDP 81, and compares each
// answer with netpol.Decide. Returns how many were allowed and refused.
func truthTable(t *testing.T, in *netpol.Input, pods map[string]*testPod) (allowed, refused int) {
	t.Helper()
	var cases []probeCase
	for _, s := range in.Pods {
		for _, d := range in.Pods {
			if s.VNI != d.VNI || s.IP == d.IP {
				continue
			}
			sp, dp := pods[s.Namespace+s.Name], pods[d.Namespace+d.Name]
			for _, port := range d.Ports { // every one is served
				cases = append(cases, probeCase{sp, dp, netpol.Packet{VNI: s.VNI, Src: s.IP, Dst: d.IP, Proto: port.Protocol, DstPort: port.Port}})
			}
		}
	}
	var mu sync.Mutex
	var bad []string
	sem := make(chan struct{}, 24)
	var wg sync.WaitGroup
	for _, c := range cases {
		want := netpol.Decide(in, c.pkt)
		if want {
			allowed++
		} else {
			refused++
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			// Allowed probes get time (and one retry) on a busy machine;
			// refused ones need only outlast a round trip.
			got := probe(c.src, c.dst, c.pkt.Proto, c.pkt.DstPort, 700*time.Millisecond)
			if !got && want {
				got = probe(c.src, c.dst, c.pkt.Proto, c.pkt.DstPort, 3*time.Second)
			}
			if got != want {
				mu.Lock()
				bad = append(bad, fmt.Sprintf("%s -> %s proto %d port %d: reached=%v, Decide says %v",
					c.src.name, c.dst.name, c.pkt.Proto, c.pkt.DstPort, got, want))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Errorf("%d of %d probes disagree with Decide:\n%s", len(bad), len(cases), strings.Join(bad, "\n"))
	}
	return allowed, refused
}

// TestNetworkPolicyTruthTable: pods over two hosts and an overlapping VPC,
// probed pair by pair through the kernel after each of a series of policy
// changes; every probe must match netpol.Decide.
func TestNetworkPolicyTruthTable(t *testing.T) {
	tn, in, pods := buildPolicyNet(t)
	servePolicyPorts(t, pods, in)
	c := netpol.NewCompiler()
	r := rand.New(rand.NewPCG(21, 2))
	ingress := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egress := []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	sets := []struct {
		name string
		ps   []*networkingv1.NetworkPolicy
	}{
		{"no policy", nil},
		{"x denies ingress but from y on 80, z denies egress but to 10.0.0.0/16 except 10.0.1.0/24", []*networkingv1.NetworkPolicy{
			netpoltest.Policy("x", "deny", nil, ingress, []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": "y"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: netpoltest.Num(80)}}}}, nil),
			netpoltest.Policy("z", "out", nil, egress, nil, []networkingv1.NetworkPolicyEgressRule{{
				To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.0.1.0/24"}}}}}}),
		}},
		{"named ports: y/b takes its serve-b from anyone, x/c sends only to serve-c ports", []*networkingv1.NetworkPolicy{
			netpoltest.Policy("y", "b", map[string]string{"pod": "b"}, ingress, []networkingv1.NetworkPolicyIngressRule{{
				Ports: []networkingv1.NetworkPolicyPort{{Port: netpoltest.Named("serve-b")}}}}, nil),
			netpoltest.Policy("x", "c", map[string]string{"pod": "c"}, egress, nil, []networkingv1.NetworkPolicyEgressRule{{
				Ports: []networkingv1.NetworkPolicyPort{{Port: netpoltest.Named("serve-c")}}}}),
		}},
		{"random 1", netpoltest.RandomPolicies(r, 3)},
		{"random 2", netpoltest.RandomPolicies(r, 4)},
		{"random 3", netpoltest.RandomPolicies(r, 2)},
	}
	total := 0
	for _, s := range sets {
		pin := applyPolicies(t, tn, c, in, s.ps)
		a, rf := truthTable(t, pin, pods)
		t.Logf("%s: %d probes allowed, %d refused, all as Decide says", s.name, a, rf)
		if s.ps != nil && rf == 0 {
			t.Errorf("%s: refuses nothing: the set proves little", s.name)
		}
		total += a + rf
		if t.Failed() {
			t.Fatalf("policies of %q:\n%s", s.name, netpoltest.Describe(s.ps))
		}
	}
	st, err := tn.hosts["A"].dp.PolicyCounters()
	must(t, err)
	if st["drop_ingress"] == 0 || st["drop_egress"] == 0 || st["allow_new"] == 0 {
		t.Errorf("A's policy counters %v: want ingress and egress refusals and new connections", st)
	}
	refusals, err := tn.hosts["A"].dp.PolicyRefusals()
	must(t, err)
	if len(refusals) == 0 {
		t.Error("no refusals per pod on A")
	}
	t.Logf("%d probes in all; A: %v", total, st)
}

// TestNetworkPolicyEstablished: replies of allowed connections pass an
// ingress-isolated sender; a policy change keeps established connections
// it still allows and cuts, within a second, the ones it no longer does.
func TestNetworkPolicyEstablished(t *testing.T) {
	tn, in, pods := buildPolicyNet(t)
	c := netpol.NewCompiler()
	xa, yb, yc, za := pods["xa"], pods["ya"], pods["yc"], pods["za"] // xa on A, ya and yc on B, za on A
	for _, p := range []*testPod{yb, yc, za} {
		serveEcho(t, p, 7000)
	}
	// Opened before any policy: x/a becoming isolated later must not cut
	// it (its replies are part of a connection x/a opened).
	applyPolicies(t, tn, c, in, nil)
	early := dialEcho(t, xa, yc, 7000)
	if err := echoOnce(early, time.Second); err != nil {
		t.Fatalf("x/a -> y/c without policy: %v", err)
	}
	ingress := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	// x takes nothing in: replies to x/a's own connections must pass.
	denyX := netpoltest.Policy("x", "deny", nil, ingress, nil, nil)
	applyPolicies(t, tn, c, in, []*networkingv1.NetworkPolicy{denyX})
	if err := echoOnce(early, time.Second); err != nil {
		t.Fatalf("x/a -> y/c, opened before x/a was isolated, was cut: %v", err)
	}

	toYA := dialEcho(t, xa, yb, 7000) // across hosts
	toZA := dialEcho(t, xa, za, 7000) // same host
	for _, c := range []net.Conn{toYA, toZA} {
		if err := echoOnce(c, time.Second); err != nil {
			t.Fatalf("x/a's connection %v: replies refused: %v", c.RemoteAddr(), err)
		}
	}
	// y and z now take in only from z: x/a -> y/a is cut, x/a -> z/a stays.
	onlyZ := []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
		{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": "z"}}}}}}
	applyPolicies(t, tn, c, in, []*networkingv1.NetworkPolicy{denyX,
		netpoltest.Policy("y", "z-only", nil, ingress, onlyZ, nil),
		netpoltest.Policy("z", "x-too", nil, ingress, append(onlyZ, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{
			{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": "x"}}}}}), nil),
	})
	start := time.Now()
	if err := echoOnce(toYA, time.Second); err == nil {
		t.Fatal("x/a -> y/a still answers after the policy refused it")
	}
	t.Logf("x/a -> y/a cut after %v", time.Since(start).Round(time.Millisecond))
	if err := echoOnce(toZA, time.Second); err != nil {
		t.Fatalf("x/a -> z/a, still allowed, was cut: %v", err)
	}
	// y/a was not isolated when the connection opened, so B kept no entry
	// for it: its next packet is refused as new. x/a -> z/a was tracked on A
	// (x/a is isolated) and re-decided under the new policy.
	st, err := tn.hosts["B"].dp.PolicyCounters()
	must(t, err)
	if st["drop_ingress"]+st["drop_cut_ingress"] == 0 {
		t.Errorf("B's counters %v: want y/a's refusals", st)
	}
	st, err = tn.hosts["A"].dp.PolicyCounters()
	must(t, err)
	if st["recheck_kept"] < 2 || st["allow_reply"] == 0 {
		t.Errorf("A's counters %v: want replies let in and a connection kept on re-check", st)
	}
}

func serveEcho(t *testing.T, p *testPod, port uint16) {
	l := p.ns.listen(t, fmt.Sprintf("%s:%d", p.ip, port))
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 64)
				for {
					n, err := c.Read(b)
					if err != nil {
						return
					}
					if _, err := c.Write(b[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
}

func dialEcho(t *testing.T, src, dst *testPod, port uint16) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := src.ns.dial(ctx, fmt.Sprintf("%s:%d", dst.ip, port))
	if err != nil {
		t.Fatalf("%s -> %s: %v", src.name, dst.name, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// echoOnce sends a line and waits for its echo.
func echoOnce(c net.Conn, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	b := make([]byte, 5)
	n := 0
	for n < 5 {
		m, err := c.Read(b[n:])
		if err != nil {
			return err
		}
		n += m
	}
	return nil
}

// TestNetworkPolicyFromOwnNode: a pod that policy isolates both ways still
// answers its own node (kubelet's probes), as Kubernetes requires: the node
// reaches it through the kernel route, and its answers to the node's
// addresses leave for the host stack before any policy check.
func TestNetworkPolicyFromOwnNode(t *testing.T) {
	tn := newTestNet(t, []string{"A"}, []podSpec{{"a", "A", vpc1, "10.1.1.10/24"}})
	tn.netpol = true
	A, a := tn.hosts["A"], tn.pods["a"]
	tn.loadMizar(t, A)
	must(t, A.dp.SetHostAddrs([]netip.Addr{A.ip}))
	hl, err := A.ns.nl.LinkByName(a.hostIf)
	must(t, err)
	must(t, A.ns.nl.LinkSetHardwareAddr(hl, gatewayMAC))
	must(t, A.ns.nl.NeighSet(&netlink.Neigh{LinkIndex: a.hostIndex, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: a.ip.AsSlice(), HardwareAddr: a.mac}))
	must(t, A.ns.nl.RouteAdd(&netlink.Route{LinkIndex: a.hostIndex, Dst: prefixNet(netip.PrefixFrom(a.ip, 32)),
		Src: A.ip.AsSlice(), Scope: netlink.SCOPE_LINK}))
	both := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	in := &netpol.Input{Pods: []netpol.Pod{{Namespace: "x", Name: "a", VNI: vpc1, IP: a.ip}}}
	in.Policies = []*networkingv1.NetworkPolicy{netpoltest.Policy("x", "deny", nil, both, nil, nil)}
	comp, err := netpol.NewCompiler().Compile(in)
	must(t, err)
	_, err = A.dp.ApplyPolicy(comp)
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := A.ns.exec(ctx, "ping", "-n", "-q", "-c", "3", "-i", "0.2", "-W", "1", a.ip.String()); err != nil {
		t.Fatalf("node -> its isolated pod %v: %v: %s", a.ip, err, out)
	}
	// Nothing of it went through a policy decision.
	if st, err := A.dp.PolicyCounters(); err != nil || st["drop_egress"]+st["drop_ingress"] != 0 {
		t.Fatalf("policy refused the node's traffic: %v %v", st, err)
	}
}
