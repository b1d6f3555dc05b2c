// Package netpol turns Kubernetes NetworkPolicies (networking.k8s.io/v1) into
// the identity rules mizar's BPF programs enforce (Compile), and answers what
// the API reference says about one packet (Decide), independently of the
// compiler, so that tests can hold the compiled rules and the kernel against
// it.
//
// Scope, as mizar places pods: a packet travels inside one VPC (VNI), so a
// pod is named by (VNI, IP), and selectors only ever match pods of the VNI
// the packet travels in. ipBlocks match any address of that VNI, pods'
// included (the upstream e2e tests put pod IPs in ipBlocks).
package netpol

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Protocol numbers as IPv4 carries them.
const (
	ProtoICMP = 1
	ProtoTCP  = 6
	ProtoUDP  = 17
	ProtoSCTP = 132
)

// Port is one container port a pod declares; named ports resolve through it.
type Port struct {
	Name     string
	Protocol uint8
	Port     uint16
}

// Pod is what policy needs of a pod: where it is (VNI, IP), what selects it
// (namespace, labels) and what its named ports mean.
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	VNI             uint32
	IP              netip.Addr
	Ports           []Port
}

// Input is everything policy depends on.
type Input struct {
	Policies []*networkingv1.NetworkPolicy
	// Namespaces maps a namespace's name to its labels. A namespace that
	// is absent has no labels.
	Namespaces map[string]map[string]string
	Pods       []Pod
}

// Packet is the first packet of a connection as it crosses the VPC.
type Packet struct {
	VNI      uint32
	Src, Dst netip.Addr
	Proto    uint8
	DstPort  uint16
}

// Decide says whether NetworkPolicy allows p: the source pod's egress policy
// and the destination pod's ingress policy must both allow it; an address
// that is no pod of the VNI has no policy of its own. It reads the API
// reference directly (no identities, no precomputation) and is meant as the
// oracle of tests, not as a fast path.
func Decide(in *Input, p Packet) bool {
	src, dst := in.pod(p.VNI, p.Src), in.pod(p.VNI, p.Dst)
	return in.allowed(src, dst, p, true) && in.allowed(dst, src, p, false)
}

// allowed: may subject (nil = not a pod) send p to peer (egress) or
// receive it from peer (ingress)?
func (in *Input) allowed(subject, peer *Pod, p Packet, egress bool) bool {
	if subject == nil {
		return true
	}
	isolated := false
	for _, np := range in.Policies {
		if np.Namespace != subject.Namespace || !selects(&np.Spec.PodSelector, subject.Labels) {
			continue
		}
		if !hasType(np, egress) {
			continue
		}
		isolated = true
		if egress {
			for _, r := range np.Spec.Egress {
				if in.peersMatch(np.Namespace, r.To, peer, p.VNI, p.Dst) && portsMatch(r.Ports, peer, p) {
					return true
				}
			}
		} else {
			for _, r := range np.Spec.Ingress {
				// Named ports of an ingress rule are the subject's own.
				if in.peersMatch(np.Namespace, r.From, peer, p.VNI, p.Src) && portsMatch(r.Ports, subject, p) {
					return true
				}
			}
		}
	}
	return !isolated
}

// hasType: does np apply to this direction? policyTypes left empty means
// Ingress, plus Egress when the policy has egress rules.
func hasType(np *networkingv1.NetworkPolicy, egress bool) bool {
	want := networkingv1.PolicyTypeIngress
	if egress {
		want = networkingv1.PolicyTypeEgress
	}
	if len(np.Spec.PolicyTypes) == 0 {
		return !egress || len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		if t == want {
			return true
		}
	}
	return false
}

