package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// MaxVNI is the largest Geneve VNI (24 bits). VNI 0 is reserved.
const MaxVNI = 1<<24 - 1

// MaxHops is how many bouncers a subnet, or dividers a VPC, can list.
const MaxHops = 16

// Endpoint is an entry of the endpoints map: where (VNI, IP) lives.
type Endpoint struct {
	VNI uint32
	IP  netip.Addr
	// MAC of the endpoint's interface; written as the inner destination MAC
	// when a packet is delivered to it.
	MAC net.HardwareAddr
	// HostIP and HostMAC are the underlay address of the endpoint's host.
	// HostIP is required for remote endpoints; informational for local
	// ones. HostMAC as in Hop: nil when the host is not on this host's L2
	// segment.
	HostIP  netip.Addr
	HostMAC net.HardwareAddr
	// Ifindex is the host-side veth (in the host netns) of an endpoint on this
	// host; 0 means the endpoint is remote.
	Ifindex int
}

// Hop is a host on the underlay that can take a packet on: a bouncer or a
// divider.
type Hop struct {
	IP netip.Addr
	// MAC of the hop's underlay interface when it shares this host's L2
	// segment: frames go straight to it, no FIB lookup. nil for a droplet
	// behind a router: the kernel FIB picks the next hop and its MAC
	// (bpf_fib_lookup on the underlay, bpf_redirect_neigh on the pod side).
	// The underlay program cannot wait for ARP: a bouncer or divider drops
	// (drop_no_neigh) until the kernel has resolved its router, which the
	// host's own traffic does. The kernel answers FIB lookups only with
	// IPv4 forwarding on for the underlay interface (drop_no_route
	// otherwise), as it is on Kubernetes nodes.
	MAC net.HardwareAddr
}

// Subnet is an entry of the subnets LPM map: the bouncers serving Prefix in
// the VPC with this VNI. Flows are spread over Bouncers by hash.
type Subnet struct {
	VNI      uint32
	Prefix   netip.Prefix
	Bouncers []Hop
}

// VPC is an entry of the vpcs map: the dividers of a VPC. An entry makes the
// VNI known on this host; Geneve with a VNI unknown here is dropped.
type VPC struct {
	VNI      uint32
	Dividers []Hop
}

// PodInterface describes the pod behind a host-side veth, for the pod-side
// program attached to it.
type PodInterface struct {
	// Ifindex of the host-side veth in the host netns.
	Ifindex int
	// VNI of the pod's VPC.
	VNI uint32
	// IP and MAC of the pod's interface; packets from any other source
	// address are dropped.
	IP  netip.Addr
	MAC net.HardwareAddr
	// Subnet is the pod's subnet; leaving it costs one TTL.
	Subnet netip.Prefix
	// GatewayIP and GatewayMAC: the pod's ARP for the gateway, or any other
	// address of its subnet, is answered with GatewayMAC.
	GatewayIP  netip.Addr
	GatewayMAC net.HardwareAddr
}

// UpsertEndpoint adds or replaces an endpoint.
func (d *Datapath) UpsertEndpoint(ep Endpoint) (err error) {
	defer d.invalidate(&err)
	k, err := endpointKey(ep.VNI, ep.IP)
	if err != nil {
		return fmt.Errorf("endpoint: %w", err)
	}
	var v mizarEndpoint
	if v.Mac, err = mac("endpoint MAC", ep.MAC); err != nil {
		return fmt.Errorf("endpoint %s: %w", ep.IP, err)
	}
	if ep.Ifindex < 0 {
		return fmt.Errorf("endpoint %s: negative ifindex %d", ep.IP, ep.Ifindex)
	}
	v.Ifindex = uint32(ep.Ifindex)
	if ep.Ifindex == 0 || ep.HostIP.IsValid() {
		if v.HostIp, err = ipv4("endpoint host IP", ep.HostIP); err != nil {
			return fmt.Errorf("endpoint %s: %w", ep.IP, err)
		}
	}
	if ep.HostMAC != nil {
		if v.HostMac, err = mac("endpoint host MAC", ep.HostMAC); err != nil {
			return fmt.Errorf("endpoint %s: %w", ep.IP, err)
		}
	}
	if err := d.objs.Endpoints.Put(&k, &v); err != nil {
		return fmt.Errorf("put endpoint (%d, %s): %w", ep.VNI, ep.IP, err)
	}
	// What the agent says replaces what was learned (a move, a new pod).
	return deleteKey(d.objs.Learned, &k, "learned endpoint")
}

