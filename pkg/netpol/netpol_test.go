package netpol_test

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	. "mizar.dev/pkg/netpol"
	. "mizar.dev/pkg/netpol/netpoltest"
)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func tcp(vni uint32, src, dst string, port uint16) Packet {
	return Packet{VNI: vni, Src: ip(src), Dst: ip(dst), Proto: ProtoTCP, DstPort: port}
}

var (
	ingressOnly = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egressOnly  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	both        = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
)

// TestDecide pins the oracle to the API reference, case by case.
func TestDecide(t *testing.T) {
	xa, xb, xc := "10.0.0.10", "10.0.0.11", "10.0.0.12"
	ya, zc := "10.0.1.10", "10.0.2.12"
	outside := "192.168.7.7"
	cases := []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		pkt      Packet
		want     bool
	}{
		{"no policy", nil, tcp(1, xa, xb, 80), true},
		{"deny all ingress", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly, nil, nil)}, tcp(1, ya, xb, 80), false},
		{"deny all ingress leaves egress", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly, nil, nil)}, tcp(1, xa, ya, 80), true},
		{"policyTypes default: ingress", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, nil, nil, nil)}, tcp(1, ya, xa, 80), false},
		{"policyTypes default: egress when egress rules", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, nil, nil,
			[]networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "b"}}}}}})},
			tcp(1, xa, ya, 80), false},
		{"deny all egress", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, egressOnly, nil, nil)}, tcp(1, xa, ya, 80), false},
		{"selects nothing", []*networkingv1.NetworkPolicy{Policy("x", "d", map[string]string{"pod": "nope"}, both, nil, nil)}, tcp(1, xa, xb, 80), true},
		{"allow all ingress rule", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly, []networkingv1.NetworkPolicyIngressRule{{}}, nil)}, tcp(1, zc, xa, 9), true},
		{"pod selector is own namespace only", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}}}}}}, nil)},
			tcp(1, ya, xb, 80), false},
		{"pod selector same namespace", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}}}}}}, nil)},
			tcp(1, xa, xb, 80), true},
		{"namespace selector", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}}}}}, nil)},
			tcp(1, ya, xb, 80), true},
		{"namespace and pod selector (and)", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}},
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "b"}}}}}}, nil)},
			tcp(1, ya, xb, 80), false},
		{"ipBlock", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16"}}}}}, nil)},
			tcp(1, outside, xb, 80), true},
		{"ipBlock except", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16", Except: []string{"192.168.7.0/24"}}}}}}, nil)},
			tcp(1, outside, xb, 80), false},
		{"ipBlock matches pod IPs", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: ya + "/32"}}}}}, nil)},
			tcp(1, ya, xb, 80), true},
		{"port", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: Num(80)}}}}, nil)},
			tcp(1, ya, xb, 81), false},
		{"port default TCP", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: Num(80)}}}}, nil)},
			Packet{VNI: 1, Src: ip(ya), Dst: ip(xb), Proto: ProtoUDP, DstPort: 80}, false},
		{"endPort", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: Proto(corev1.ProtocolSCTP), Port: Num(80), EndPort: I32(90)}}}}, nil)},
			Packet{VNI: 1, Src: ip(ya), Dst: ip(xb), Proto: ProtoSCTP, DstPort: 90}, true},
		{"protocol without port", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: Proto(corev1.ProtocolUDP)}}}}, nil)},
			Packet{VNI: 1, Src: ip(ya), Dst: ip(xb), Proto: ProtoUDP, DstPort: 5353}, true},
		{"ports exclude ICMP", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: Proto(corev1.ProtocolUDP)}}}}, nil)},
			Packet{VNI: 1, Src: ip(ya), Dst: ip(xb), Proto: ProtoICMP}, false},
		{"named ingress port is the subject's", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: Named("serve-b")}}}}, nil)},
			tcp(1, ya, xb, 8001), true},
		{"named port of another pod", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: Named("serve-a")}}}}, nil)},
			tcp(1, ya, xb, 8000), false},
		{"named port protocol must match", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: Named("serve-81-udp")}}}}, nil)},
			Packet{VNI: 1, Src: ip(ya), Dst: ip(xb), Proto: ProtoUDP, DstPort: 81}, false},
		{"named egress port is the destination's", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, egressOnly, nil,
			[]networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: Named("serve-c")}}}})},
			tcp(1, xa, zc, 8002), true},
		{"named egress port to a non-pod", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, egressOnly, nil,
			[]networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: Named("serve-c")}}}})},
			tcp(1, xa, outside, 8002), false},
		{"policies add up", []*networkingv1.NetworkPolicy{
			Policy("x", "d", nil, ingressOnly, nil, nil),
			Policy("x", "e", map[string]string{"pod": "c"}, ingressOnly, []networkingv1.NetworkPolicyIngressRule{{}}, nil)},
			tcp(1, ya, xc, 80), true},
		{"a namespace's policy holds in each VPC of its pods", []*networkingv1.NetworkPolicy{Policy("x", "d", nil, ingressOnly, nil, nil)},
			tcp(2, "10.0.0.10", "10.0.0.11", 80), false}, // x/oa, x/ob are in x too: selected
		{"other VPC ipBlock does not leak", []*networkingv1.NetworkPolicy{Policy("x", "d", map[string]string{"pod": "b"}, ingressOnly,
			[]networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "web"}}}}}}, nil)},
			tcp(2, "10.0.0.10", "10.0.0.11", 80), false}, // oa has no tier label; xa (same IP, VNI 1) has
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := World()
			in.Policies = c.policies
			if got := Decide(in, c.pkt); got != c.want {
				t.Fatalf("Decide(%+v) = %v, want %v", c.pkt, got, c.want)
			}
			comp, err := NewCompiler().Compile(in)
			if err != nil {
				t.Fatal(err)
			}
			if got := comp.Allowed(c.pkt); got != c.want {
				t.Fatalf("compiled rules say %v for %+v, want %v", got, c.pkt, c.want)
			}
		})
	}
}

