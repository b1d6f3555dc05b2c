package dataplane

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"mizar.dev/pkg/netpol"
)

// NetworkPolicy enforcement (bpf/include/netpol.h). Options.NetworkPolicy
// compiles it into the programs; ApplyPolicy writes what pkg/netpol
// compiled. Until the first ApplyPolicy no pod is isolated, so traffic
// flows as without policy.

// setPolicyConstants sets the programs' policy switch before load.
func setPolicyConstants(spec *ebpf.CollectionSpec, on bool) error {
	v := uint32(0)
	if on {
		v = 1
	}
	if err := spec.Variables[mizarVarNpEnabled].Set(v); err != nil {
		return fmt.Errorf("set the network policy switch: %w", err)
	}
	return nil
}

// PolicyEnabled reports whether the programs were loaded with
// Options.NetworkPolicy.
func (d *Datapath) PolicyEnabled() bool { return d.opts.NetworkPolicy }

// PolicyApplied says what an ApplyPolicy wrote.
type PolicyApplied struct {
	// Written and Deleted count map entries (endpoints, prefixes, rules).
	Written, Deleted int
	// Generation is the policy generation the programs now decide under.
	Generation uint64
}

// ApplyPolicy makes c the rules the programs enforce: entries absent from
// c are deleted, the others written, then, if anything changed, the policy
// generation is bumped so every established connection is re-decided on
// its next packet (kept when c still allows it, cut otherwise). Rules are written before the
// endpoints that use them and deleted after, so a pod never points at an
// identity whose rules are missing longer than the write takes.
func (d *Datapath) ApplyPolicy(c *netpol.Compiled) (PolicyApplied, error) {
	if !d.opts.NetworkPolicy {
		return PolicyApplied{}, errors.New("network policy: the programs were loaded without Options.NetworkPolicy")
	}
	d.policyMu.Lock()
	defer d.policyMu.Unlock()
	var st PolicyApplied
	// What the maps hold: as written last, else (first apply of this
	// process, or after a failed one) read from the pinned maps.
	have := d.npHave
	d.npHave = nil
	if have == nil {
		have = &policyMaps{}
		var err error
		if have.rules, err = readMap[mizarNpRuleKey, mizarNpPorts](d.objs.NpRules, "policy rule"); err != nil {
			return st, err
		}
		if have.prefixes, err = readMap[mizarNpPrefixKey, uint32](d.objs.NpPrefixes, "policy prefix"); err != nil {
			return st, err
		}
		if have.eps, err = readMap[mizarEndpointKey, mizarNpEndpoint](d.objs.NpEndpoints, "policy endpoint"); err != nil {
			return st, err
		}
	}

	// Rules.
	rules := make(map[mizarNpRuleKey]mizarNpPorts, len(c.Rules))
	for k, rs := range c.Rules {
		if len(rs) > netpol.MaxRanges {
			return st, fmt.Errorf("network policy: rule %+v has %d port ranges, more than %d", k, len(rs), netpol.MaxRanges)
		}
		var v mizarNpPorts
		v.N = uint32(len(rs))
		for i, r := range rs {
			v.R[i].Lo, v.R[i].Hi = r.Lo, r.Hi
		}
		rules[mizarNpRuleKey{Subject: k.Subject, Peer: k.Peer, Dir: k.Dir, Proto: k.Proto}] = v
	}
	if err := syncMap(d.objs.NpRules, have.rules, rules, "policy rule", &st, true, false); err != nil {
		return st, err
	}
	// Prefixes.
	prefixes := make(map[mizarNpPrefixKey]uint32, len(c.Prefixes))
	for k, id := range c.Prefixes {
		if !k.Prefix.Addr().Is4() {
			return st, fmt.Errorf("network policy: prefix %v is not IPv4", k.Prefix)
		}
		if err := checkVNI(k.VNI); err != nil {
			return st, err
		}
		prefixes[mizarNpPrefixKey{Prefixlen: 32 + uint32(k.Prefix.Bits()), Vni: k.VNI, Ip: k.Prefix.Masked().Addr().As4()}] = id
	}
	if err := syncMap(d.objs.NpPrefixes, have.prefixes, prefixes, "policy prefix", &st, true, true); err != nil {
		return st, err
	}
	// Endpoints.
	eps := make(map[mizarEndpointKey]mizarNpEndpoint, len(c.Endpoints))
	for k, e := range c.Endpoints {
		key, err := endpointKey(k.VNI, k.IP)
		if err != nil {
			return st, fmt.Errorf("network policy endpoint: %w", err)
		}
		eps[key] = mizarNpEndpoint{Identity: e.Identity, Flags: e.Flags}
	}
	if err := syncMap(d.objs.NpEndpoints, have.eps, eps, "policy endpoint", &st, true, true); err != nil {
		return st, err
	}
	// Stale rules go last (none is referenced any more).
	if err := syncMap(d.objs.NpRules, have.rules, rules, "policy rule", &st, false, true); err != nil {
		return st, err
	}
	d.npHave = &policyMaps{rules: rules, prefixes: prefixes, eps: eps}
	if st.Written+st.Deleted == 0 {
		// Nothing changed: established connections need no second look
		// (each would cost its next packet a full decision).
		var gen uint64
		err := d.objs.NpGeneration.Lookup(uint32(0), &gen)
		st.Generation = gen
		if err != nil {
			return st, fmt.Errorf("read the policy generation: %w", err)
		}
		return st, nil
	}
	gen, err := d.bumpPolicyGeneration()
	st.Generation = gen
	return st, err
}