// peersMatch: does the rule's peer list (empty: everyone) take the peer at
// addr (a pod, or nil)?
func (in *Input) peersMatch(ns string, peers []networkingv1.NetworkPolicyPeer, peer *Pod, vni uint32, addr netip.Addr) bool {
	if len(peers) == 0 {
		return true
	}
	for i := range peers {
		pp := &peers[i]
		if pp.IPBlock != nil {
			if inBlock(pp.IPBlock, addr) {
				return true
			}
			continue
		}
		if peer == nil {
			continue
		}
		if pp.NamespaceSelector == nil {
			if peer.Namespace == ns && selects(pp.PodSelector, peer.Labels) {
				return true
			}
			continue
		}
		if selects(pp.NamespaceSelector, in.Namespaces[peer.Namespace]) &&
			(pp.PodSelector == nil || selects(pp.PodSelector, peer.Labels)) {
			return true
		}
	}
	return false
}

// inBlock: addr in the block's CIDR and in none of its exceptions. A block
// that does not parse matches nothing (the API server validates them).
func inBlock(b *networkingv1.IPBlock, addr netip.Addr) bool {
	c, err := netip.ParsePrefix(b.CIDR)
	if err != nil || !c.Contains(addr) {
		return false
	}
	for _, e := range b.Except {
		if x, err := netip.ParsePrefix(e); err != nil || x.Contains(addr) {
			return false
		}
	}
	return true
}

// portsMatch: does the rule's port list (empty: every port of every
// protocol) take p? Named ports are looked up on owner: the destination pod
// (nil when it is no pod: then a named port matches nothing).
func portsMatch(ports []networkingv1.NetworkPolicyPort, owner *Pod, p Packet) bool {
	if len(ports) == 0 {
		return true
	}
	for _, np := range ports {
		proto := uint8(ProtoTCP)
		if np.Protocol != nil {
			proto = protoNumber(*np.Protocol)
		}
		if proto != p.Proto {
			continue
		}
		if np.Port == nil {
			return true
		}
		if np.Port.Type == 1 /* intstr.String */ {
			if owner == nil {
				continue
			}
			for _, cp := range owner.Ports {
				if cp.Name == np.Port.StrVal && cp.Protocol == proto && cp.Port == p.DstPort {
					return true
				}
			}
			continue
		}
		lo := int(np.Port.IntVal)
		hi := lo
		if np.EndPort != nil {
			hi = int(*np.EndPort)
		}
		if int(p.DstPort) >= lo && int(p.DstPort) <= hi {
			return true
		}
	}
	return false
}

func (in *Input) pod(vni uint32, ip netip.Addr) *Pod {
	for i := range in.Pods {
		if in.Pods[i].VNI == vni && in.Pods[i].IP == ip {
			return &in.Pods[i]
		}
	}
	return nil
}

// selects applies a label selector; one that does not parse selects nothing.
func selects(s *metav1.LabelSelector, l map[string]string) bool {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return false
	}
	return sel.Matches(labels.Set(l))
}

// protoNumber maps a Kubernetes protocol to its IP protocol number (0 for
// one mizar does not know, which no packet carries).
func protoNumber(p corev1.Protocol) uint8 {
	switch p {
	case corev1.ProtocolTCP:
		return ProtoTCP
	case corev1.ProtocolUDP:
		return ProtoUDP
	case corev1.ProtocolSCTP:
		return ProtoSCTP
	}
	return 0
}

// ProtocolNumber is protoNumber for callers that turn container ports into
// Ports.
func ProtocolNumber(p corev1.Protocol) uint8 {
	if p == "" {
		return ProtoTCP
	}
	return protoNumber(p)
}

// PoliciesFor names ("namespace/name") the policies that select pod p, by
// the direction they isolate it in.
func PoliciesFor(in *Input, p *Pod) (ingress, egress []string) {
	for _, np := range in.Policies {
		if np.Namespace != p.Namespace || !selects(&np.Spec.PodSelector, p.Labels) {
			continue
		}
		if hasType(np, false) {
			ingress = append(ingress, np.Namespace+"/"+np.Name)
		}
		if hasType(np, true) {
			egress = append(egress, np.Namespace+"/"+np.Name)
		}
	}
	return ingress, egress
}
