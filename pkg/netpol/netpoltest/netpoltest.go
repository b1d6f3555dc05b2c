// Package netpoltest holds the policy world and random policy sets that
// pkg/netpol's tests and the dataplane's netns tests share.
package netpoltest

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"mizar.dev/pkg/netpol"
)

// World is a small cluster for the tests: namespaces x, y, z with pods a,
// b, c each, in VNI 1, and an overlapping VPC (VNI 2) reusing x's addresses.
func World() *netpol.Input {
	in := &netpol.Input{Namespaces: map[string]map[string]string{
		"x": {"ns": "x", "team": "red"},
		"y": {"ns": "y", "team": "blue"},
		"z": {"ns": "z"},
	}}
	for i, ns := range []string{"x", "y", "z"} {
		for j, name := range []string{"a", "b", "c"} {
			in.Pods = append(in.Pods, netpol.Pod{
				Namespace: ns, Name: name, VNI: 1,
				Labels: map[string]string{"pod": name, "tier": map[bool]string{true: "web", false: "db"}[j < 2]},
				IP:     netip.AddrFrom4([4]byte{10, 0, byte(i), byte(10 + j)}),
				Ports: []netpol.Port{
					{Name: "serve-80-tcp", Protocol: netpol.ProtoTCP, Port: 80},
					{Name: "serve-81-udp", Protocol: netpol.ProtoUDP, Port: 81},
					{Name: "serve-" + name, Protocol: netpol.ProtoTCP, Port: uint16(8000 + j)},
				},
			})
		}
	}
	// The other VPC: same addresses as namespace x's pods, other VNI.
	for j, name := range []string{"a", "b"} {
		in.Pods = append(in.Pods, netpol.Pod{Namespace: "x", Name: "o" + name, VNI: 2,
			Labels: map[string]string{"pod": name}, IP: netip.AddrFrom4([4]byte{10, 0, 0, byte(10 + j)}),
			Ports: []netpol.Port{
				{Name: "serve-80-tcp", Protocol: netpol.ProtoTCP, Port: 80},
				{Name: "serve-81-udp", Protocol: netpol.ProtoUDP, Port: 81},
			}})
	}
	return in
}

func Policy(ns, name string, sel map[string]string, types []networkingv1.PolicyType, in []networkingv1.NetworkPolicyIngressRule, eg []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: types, Ingress: in, Egress: eg}}
}

func Proto(p corev1.Protocol) *corev1.Protocol { return &p }
func Num(n int) *intstr.IntOrString            { v := intstr.FromInt32(int32(n)); return &v }
func Named(s string) *intstr.IntOrString       { v := intstr.FromString(s); return &v }
func I32(n int32) *int32                       { return &n }

// RandomPolicies draws policies over World's namespaces, labels, addresses
// and named ports.
func RandomPolicies(r *rand.Rand, n int) []*networkingv1.NetworkPolicy {
	nss := []string{"x", "y", "z"}
	sel := func() map[string]string {
		switch r.IntN(4) {
		case 0:
			return nil
		case 1:
			return map[string]string{"pod": []string{"a", "b", "c"}[r.IntN(3)]}
		case 2:
			return map[string]string{"tier": []string{"web", "db"}[r.IntN(2)]}
		}
		return map[string]string{"pod": "nope"}
	}
	peer := func() networkingv1.NetworkPolicyPeer {
		switch r.IntN(5) {
		case 0:
			return networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: sel()}}
		case 1:
			return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: []map[string]string{nil, {"team": "red"}, {"ns": "z"}}[r.IntN(3)]}}
		case 2:
			return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": nss[r.IntN(3)]}},
				PodSelector: &metav1.LabelSelector{MatchLabels: sel()}}
		case 3:
			b := []networkingv1.IPBlock{
				{CIDR: "10.0.0.0/16", Except: []string{"10.0.1.0/24"}},
				{CIDR: "10.0.0.11/32"},
				{CIDR: "0.0.0.0/0", Except: []string{"10.0.0.0/8"}},
				{CIDR: "192.168.0.0/16"},
				{CIDR: "10.0.2.0/24", Except: []string{"10.0.2.12/32", "10.0.2.10/31"}},
			}[r.IntN(5)]
			return networkingv1.NetworkPolicyPeer{IPBlock: &b}
		}
		return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: sel()}}
	}
	portList := func() []networkingv1.NetworkPolicyPort {
		var out []networkingv1.NetworkPolicyPort
		for range r.IntN(3) {
			p := networkingv1.NetworkPolicyPort{}
			if r.IntN(2) == 0 {
				p.Protocol = Proto([]corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}[r.IntN(3)])
			}
			switch r.IntN(5) {
			case 0:
			case 1:
				p.Port = Num(80)
			case 2:
				p.Port, p.EndPort = Num(81), I32(90)
			case 3:
				p.Port = Named([]string{"serve-80-tcp", "serve-81-udp", "serve-a", "serve-c"}[r.IntN(4)])
			case 4:
				p.Port = Num(8001)
			}
			out = append(out, p)
		}
		return out
	}
	peers := func() []networkingv1.NetworkPolicyPeer {
		var out []networkingv1.NetworkPolicyPeer
		for range r.IntN(3) {
			out = append(out, peer())
		}
		return out
	}
	var out []*networkingv1.NetworkPolicy
	for i := range n {
		np := Policy(nss[r.IntN(3)], fmt.Sprintf("p%d", i), sel(), nil, nil, nil)
		switch r.IntN(4) {
		case 0:
			np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		case 1:
			np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		case 2:
			np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
		}
		for range r.IntN(3) {
			np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: peers(), Ports: portList()})
		}
		for range r.IntN(3) {
			np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: peers(), Ports: portList()})
		}
		out = append(out, np)
	}
	return out
}

// Describe prints policies for failure messages.
func Describe(ps []*networkingv1.NetworkPolicy) string {
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "%s/%s: %+v\n", p.Namespace, p.Name, p.Spec)
	}
	return b.String()
}

// Scale is a cluster of pods in 100 namespaces of 10 apps each (1,000
// label sets), one VPC, with n policies: each selects one app and takes in
// from another app of its namespace and from one namespace, on a port.
func Scale(pods, n int) *netpol.Input {
	in := &netpol.Input{Namespaces: map[string]map[string]string{}}
	for i := range 100 {
		in.Namespaces[fmt.Sprintf("ns%d", i)] = map[string]string{"team": fmt.Sprintf("t%d", i%10)}
	}
	for i := range pods {
		ns := i % 100
		in.Pods = append(in.Pods, netpol.Pod{Namespace: fmt.Sprintf("ns%d", ns), Name: fmt.Sprintf("p%d", i), VNI: 1,
			Labels: map[string]string{"app": fmt.Sprintf("a%d", (i/100)%10)},
			IP:     netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}),
			Ports:  []netpol.Port{{Name: "http", Protocol: netpol.ProtoTCP, Port: 8080}}})
	}
	ingress := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	for i := range n {
		ns := fmt.Sprintf("ns%d", i%100)
		in.Policies = append(in.Policies, Policy(ns, fmt.Sprintf("np%d", i), map[string]string{"app": fmt.Sprintf("a%d", i%10)}, ingress,
			[]networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{
					{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", (i+1)%10)}}},
					{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("t%d", (i+3)%10)}}},
				},
				Ports: []networkingv1.NetworkPolicyPort{{Port: Named("http")}, {Port: Num(9000 + i%20)}},
			}}, nil))
	}
	return in
}
