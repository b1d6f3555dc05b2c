package netpol

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Identities. A pod's identity names what policy can tell about it (VNI,
// namespace, labels, named ports): pods that share them share rules, so the
// rules grow with label sets, not with pods. A prefix identity names one
// (VNI, CIDR) an ipBlock mentions: an address's prefix identity is that of
// the longest such prefix holding it.
const (
	// IdentityNone: no pod, no prefix.
	IdentityNone uint32 = 0
	// IdentityAny is the peer of a rule without peers: everyone.
	IdentityAny uint32 = 1
	// firstPodIdentity and firstPrefixIdentity keep the two kinds apart.
	firstPodIdentity    uint32 = 256
	firstPrefixIdentity uint32 = 1 << 24
)

// Directions of a rule, as the BPF maps number them.
const (
	Ingress uint8 = 0
	Egress  uint8 = 1
)

// Endpoint flags: which directions the pod's policies isolate.
const (
	FlagIngressIsolated uint8 = 1 << 0
	FlagEgressIsolated  uint8 = 1 << 1
)

// MaxRanges is how many disjoint port ranges one rule entry holds (the BPF
// value's array). More is a compile error rather than a wider rule.
const MaxRanges = 32

// EndpointKey names a pod: its VNI and IP.
type EndpointKey struct {
	VNI uint32
	IP  netip.Addr
}

// EndpointEntry is a pod's identity and isolation.
type EndpointEntry struct {
	Identity uint32
	Flags    uint8
}

// PrefixKey is one CIDR of one VNI.
type PrefixKey struct {
	VNI    uint32
	Prefix netip.Prefix
}

// RuleKey: may Subject exchange traffic with Peer in direction Dir over
// protocol Proto (0: every protocol, from a rule without ports)?
type RuleKey struct {
	Subject uint32
	Dir     uint8
	Peer    uint32
	Proto   uint8
}

// PortRange is an inclusive destination port range.
type PortRange struct{ Lo, Hi uint16 }

// Compiled is the rule set of one Input, in the shape of the BPF maps.
type Compiled struct {
	Endpoints map[EndpointKey]EndpointEntry
	Prefixes  map[PrefixKey]uint32
	Rules     map[RuleKey][]PortRange
}

// Compiler assigns identities that stay stable from one Compile to the next
// (a changed label set gets a new one; unchanged pods keep theirs), so that
// applying a new rule set rewrites only what changed.
type Compiler struct {
	pods     map[string]uint32
	prefixes map[PrefixKey]uint32
	nextPod  uint32
	nextPfx  uint32
}

// NewCompiler returns a compiler with no identities assigned yet.
func NewCompiler() *Compiler {
	return &Compiler{pods: map[string]uint32{}, prefixes: map[PrefixKey]uint32{},
		nextPod: firstPodIdentity, nextPfx: firstPrefixIdentity}
}

// identityKey is what a pod's identity stands for.
func identityKey(p *Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d\x00%s\x00", p.VNI, p.Namespace)
	for _, k := range slices.Sorted(maps.Keys(p.Labels)) {
		fmt.Fprintf(&b, "%s=%s\x00", k, p.Labels[k])
	}
	ports := slices.Clone(p.Ports)
	slices.SortFunc(ports, func(a, b Port) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
	})
	for _, cp := range ports {
		if cp.Name != "" {
			fmt.Fprintf(&b, "\x01%s/%d/%d", cp.Name, cp.Protocol, cp.Port)
		}
	}
	return b.String()
}

// compiling holds one Compile's working state.
type compiling struct {
	c   *Compiler
	in  *Input
	out *Compiled
	// One pod standing for each identity, by VNI.
	reps map[uint32][]*Pod
	idOf map[*Pod]uint32
	// Ports per rule key before merging.
	ports map[RuleKey][]PortRange
	// ipBlock grants resolved once every prefix is known.
	blocks []blockGrant
	// Parsed selectors: parsing validates every key and value by regexp,
	// the bulk of a compile if done per match.
	sels map[*metav1.LabelSelector]labels.Selector
}

// sel returns s parsed (nil and invalid selectors select nothing).
func (k *compiling) sel(s *metav1.LabelSelector) labels.Selector {
	if s == nil {
		return labels.Nothing()
	}
	if v, ok := k.sels[s]; ok {
		return v
	}
	v, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		v = labels.Nothing()
	}
	k.sels[s] = v
	return v
}

// peerSelects: does a selector peer (no ipBlock) of a policy in ns take pod t?
func (k *compiling) peerSelects(ns string, pp *networkingv1.NetworkPolicyPeer, t *Pod) bool {
	if pp.NamespaceSelector == nil {
		return t.Namespace == ns && k.sel(pp.PodSelector).Matches(labels.Set(t.Labels))
	}
	return k.sel(pp.NamespaceSelector).Matches(labels.Set(k.in.Namespaces[t.Namespace])) &&
		(pp.PodSelector == nil || k.sel(pp.PodSelector).Matches(labels.Set(t.Labels)))
}