// policyMaps is the contents of the policy maps as last written.
type policyMaps struct {
	rules    map[mizarNpRuleKey]mizarNpPorts
	prefixes map[mizarNpPrefixKey]uint32
	eps      map[mizarEndpointKey]mizarNpEndpoint
}

func readMap[K comparable, V any](m *ebpf.Map, what string) (map[K]V, error) {
	have := map[K]V{}
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		have[k] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read %s map: %w", what, err)
	}
	return have, nil
}

// syncMap makes m, holding have, hold want: writing new and changed
// entries (write) and deleting the ones want lacks (del).
func syncMap[K comparable, V comparable](m *ebpf.Map, have, want map[K]V, what string, st *PolicyApplied, write, del bool) error {
	for k, v := range want {
		if !write {
			break
		}
		if old, ok := have[k]; ok && old == v {
			continue
		}
		if err := m.Update(k, v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write %s %+v: %w", what, k, err)
		}
		st.Written++
	}
	for k := range have {
		if _, ok := want[k]; ok || !del {
			continue
		}
		if err := deleteKey(m, k, what); err != nil {
			return err
		}
		st.Deleted++
	}
	return nil
}

func (d *Datapath) bumpPolicyGeneration() (uint64, error) {
	var gen uint64
	if err := d.objs.NpGeneration.Lookup(uint32(0), &gen); err != nil {
		return 0, fmt.Errorf("read the policy generation: %w", err)
	}
	gen++
	if err := d.objs.NpGeneration.Update(uint32(0), gen, ebpf.UpdateAny); err != nil {
		return 0, fmt.Errorf("bump the policy generation: %w", err)
	}
	return gen, nil
}

// PolicyCounters reads the policy counters summed over CPUs, by the C enum
// name lower-cased without NP_ (e.g. "drop_ingress", "allow_new").
func (d *Datapath) PolicyCounters() (map[string]uint64, error) {
	m, err := sumPerCPU(d.objs.NpStats, d.npNames)
	if err != nil {
		return nil, fmt.Errorf("policy counters: %w", err)
	}
	return m, nil
}

// PolicyRefusal is how many packets one pod's policy refused in one
// direction (cut connections included).
type PolicyRefusal struct {
	VNI     uint32
	IP      netip.Addr
	Egress  bool
	Packets uint64
}

// PolicyRefusals lists the refusals per pod and direction.
func (d *Datapath) PolicyRefusals() ([]PolicyRefusal, error) {
	var out []PolicyRefusal
	var k mizarNpRefusedKey
	var n uint64
	it := d.objs.NpRefused.Iterate()
	for it.Next(&k, &n) {
		out = append(out, PolicyRefusal{VNI: k.Vni, IP: netip.AddrFrom4(k.Ip), Egress: k.Dir == 1, Packets: n})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read policy refusals: %w", err)
	}
	return out, nil
}

// PolicyConnections counts the connections the programs track.
func (d *Datapath) PolicyConnections() (int, error) {
	var k mizarNpConnKey
	var v mizarNpConn
	n := 0
	it := d.objs.NpConns.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("read policy connections: %w", err)
	}
	return n, nil
}