// DeleteEndpoint removes an endpoint; a missing one is not an error.
func (d *Datapath) DeleteEndpoint(vni uint32, ip netip.Addr) (err error) {
	defer d.invalidate(&err)
	k, err := endpointKey(vni, ip)
	if err != nil {
		return fmt.Errorf("endpoint: %w", err)
	}
	if err := deleteKey(d.objs.Endpoints, &k, "endpoint"); err != nil {
		return err
	}
	return deleteKey(d.objs.Learned, &k, "learned endpoint")
}

// Endpoints lists the endpoints map.
func (d *Datapath) Endpoints() ([]Endpoint, error) {
	var (
		k   mizarEndpointKey
		v   mizarEndpoint
		out []Endpoint
	)
	it := d.objs.Endpoints.Iterate()
	for it.Next(&k, &v) {
		ep := Endpoint{
			VNI:     k.Vni,
			IP:      netip.AddrFrom4(k.Ip),
			MAC:     hwaddr(v.Mac),
			Ifindex: int(v.Ifindex),
		}
		if v.HostIp != [4]byte{} {
			ep.HostIP = netip.AddrFrom4(v.HostIp)
		}
		if v.HostMac != [6]byte{} {
			ep.HostMAC = hwaddr(v.HostMac)
		}
		out = append(out, ep)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	return out, nil
}

// UpsertSubnet adds or replaces a subnet and its bouncers. A subnet with no
// bouncers is allowed (its traffic is dropped as unknown until it has some).
func (d *Datapath) UpsertSubnet(s Subnet) (err error) {
	defer d.invalidate(&err)
	k, err := subnetKey(s.VNI, s.Prefix)
	if err != nil {
		return fmt.Errorf("subnet: %w", err)
	}
	var v mizarSubnet
	if v.Nbouncers, err = hops(&v.Bouncers, s.Bouncers); err != nil {
		return fmt.Errorf("subnet %s bouncers: %w", s.Prefix, err)
	}
	if err := d.objs.Subnets.Put(&k, &v); err != nil {
		return fmt.Errorf("put subnet (%d, %s): %w", s.VNI, s.Prefix, err)
	}
	return nil
}

// DeleteSubnet removes a subnet; a missing one is not an error.
func (d *Datapath) DeleteSubnet(vni uint32, prefix netip.Prefix) (err error) {
	defer d.invalidate(&err)
	k, err := subnetKey(vni, prefix)
	if err != nil {
		return fmt.Errorf("subnet: %w", err)
	}
	return deleteKey(d.objs.Subnets, &k, "subnet")
}

// Subnets lists the subnets map.
func (d *Datapath) Subnets() ([]Subnet, error) {
	var (
		k   mizarSubnetKey
		v   mizarSubnet
		out []Subnet
	)
	it := d.objs.Subnets.Iterate()
	for it.Next(&k, &v) {
		out = append(out, Subnet{
			VNI:      k.Vni,
			Prefix:   netip.PrefixFrom(netip.AddrFrom4(k.Ip), int(k.Prefixlen)-32),
			Bouncers: fromHops(v.Bouncers[:], v.Nbouncers),
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list subnets: %w", err)
	}
	return out, nil
}

// UpsertVPC adds or replaces a VPC and its dividers.
func (d *Datapath) UpsertVPC(vpc VPC) (err error) {
	defer d.invalidate(&err)
	if err := checkVNI(vpc.VNI); err != nil {
		return fmt.Errorf("vpc: %w", err)
	}
	var v mizarVpc
	if v.Ndividers, err = hops(&v.Dividers, vpc.Dividers); err != nil {
		return fmt.Errorf("vpc %d dividers: %w", vpc.VNI, err)
	}
	if err := d.objs.Vpcs.Put(vpc.VNI, &v); err != nil {
		return fmt.Errorf("put vpc %d: %w", vpc.VNI, err)
	}
	return nil
}

// DeleteVPC removes a VPC; a missing one is not an error.
func (d *Datapath) DeleteVPC(vni uint32) (err error) {
	defer d.invalidate(&err)
	if err := checkVNI(vni); err != nil {
		return fmt.Errorf("vpc: %w", err)
	}
	return deleteKey(d.objs.Vpcs, vni, "vpc")
}

// VPCs lists the vpcs map.
func (d *Datapath) VPCs() ([]VPC, error) {
	var (
		k   uint32
		v   mizarVpc
		out []VPC
	)
	it := d.objs.Vpcs.Iterate()
	for it.Next(&k, &v) {
		out = append(out, VPC{VNI: k, Dividers: fromHops(v.Dividers[:], v.Ndividers)})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list vpcs: %w", err)
	}
	return out, nil
}

// UpsertPodInterface describes the pod behind a host-side veth. Do it before
// AttachPod: the program drops everything from an undescribed interface.
func (d *Datapath) UpsertPodInterface(p PodInterface) (err error) {
	defer d.invalidate(&err)
	if p.Ifindex <= 0 {
		return fmt.Errorf("pod interface: ifindex %d must be > 0", p.Ifindex)
	}
	if err := checkVNI(p.VNI); err != nil {
		return fmt.Errorf("pod interface %d: %w", p.Ifindex, err)
	}
	v := mizarPodIface{Vni: p.VNI}
	if v.Ip, err = ipv4("pod IP", p.IP); err != nil {
		return fmt.Errorf("pod interface %d: %w", p.Ifindex, err)
	}
	if v.Mac, err = mac("pod MAC", p.MAC); err != nil {
		return fmt.Errorf("pod interface %d: %w", p.Ifindex, err)
	}
	if v.Mac[0]&1 != 0 {
		// The pod program drops multicast source MACs: such a pod could
		// never send.
		return fmt.Errorf("pod interface %d: pod MAC %s is a multicast address", p.Ifindex, p.MAC)
	}
	if v.GwIp, err = ipv4("gateway IP", p.GatewayIP); err != nil {
		return fmt.Errorf("pod interface %d: %w", p.Ifindex, err)
	}
	if v.GwMac, err = mac("gateway MAC", p.GatewayMAC); err != nil {
		return fmt.Errorf("pod interface %d: %w", p.Ifindex, err)
	}
	if err := checkPrefix(p.Subnet); err != nil {
		return fmt.Errorf("pod interface %d subnet: %w", p.Ifindex, err)
	}
	if !p.Subnet.Contains(p.IP.Unmap()) {
		return fmt.Errorf("pod interface %d: IP %s is outside its subnet %s", p.Ifindex, p.IP, p.Subnet)
	}
	v.Subnet = p.Subnet.Addr().Unmap().As4()
	v.SubnetLen = uint32(p.Subnet.Bits())
	if err := d.objs.PodIfaces.Put(uint32(p.Ifindex), &v); err != nil {
		return fmt.Errorf("put pod interface %d: %w", p.Ifindex, err)
	}
	return nil
}

// DeletePodInterface removes a pod interface's description; a missing one is
// not an error.
func (d *Datapath) DeletePodInterface(ifindex int) (err error) {
	defer d.invalidate(&err)
	if ifindex <= 0 {
		return fmt.Errorf("pod interface: ifindex %d must be > 0", ifindex)
	}
	return deleteKey(d.objs.PodIfaces, uint32(ifindex), "pod interface")
}

// PodInterfaces lists the pod_ifaces map.
func (d *Datapath) PodInterfaces() ([]PodInterface, error) {
	var (
		k   uint32
		v   mizarPodIface
		out []PodInterface
	)
	it := d.objs.PodIfaces.Iterate()
	for it.Next(&k, &v) {
		out = append(out, PodInterface{
			Ifindex:    int(k),
			VNI:        v.Vni,
			IP:         netip.AddrFrom4(v.Ip),
			MAC:        hwaddr(v.Mac),
			Subnet:     netip.PrefixFrom(netip.AddrFrom4(v.Subnet), int(v.SubnetLen)),
			GatewayIP:  netip.AddrFrom4(v.GwIp),
			GatewayMAC: hwaddr(v.GwMac),
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list pod interfaces: %w", err)
	}
	return out, nil
}

// Counters are the per-program packet counters, summed over CPUs, by name:
// the C enum names lower-cased without their UL_/POD_ prefix (e.g.
// Underlay["deliver"], Pod["drop_spoof"]).
type Counters struct {
	Underlay map[string]uint64
	Pod      map[string]uint64
}

// Counters reads both programs' counters.
func (d *Datapath) Counters() (Counters, error) {
	ul, err := sumPerCPU(d.objs.UnderlayStats, d.underlayNames)
	if err != nil {
		return Counters{}, fmt.Errorf("underlay counters: %w", err)
	}
	ul["rx"] = underlayRx(ul)
	pod, err := sumPerCPU(d.objs.PodStats, d.podNames)
	if err != nil {
		return Counters{}, fmt.Errorf("pod counters: %w", err)
	}
	return Counters{Underlay: ul, Pod: pod}, nil
}

// underlayRx is the Geneve this host's port received: every packet the
// underlay program did not pass ends in exactly one verdict counter (deliver,
// fwd_*, drop_*), so rx is their sum rather than one more count per packet.
// learn, stamp, rebounce and svc_rev_nat come on top of a verdict.
func underlayRx(ul map[string]uint64) uint64 {
	var rx uint64
	for name, v := range ul {
		if name == "deliver" || strings.HasPrefix(name, "fwd_") || strings.HasPrefix(name, "drop_") {
			rx += v
		}
	}
	return rx
}

func sumPerCPU(m *ebpf.Map, names []string) (map[string]uint64, error) {
	out := make(map[string]uint64, len(names))
	var per []uint64
	for i, name := range names {
		if err := m.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		out[name] = sum
	}
	return out, nil
}

// invalidate bumps the maps' generation after a change, which empties the
// programs' per-CPU flow caches (bpf/include/route.h): a flow's next packet
// is decided from the maps again. Called after every write, failed or not;
// its own failure is the caller's error, since stale caches would keep
// sending a flow where the maps no longer say.
func (d *Datapath) invalidate(errp *error) {
	d.genMu.Lock()
	defer d.genMu.Unlock()
	var gen uint64
	err := d.objs.Generation.Lookup(uint32(0), &gen)
	if err == nil {
		// The clock rather than gen+1 alone: two agents sharing the pins
		// (a restart's overlap) never write the same next value.
		next := uint64(time.Now().UnixNano())
		if next <= gen {
			next = gen + 1
		}
		err = d.objs.Generation.Update(uint32(0), next, ebpf.UpdateAny)
	}
	if err != nil && *errp == nil {
		*errp = fmt.Errorf("invalidate the flow caches: %w", err)
	}
}

func deleteKey(m *ebpf.Map, key any, what string) error {
	if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete %s: %w", what, err)
	}
	return nil
}

func checkVNI(vni uint32) error {
	if vni == 0 || vni > MaxVNI {
		return fmt.Errorf("VNI %d out of range 1..%d", vni, MaxVNI)
	}
	return nil
}

func endpointKey(vni uint32, ip netip.Addr) (mizarEndpointKey, error) {
	if err := checkVNI(vni); err != nil {
		return mizarEndpointKey{}, err
	}
	a, err := ipv4("endpoint IP", ip)
	if err != nil {
		return mizarEndpointKey{}, err
	}
	return mizarEndpointKey{Vni: vni, Ip: a}, nil
}

func subnetKey(vni uint32, p netip.Prefix) (mizarSubnetKey, error) {
	if err := checkVNI(vni); err != nil {
		return mizarSubnetKey{}, err
	}
	if err := checkPrefix(p); err != nil {
		return mizarSubnetKey{}, err
	}
	// The VNI is always matched in full: prefixlen counts its 32 bits.
	return mizarSubnetKey{Prefixlen: 32 + uint32(p.Bits()), Vni: vni, Ip: p.Addr().Unmap().As4()}, nil
}

func checkPrefix(p netip.Prefix) error {
	if !p.IsValid() || !p.Addr().Unmap().Is4() {
		return fmt.Errorf("%v is not an IPv4 prefix", p)
	}
	if p.Masked() != p {
		return fmt.Errorf("prefix %s has host bits set (want %s)", p, p.Masked())
	}
	return nil
}

func ipv4(what string, a netip.Addr) ([4]byte, error) {
	a = a.Unmap()
	if !a.Is4() {
		return [4]byte{}, fmt.Errorf("%s %v is not an IPv4 address", what, a)
	}
	if a.IsUnspecified() {
		return [4]byte{}, fmt.Errorf("%s is 0.0.0.0", what)
	}
	return a.As4(), nil
}

func mac(what string, m net.HardwareAddr) ([6]byte, error) {
	var out [6]byte
	if len(m) != 6 {
		return out, fmt.Errorf("%s %q is not a 6-byte Ethernet address", what, m.String())
	}
	copy(out[:], m)
	if out == [6]byte{} {
		return out, fmt.Errorf("%s is all zeros", what)
	}
	return out, nil
}

func hwaddr(b [6]byte) net.HardwareAddr {
	return net.HardwareAddr(append([]byte(nil), b[:]...))
}

func hops(dst *[MaxHops]mizarHop, src []Hop) (uint32, error) {
	if len(src) > MaxHops {
		return 0, fmt.Errorf("%d hops, at most %d", len(src), MaxHops)
	}
	for i, h := range src {
		var err error
		if dst[i].Ip, err = ipv4("hop IP", h.IP); err != nil {
			return 0, err
		}
		if h.MAC == nil {
			dst[i].Mac = [6]byte{}
			continue // behind a router: the FIB decides
		}
		if dst[i].Mac, err = mac("hop MAC", h.MAC); err != nil {
			return 0, err
		}
	}
	return uint32(len(src)), nil
}

func fromHops(src []mizarHop, n uint32) []Hop {
	n = min(n, uint32(len(src)))
	out := make([]Hop, 0, n)
	for _, h := range src[:n] {
		hop := Hop{IP: netip.AddrFrom4(h.Ip)}
		if h.Mac != [6]byte{} {
			hop.MAC = hwaddr(h.Mac)
		}
		out = append(out, hop)
	}
	return out
}

// UpsertDroplet makes a host on the underlay known: Geneve is accepted only
// from droplets. h.MAC is given as in Hop (nil behind a router): a path
// learned to the droplet then goes straight to that MAC instead of asking the
// FIB per packet. Adding one that is known replaces its MAC.
func (d *Datapath) UpsertDroplet(h Hop) (err error) {
	defer d.invalidate(&err)
	k, err := dropletKey(h.IP)
	if err != nil {
		return fmt.Errorf("droplet: %w", err)
	}
	// The programs refuse to learn these whatever the map says
	// (ip_never_droplet): a droplet holding one would be unreachable.
	if a := h.IP.Unmap(); a.IsLoopback() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) ||
		a.As4()[0] == 0 || a.As4()[0] >= 224 {
		return fmt.Errorf("droplet %s: not a unicast address", h.IP)
	}
	var v, old mizarDroplet
	if h.MAC != nil {
		if v.Mac, err = mac("droplet MAC", h.MAC); err != nil {
			return fmt.Errorf("droplet %s: %w", h.IP, err)
		}
	}
	hadOld := d.objs.Droplets.Lookup(&k, &old) == nil
	if v.Mac != [6]byte{} {
		// The MAC first: a frame from the droplet's address must carry it
		// from the moment the droplet carries it.
		if err := d.objs.DropletMacs.Put(&mizarMacKey{Mac: v.Mac}, &k); err != nil {
			return fmt.Errorf("put droplet %s MAC: %w", h.IP, err)
		}
	}
	if err := d.objs.Droplets.Put(&k, &v); err != nil {
		return fmt.Errorf("put droplet %s: %w", h.IP, err)
	}
	if hadOld && old.Mac != v.Mac {
		return d.forgetMAC(old.Mac, k)
	}
	return nil
}

// forgetMAC drops mac from droplet_macs if it still names droplet k.
func (d *Datapath) forgetMAC(m [6]byte, k mizarDropletKey) error {
	if m == [6]byte{} {
		return nil
	}
	var owner mizarDropletKey
	mk := mizarMacKey{Mac: m}
	if err := d.objs.DropletMacs.Lookup(&mk, &owner); err != nil || owner != k {
		return nil // another droplet's now, or gone
	}
	return deleteKey(d.objs.DropletMacs, &mk, "droplet MAC")
}

// DeleteDroplet forgets a droplet; a missing one is not an error. Its relay
// roles (SetRelays) stay until they are replaced, but are unused while the
// droplet is unknown. What was learned about it goes with it (ForgetHost).
func (d *Datapath) DeleteDroplet(ip netip.Addr) (err error) {
	defer d.invalidate(&err)
	k, err := dropletKey(ip)
	if err != nil {
		return fmt.Errorf("droplet: %w", err)
	}
	var old mizarDroplet
	hadOld := d.objs.Droplets.Lookup(&k, &old) == nil
	if err := deleteKey(d.objs.Droplets, &k, "droplet"); err != nil {
		return err
	}
	if hadOld {
		if err := d.forgetMAC(old.Mac, k); err != nil {
			return err
		}
	}
	return d.forgetHost(k.Ip)
}

// ForgetHost drops every path learned to host and every introduction made
// to it, at once: the agent calls it when the API says that host no longer
// holds what it may have been learned for (a droplet deleted; DeleteDroplet
// does it). The programs look again from the next packet.
func (d *Datapath) ForgetHost(host netip.Addr) (err error) {
	defer d.invalidate(&err)
	a, err := ipv4("learned host", host)
	if err != nil {
		return err
	}
	return d.forgetHost(a)
}

func (d *Datapath) forgetHost(host [4]byte) error {
	var (
		lk   mizarEndpointKey
		lv   mizarLearnedEntry
		ik   mizarIntroKey
		iv   uint64
		dead []mizarEndpointKey
		gone []mizarIntroKey
	)
	// Collected first: deleting while iterating a hash map restarts or
	// skips the walk.
	it := d.objs.Learned.Iterate()
	for it.Next(&lk, &lv) {
		if lv.HostIp == host {
			dead = append(dead, lk)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list learned endpoints: %w", err)
	}
	it = d.objs.Introduced.Iterate()
	for it.Next(&ik, &iv) {
		if ik.HostIp == host {
			gone = append(gone, ik)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list introductions: %w", err)
	}
	var errs []error
	for i := range dead {
		errs = append(errs, deleteKey(d.objs.Learned, &dead[i], "learned endpoint"))
	}
	for i := range gone {
		errs = append(errs, deleteKey(d.objs.Introduced, &gone[i], "introduction"))
	}
	return errors.Join(errs...)
}

// Droplets lists the droplets map.
func (d *Datapath) Droplets() ([]Hop, error) {
	var (
		k   mizarDropletKey
		v   mizarDroplet
		out []Hop
	)
	it := d.objs.Droplets.Iterate()
	for it.Next(&k, &v) {
		h := Hop{IP: netip.AddrFrom4(k.Ip)}
		if v.Mac != [6]byte{} {
			h.MAC = hwaddr(v.Mac)
		}
		out = append(out, h)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list droplets: %w", err)
	}
	return out, nil
}

// SetRelays replaces the set of droplets that are bouncers or dividers of
// the VPC with this VNI. A relay may forward packets of any endpoint of the
// VPC; every other droplet is trusted only with the endpoints it hosts (the
// endpoints map must say so: an inner source this host does not know is
// refused unless a relay brings it). An empty list removes them all.
func (d *Datapath) SetRelays(vni uint32, ips []netip.Addr) (err error) {
	defer d.invalidate(&err)
	if err := checkVNI(vni); err != nil {
		return fmt.Errorf("relays: %w", err)
	}
	want := make(map[mizarEndpointKey]bool, len(ips))
	for _, ip := range ips {
		a, err := ipv4("relay IP", ip)
		if err != nil {
			return fmt.Errorf("relays of VPC %d: %w", vni, err)
		}
		want[mizarEndpointKey{Vni: vni, Ip: a}] = true
	}
	// Add first, then remove the rest: a relay staying in the set is never
	// missing in between.
	for k := range want {
		if err := d.objs.Relays.Put(&k, uint8(1)); err != nil {
			return fmt.Errorf("put relay (%d, %v): %w", vni, netip.AddrFrom4(k.Ip), err)
		}
	}
	stale, err := d.relayKeys(func(k mizarEndpointKey) bool { return k.Vni == vni && !want[k] })
	if err != nil {
		return err
	}
	for _, k := range stale {
		if err := deleteKey(d.objs.Relays, &k, "relay"); err != nil {
			return err
		}
	}
	return nil
}

// Relays lists the relays map by VNI.
func (d *Datapath) Relays() (map[uint32][]netip.Addr, error) {
	keys, err := d.relayKeys(func(mizarEndpointKey) bool { return true })
	if err != nil {
		return nil, err
	}
	out := map[uint32][]netip.Addr{}
	for _, k := range keys {
		out[k.Vni] = append(out[k.Vni], netip.AddrFrom4(k.Ip))
	}
	return out, nil
}

func (d *Datapath) relayKeys(keep func(mizarEndpointKey) bool) ([]mizarEndpointKey, error) {
	var (
		k   mizarEndpointKey
		v   uint8
		out []mizarEndpointKey
	)
	it := d.objs.Relays.Iterate()
	for it.Next(&k, &v) {
		if keep(k) {
			out = append(out, k)
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list relays: %w", err)
	}
	return out, nil
}

func dropletKey(ip netip.Addr) (mizarDropletKey, error) {
	a, err := ipv4("droplet IP", ip)
	if err != nil {
		return mizarDropletKey{}, err
	}
	return mizarDropletKey{Ip: a}, nil
}

// LearnedEndpoint is an entry of the learned map: where a relay said an
// endpoint lives (direct-path learning, see bpf/include/mizar.h).
type LearnedEndpoint struct {
	VNI    uint32
	IP     netip.Addr
	HostIP netip.Addr
	// TTL is how much longer the entry is used; <= 0 once expired (it
	// stays in the LRU map until evicted or refreshed).
	TTL time.Duration
}

// Learned lists the learned map.
func (d *Datapath) Learned() ([]LearnedEndpoint, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nil, fmt.Errorf("read the monotonic clock: %w", err)
	}
	now := ts.Nano() // the programs' clocks (coarse or not) are CLOCK_MONOTONIC
	var (
		k   mizarEndpointKey
		v   mizarLearnedEntry
		out []LearnedEndpoint
	)
	it := d.objs.Learned.Iterate()
	for it.Next(&k, &v) {
		out = append(out, LearnedEndpoint{VNI: k.Vni, IP: netip.AddrFrom4(k.Ip), HostIP: netip.AddrFrom4(v.HostIp),
			TTL: time.Duration(int64(v.Expires) - now)})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list learned endpoints: %w", err)
	}
	return out, nil
}

// ForgetLearned drops what was learned about (vni, ip): the agent calls it
// when an endpoint is deleted or moves, so no packet is sent to its old host.
// UpsertEndpoint and DeleteEndpoint do it too. A missing entry is not an
// error.
func (d *Datapath) ForgetLearned(vni uint32, ip netip.Addr) (err error) {
	defer d.invalidate(&err)
	k, err := endpointKey(vni, ip)
	if err != nil {
		return fmt.Errorf("learned endpoint: %w", err)
	}
	return deleteKey(d.objs.Learned, &k, "learned endpoint")
}

// SetHostAddrs replaces the set of this node's own IPv4 addresses: pod
// traffic to them is handed to the host stack (kubelet probes) instead of
// the overlay. An address a VPC also uses is then the node's for its pods.
func (d *Datapath) SetHostAddrs(ips []netip.Addr) (err error) {
	defer d.invalidate(&err) // the pod side caches what it decided
	want := make(map[mizarDropletKey]bool, len(ips))
	for _, ip := range ips {
		k, err := dropletKey(ip)
		if err != nil {
			return fmt.Errorf("host address: %w", err)
		}
		want[k] = true
	}
	for k := range want {
		if err := d.objs.HostAddrs.Put(&k, uint8(1)); err != nil {
			return fmt.Errorf("put host address %s: %w", netip.AddrFrom4(k.Ip), err)
		}
	}
	have, err := d.HostAddrs()
	if err != nil {
		return err
	}
	for _, ip := range have {
		k, _ := dropletKey(ip)
		if !want[k] {
			if err := deleteKey(d.objs.HostAddrs, &k, "host address"); err != nil {
				return err
			}
		}
	}
	return nil
}

// HostAddrs lists the host_addrs map.
func (d *Datapath) HostAddrs() ([]netip.Addr, error) {
	var (
		k   mizarDropletKey
		v   uint8
		out []netip.Addr
	)
	it := d.objs.HostAddrs.Iterate()
	for it.Next(&k, &v) {
		out = append(out, netip.AddrFrom4(k.Ip))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list host addresses: %w", err)
	}
	return out, nil
}