type blockGrant struct {
	subject uint32
	dir     uint8
	vni     uint32
	block   *networkingv1.IPBlock
	cidr    netip.Prefix
	except  []netip.Prefix
	proto   uint8
	r       PortRange
}

// Compile turns in into rules. Policies the API server would have refused
// (bad CIDRs, selectors, protocols) are errors naming the policy.
func (c *Compiler) Compile(in *Input) (*Compiled, error) {
	k := &compiling{c: c, in: in,
		out:   &Compiled{Endpoints: map[EndpointKey]EndpointEntry{}, Prefixes: map[PrefixKey]uint32{}, Rules: map[RuleKey][]PortRange{}},
		reps:  map[uint32][]*Pod{},
		idOf:  map[*Pod]uint32{},
		ports: map[RuleKey][]PortRange{},
		sels:  map[*metav1.LabelSelector]labels.Selector{},
	}
	seen := map[uint32]bool{}
	for i := range in.Pods {
		p := &in.Pods[i]
		if !p.IP.Is4() {
			return nil, fmt.Errorf("pod %s/%s: address %v is not IPv4", p.Namespace, p.Name, p.IP)
		}
		key := identityKey(p)
		id, ok := c.pods[key]
		if !ok {
			id = c.nextPod
			c.nextPod++
			c.pods[key] = id
		}
		k.idOf[p] = id
		if !seen[id] {
			seen[id] = true
			k.reps[p.VNI] = append(k.reps[p.VNI], p)
		}
	}
	for _, np := range in.Policies {
		if err := validate(np); err != nil {
			return nil, fmt.Errorf("NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
		}
	}
	flags := map[uint32]uint8{}
	for vni, reps := range k.reps {
		for _, s := range reps {
			f := k.subject(vni, s)
			flags[k.idOf[s]] = f
		}
	}
	for i := range in.Pods {
		p := &in.Pods[i]
		id := k.idOf[p]
		k.out.Endpoints[EndpointKey{p.VNI, p.IP}] = EndpointEntry{Identity: id, Flags: flags[id]}
	}
	k.resolveBlocks()
	for key, rs := range k.ports {
		merged := mergeRanges(rs)
		if len(merged) > MaxRanges {
			return nil, fmt.Errorf("identity %d, direction %d, peer %d, protocol %d: %d disjoint port ranges, more than the %d a rule holds",
				key.Subject, key.Dir, key.Peer, key.Proto, len(merged), MaxRanges)
		}
		k.out.Rules[key] = merged
	}
	return k.out, nil
}

// validate checks what Compile relies on; the API server checks the same.
func validate(np *networkingv1.NetworkPolicy) error {
	check := func(peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) error {
		for _, pp := range peers {
			if pp.IPBlock != nil {
				if _, _, err := parseBlock(pp.IPBlock); err != nil {
					return err
				}
			}
		}
		for _, p := range ports {
			if p.Protocol != nil && protoNumber(*p.Protocol) == 0 {
				return fmt.Errorf("protocol %q is not TCP, UDP or SCTP", *p.Protocol)
			}
			if p.EndPort != nil && (p.Port == nil || p.Port.Type != 0 || *p.EndPort < p.Port.IntVal || *p.EndPort > 65535) {
				return fmt.Errorf("endPort %d needs a numeric port not above it", *p.EndPort)
			}
			if p.Port != nil && p.Port.Type == 0 && (p.Port.IntVal < 1 || p.Port.IntVal > 65535) {
				return fmt.Errorf("port %d is out of range", p.Port.IntVal)
			}
		}
		return nil
	}
	for _, r := range np.Spec.Ingress {
		if err := check(r.From, r.Ports); err != nil {
			return err
		}
	}
	for _, r := range np.Spec.Egress {
		if err := check(r.To, r.Ports); err != nil {
			return err
		}
	}
	return nil
}

func parseBlock(b *networkingv1.IPBlock) (netip.Prefix, []netip.Prefix, error) {
	c, err := netip.ParsePrefix(b.CIDR)
	if err != nil || !c.Addr().Is4() {
		return netip.Prefix{}, nil, fmt.Errorf("ipBlock cidr %q is not an IPv4 CIDR", b.CIDR)
	}
	c = c.Masked()
	var ex []netip.Prefix
	for _, e := range b.Except {
		x, err := netip.ParsePrefix(e)
		if err != nil || !x.Addr().Is4() {
			return netip.Prefix{}, nil, fmt.Errorf("ipBlock except %q is not an IPv4 CIDR", e)
		}
		ex = append(ex, x.Masked())
	}
	return c, ex, nil
}

// subject compiles the policies that select s (standing for its identity)
// and returns its isolation flags.
func (k *compiling) subject(vni uint32, s *Pod) uint8 {
	var f uint8
	sid := k.idOf[s]
	for _, np := range k.in.Policies {
		if np.Namespace != s.Namespace || !k.sel(&np.Spec.PodSelector).Matches(labels.Set(s.Labels)) {
			continue
		}
		if hasType(np, false) {
			f |= FlagIngressIsolated
			for _, r := range np.Spec.Ingress {
				k.rule(vni, sid, Ingress, np.Namespace, r.From, r.Ports, s)
			}
		}
		if hasType(np, true) {
			f |= FlagEgressIsolated
			for _, r := range np.Spec.Egress {
				k.rule(vni, sid, Egress, np.Namespace, r.To, r.Ports, nil)
			}
		}
	}
	return f
}

// portSpec is one NetworkPolicyPort: a numeric range, or a name resolved
// on the pod that owns it.
type portSpec struct {
	proto uint8 // 0: every protocol and port (a rule without ports)
	r     PortRange
	name  string
}

func specs(ports []networkingv1.NetworkPolicyPort) []portSpec {
	if len(ports) == 0 {
		return []portSpec{{proto: 0, r: PortRange{0, 65535}}}
	}
	var out []portSpec
	for _, p := range ports {
		proto := uint8(ProtoTCP)
		if p.Protocol != nil {
			proto = protoNumber(*p.Protocol)
		}
		switch {
		case p.Port == nil:
			out = append(out, portSpec{proto: proto, r: PortRange{0, 65535}})
		case p.Port.Type == 1:
			out = append(out, portSpec{proto: proto, name: p.Port.StrVal})
		default:
			hi := p.Port.IntVal
			if p.EndPort != nil {
				hi = *p.EndPort
			}
			out = append(out, portSpec{proto: proto, r: PortRange{uint16(p.Port.IntVal), uint16(hi)}})
		}
	}
	return out
}

// resolve looks a named port up on owner.
func resolve(owner *Pod, name string, proto uint8) []PortRange {
	var out []PortRange
	for _, cp := range owner.Ports {
		if cp.Name == name && cp.Protocol == proto {
			out = append(out, PortRange{cp.Port, cp.Port})
		}
	}
	return out
}

// rule compiles one rule of subject sid. For ingress, named ports are the
// subject's (s); for egress (s nil) they are each peer pod's, so such rules
// are written per peer identity, and ipBlock peers get one /32 prefix per
// pod inside the block that has the name.
func (k *compiling) rule(vni, sid uint32, dir uint8, ns string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort, s *Pod) {
	ps := specs(ports)
	grant := func(peer uint32, owner *Pod) {
		for _, p := range ps {
			if p.name == "" {
				k.add(RuleKey{sid, dir, peer, p.proto}, p.r)
				continue
			}
			if owner == nil {
				continue
			}
			for _, r := range resolve(owner, p.name, p.proto) {
				k.add(RuleKey{sid, dir, peer, p.proto}, r)
			}
		}
	}
	hasNamed := slices.ContainsFunc(ps, func(p portSpec) bool { return p.name != "" })
	if len(peers) == 0 {
		if dir == Ingress || !hasNamed {
			grant(IdentityAny, s)
			return
		}
		// Everyone on numeric ports; pods on their named ones.
		grant(IdentityAny, nil)
		for _, t := range k.reps[vni] {
			grantNamed(k, sid, dir, k.idOf[t], ps, t)
		}
		return
	}
	for i := range peers {
		pp := &peers[i]
		if pp.IPBlock != nil {
			cidr, except, _ := parseBlock(pp.IPBlock) // validated
			k.prefix(vni, cidr)
			for _, e := range except {
				k.prefix(vni, e)
			}
			for _, p := range ps {
				if p.name == "" {
					k.blocks = append(k.blocks, blockGrant{sid, dir, vni, pp.IPBlock, cidr, except, p.proto, p.r})
					continue
				}
				if dir == Ingress {
					for _, r := range resolve(s, p.name, p.proto) {
						k.blocks = append(k.blocks, blockGrant{sid, dir, vni, pp.IPBlock, cidr, except, p.proto, r})
					}
					continue
				}
				// Egress to a named port in a block: the pods of the
				// block that have the name, each by its own /32.
				for i := range k.in.Pods {
					t := &k.in.Pods[i]
					if t.VNI != vni || !inBlock(pp.IPBlock, t.IP) {
						continue
					}
					rs := resolve(t, p.name, p.proto)
					if len(rs) == 0 {
						continue
					}
					pid := k.prefix(vni, netip.PrefixFrom(t.IP, 32))
					for _, r := range rs {
						k.add(RuleKey{sid, dir, pid, p.proto}, r)
					}
				}
			}
			continue
		}
		for _, t := range k.reps[vni] {
			if !k.peerSelects(ns, pp, t) {
				continue
			}
			owner := s
			if dir == Egress {
				owner = t
			}
			grant(k.idOf[t], owner)
		}
	}
}

func grantNamed(k *compiling, sid uint32, dir uint8, peer uint32, ps []portSpec, owner *Pod) {
	for _, p := range ps {
		if p.name == "" {
			continue
		}
		for _, r := range resolve(owner, p.name, p.proto) {
			k.add(RuleKey{sid, dir, peer, p.proto}, r)
		}
	}
}

func (k *compiling) add(key RuleKey, r PortRange) {
	k.ports[key] = append(k.ports[key], r)
}

// prefix registers a prefix of vni and returns its identity.
func (k *compiling) prefix(vni uint32, p netip.Prefix) uint32 {
	key := PrefixKey{vni, p.Masked()}
	if id, ok := k.out.Prefixes[key]; ok {
		return id
	}
	id, ok := k.c.prefixes[key]
	if !ok {
		id = k.c.nextPfx
		k.c.nextPfx++
		k.c.prefixes[key] = id
	}
	k.out.Prefixes[key] = id
	return id
}

// resolveBlocks grants each ipBlock's prefixes: an address's longest
// matching prefix P is inside the block's CIDR and outside its exceptions
// exactly when the address is (prefixes nest), so the block allows the
// identities of the prefixes within CIDR and within no exception.
func (k *compiling) resolveBlocks() {
	for _, g := range k.blocks {
		for key, id := range k.out.Prefixes {
			if key.VNI != g.vni || !within(key.Prefix, g.cidr) {
				continue
			}
			if slices.ContainsFunc(g.except, func(e netip.Prefix) bool { return within(key.Prefix, e) }) {
				continue
			}
			k.add(RuleKey{g.subject, g.dir, id, g.proto}, g.r)
		}
	}
}

// within: is p inside q (q at most as long, and holding p's address)?
func within(p, q netip.Prefix) bool {
	return q.Bits() <= p.Bits() && q.Contains(p.Addr())
}

func mergeRanges(rs []PortRange) []PortRange {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b PortRange) int { return cmp.Or(cmp.Compare(a.Lo, b.Lo), cmp.Compare(a.Hi, b.Hi)) })
	var out []PortRange
	for _, r := range rs {
		if n := len(out); n > 0 && uint32(r.Lo) <= uint32(out[n-1].Hi)+1 {
			out[n-1].Hi = max(out[n-1].Hi, r.Hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

// Allowed evaluates the compiled rules for p exactly as the BPF programs do
// (endpoint lookups, longest-prefix identity, rule lookups by protocol and
// by "every protocol"): the bridge between Decide and the kernel in tests.
func (c *Compiled) Allowed(p Packet) bool {
	return c.Check(p, true, true) == 0
}

// Check reports why p is refused: 0 allowed, Egress+1 by the source's
// egress policy, Ingress+1 by the destination's ingress policy. Only the
// directions asked for are checked (the sending and the receiving host
// each check their own).
func (c *Compiled) Check(p Packet, egress, ingress bool) int {
	src, srcOK := c.Endpoints[EndpointKey{p.VNI, p.Src}]
	dst, dstOK := c.Endpoints[EndpointKey{p.VNI, p.Dst}]
	if egress && srcOK && src.Flags&FlagEgressIsolated != 0 && !c.match(src.Identity, Egress, dst.Identity, p.VNI, p.Dst, p) {
		return int(Egress) + 1
	}
	if ingress && dstOK && dst.Flags&FlagIngressIsolated != 0 && !c.match(dst.Identity, Ingress, src.Identity, p.VNI, p.Src, p) {
		return int(Ingress) + 1
	}
	return 0
}

func (c *Compiled) match(subject uint32, dir uint8, peerPod uint32, vni uint32, peer netip.Addr, p Packet) bool {
	peers := []uint32{IdentityAny, peerPod, c.lpm(vni, peer)}
	for _, id := range peers {
		if id == IdentityNone {
			continue
		}
		for _, proto := range []uint8{p.Proto, 0} {
			for _, r := range c.Rules[RuleKey{subject, dir, id, proto}] {
				if p.DstPort >= r.Lo && p.DstPort <= r.Hi {
					return true
				}
			}
		}
	}
	return false
}

func (c *Compiled) lpm(vni uint32, a netip.Addr) uint32 {
	best, id := -1, IdentityNone
	for k, v := range c.Prefixes {
		if k.VNI == vni && k.Prefix.Contains(a) && k.Prefix.Bits() > best {
			best, id = k.Prefix.Bits(), v
		}
	}
	return id
}