// TestCompileMatchesDecide holds the compiled rules against Decide for every
// pair of addresses, protocol and a spread of ports, over random policy sets,
// recompiling with the same Compiler (as the agent does after a change).
func TestCompileMatchesDecide(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 1))
	in := World()
	addrs := []netip.Addr{ip("192.168.7.7"), ip("172.16.0.1")}
	for _, p := range in.Pods {
		addrs = append(addrs, p.IP)
	}
	ports := []uint16{0, 1, 79, 80, 81, 85, 90, 91, 8000, 8001, 8002, 65535}
	c := NewCompiler()
	checked, allowed := 0, 0
	for round := range 150 {
		in.Policies = RandomPolicies(r, 1+r.IntN(4))
		comp, err := c.Compile(in)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for _, vni := range []uint32{1, 2} {
			for _, s := range addrs {
				for _, d := range addrs {
					for _, pr := range []uint8{ProtoTCP, ProtoUDP, ProtoSCTP, ProtoICMP} {
						for _, port := range ports {
							p := Packet{VNI: vni, Src: s, Dst: d, Proto: pr, DstPort: port}
							want, got := Decide(in, p), comp.Allowed(p)
							if want != got {
								t.Fatalf("round %d: %+v: compiled %v, Decide %v\npolicies:\n%s", round, p, got, want, Describe(in.Policies))
							}
							checked++
							if want {
								allowed++
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d packets agreed, %d allowed", checked, allowed)
	if allowed == 0 || allowed == checked {
		t.Fatal("the random policies never (or always) refuse: the comparison proves nothing")
	}
}

func TestCompileErrors(t *testing.T) {
	bad := []*networkingv1.NetworkPolicy{
		Policy("x", "cidr", nil, ingressOnly, []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/33"}}}}}, nil),
		Policy("x", "proto", nil, ingressOnly, []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: Proto("ICMP")}}}}, nil),
		Policy("x", "endport", nil, ingressOnly, []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: Num(90), EndPort: I32(80)}}}}, nil),
	}
	for _, np := range bad {
		in := World()
		in.Policies = []*networkingv1.NetworkPolicy{np}
		_, err := NewCompiler().Compile(in)
		if err == nil || !strings.Contains(err.Error(), "x/"+np.Name) {
			t.Errorf("%s: error %v, want one naming the policy", np.Name, err)
		}
	}
	// Too many disjoint ranges for one subject and peer.
	var ps []networkingv1.NetworkPolicyPort
	for i := range MaxRanges + 1 {
		ps = append(ps, networkingv1.NetworkPolicyPort{Port: Num(100 + 2*i)})
	}
	in := World()
	in.Policies = []*networkingv1.NetworkPolicy{Policy("x", "many", nil, ingressOnly, []networkingv1.NetworkPolicyIngressRule{{Ports: ps}}, nil)}
	if _, err := NewCompiler().Compile(in); err == nil || !strings.Contains(err.Error(), "disjoint port ranges") {
		t.Errorf("too many ranges: error %v", err)
	}
}

// TestIdentitiesShared: identities follow label sets, not pods; stable
// across compiles.
func TestIdentitiesShared(t *testing.T) {
	in := World()
	in.Pods = append(in.Pods, Pod{Namespace: "x", Name: "a2", VNI: 1, Labels: map[string]string{"tier": "web", "pod": "a"},
		IP: ip("10.0.0.99"), Ports: in.Pods[0].Ports})
	c := NewCompiler()
	one, err := c.Compile(in)
	if err != nil {
		t.Fatal(err)
	}
	a, a2 := one.Endpoints[EndpointKey{1, ip("10.0.0.10")}], one.Endpoints[EndpointKey{1, ip("10.0.0.99")}]
	if a.Identity != a2.Identity {
		t.Fatalf("same labels, identities %d and %d", a.Identity, a2.Identity)
	}
	if o := one.Endpoints[EndpointKey{2, ip("10.0.0.10")}]; o.Identity == a.Identity {
		t.Fatal("pods of two VPCs share an identity")
	}
	in.Pods[1].Labels = map[string]string{"pod": "changed"}
	two, err := c.Compile(in)
	if err != nil {
		t.Fatal(err)
	}
	if two.Endpoints[EndpointKey{1, ip("10.0.0.10")}].Identity != a.Identity {
		t.Fatal("an unchanged pod's identity changed")
	}
}
