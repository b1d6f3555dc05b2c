package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/dataplane"
	"mizar.dev/pkg/generated/clientset/versioned"
	informers "mizar.dev/pkg/generated/informers/externalversions"
	listers "mizar.dev/pkg/generated/listers/networking/v1alpha1"
)

// Datapath is the agent's Dataplane over the real eBPF datapath.
//
// Besides what the agent's streams hand it (endpoints hosted here, endpoints
// of the subnets it bounces for and of the VPCs it divides for), the programs need the cluster's topology:
// which droplets exist (Geneve is accepted only from them), each VPC's VNI
// and dividers, each subnet's bouncers, and the relays of each VPC. Those
// kinds are few and small (no endpoints among them), so it follows them with
// informers and rewrites the topology maps on every change.
type Datapath struct {
	dp       *dataplane.Datapath
	pods     *DatapathPods
	droplet  string
	underlay string
	hostNS   string
	// l2 is the underlay's connected prefix: droplets inside it are reached
	// by their MAC, the others through the FIB.
	l2     netip.Prefix
	wg     *dataplane.WireGuard // encrypted mode; nil: plain
	hostIP netip.Addr

	factory  informers.SharedInformerFactory
	vpcs     listers.VpcLister
	subnets  listers.SubnetLister
	droplets listers.DropletLister
	bouncers listers.BouncerLister
	dividers listers.DividerLister
	kick     chan struct{}

	mu     sync.Mutex
	owners map[endpointID]map[string]bool // who asked for an endpoint entry: "host" or "bouncer/<name>"
	keys   map[string]endpointID          // "<owner>|<namespace/name>" -> its entry
	drops  []netip.Addr                   // droplets programmed last
	vnis   map[uint32]bool                // VNIs with relays programmed last
	subs   map[subnetID]bool

	// The host path (hostpath.go): the VPC named by --host-vpc, and what
	// was applied last.
	hostVPC     string
	podMTU      int
	hpMu        sync.Mutex
	hostPath    dataplane.HostPath
	hostPathSet bool
}

type subnetID struct {
	vni    uint32
	prefix netip.Prefix
}

type endpointID struct {
	vni uint32
	ip  netip.Addr
}

// DatapathOptions configure NewDatapath.
type DatapathOptions struct {
	Client    versioned.Interface
	DP        *dataplane.Datapath
	Droplet   string
	Underlay  string       // underlay interface name in the host netns
	HostIP    netip.Prefix // this droplet's underlay address and prefix
	HostNetns string       // "" = the agent's own
	// HostVPC names the VPC whose pods get Kubernetes networking through
	// the node (hostpath.go); "" = none.
	HostVPC string
	// PodMTU is the pods' MTU, also the host device's.
	PodMTU int
	// WireGuard, in encrypted mode, is the underlay's far side: every
	// other droplet becomes its peer (wireguard.go); droplets carry no MAC.
	WireGuard *dataplane.WireGuard
}

// NewDatapath returns the real Dataplane; Attach starts it.
func NewDatapath(o DatapathOptions) *Datapath {
	f := informers.NewSharedInformerFactory(o.Client, 10*time.Minute)
	n := f.Networking().V1alpha1()
	d := &Datapath{
		dp: o.DP, pods: &DatapathPods{DP: o.DP, HostNetns: o.HostNetns}, droplet: o.Droplet, underlay: o.Underlay,
		hostNS: o.HostNetns, l2: o.HostIP.Masked(), hostIP: o.HostIP.Addr(), factory: f, wg: o.WireGuard,
		vpcs: n.Vpcs().Lister(), subnets: n.Subnets().Lister(), droplets: n.Droplets().Lister(),
		bouncers: n.Bouncers().Lister(), dividers: n.Dividers().Lister(),
		kick: make(chan struct{}, 1), hostVPC: o.HostVPC, podMTU: o.PodMTU,
		owners: map[endpointID]map[string]bool{}, keys: map[string]endpointID{}, vnis: map[uint32]bool{}, subs: map[subnetID]bool{},
	}
	h := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { d.poke() },
		// Status writes (every acknowledgement patches a droplet, bouncer
		// or divider) change nothing the maps hold: only spec changes count.
		UpdateFunc: func(old, cur any) {
			if !equality.Semantic.DeepEqual(specOf(old), specOf(cur)) || wireGuardChanged(old, cur) {
				d.poke()
			}
		},
		DeleteFunc: func(any) { d.poke() },
	}
	for _, inf := range []cache.SharedIndexInformer{n.Vpcs().Informer(), n.Subnets().Informer(), n.Droplets().Informer(), n.Bouncers().Informer(), n.Dividers().Informer()} {
		_, _ = inf.AddEventHandler(h)
	}
	if o.DP != nil {
		_, _ = n.Subnets().Informer().AddEventHandler(newDepartures(o.DP, d.vni).handler())
	}
	return d
}

// Occupancy is how many entries the agent has written into each map, from
// its own bookkeeping: O(1), where reading the maps would walk them.
func (d *Datapath) Occupancy() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return map[string]int{"endpoints": len(d.owners), "subnets": len(d.subs), "vpcs": len(d.vnis), "droplets": len(d.drops),
		"pod_ifaces": d.pods.Attached()}
}

// Informers is the datapath's informer factory, started by Attach; the CNI
// server reads subnets and VPCs from it instead of watching them again.
func (d *Datapath) Informers() informers.SharedInformerFactory { return d.factory }

// Pods is the pod side of this datapath, for the CNI server.
func (d *Datapath) Pods() *DatapathPods { return d.pods }

func (d *Datapath) poke() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Attach implements Dataplane: it syncs the topology, then attaches the
// underlay program (updating a pinned attachment in place after a restart).
func (d *Datapath) Attach(ctx context.Context) error {
	d.factory.Start(ctx.Done())
	for typ, ok := range d.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("syncing the %v informer: %w", typ, ctx.Err())
		}
	}
	if err := d.syncTopology(); err != nil {
		return err
	}
	// Endpoints may have left their hosts while no agent followed their
	// subnets' departures (departures.go): what an earlier run learned is
	// learned again through the relays.
	if err := d.dp.ForgetAllLearned(); err != nil {
		return err
	}
	// Tagged Geneve is dropped, but only a tag left in the frame is seen.
	if err := d.pods.inHost(func() error { return dataplane.DisableVLANStripping(d.underlay) }); err != nil {
		klog.ErrorS(err, "VLAN tags stay hidden from the underlay program", "interface", d.underlay)
	}
	d.removeStaleHostPath(ctx)
	if err := d.syncHostPath(ctx); err != nil {
		return err
	}
	if err := d.pods.inHost(func() error { return d.dp.AttachUnderlay(d.underlay) }); err != nil {
		return fmt.Errorf("attach the underlay program to %s: %w", d.underlay, err)
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-d.kick:
			}
			if err := d.syncTopology(); err != nil {
				// Retried on the next change and at the informers' resync.
				klog.ErrorS(err, "Programming the topology (droplets, VPCs, subnets, relays) failed; retried on the next change")
			}
			if err := d.syncHostPath(ctx); err != nil {
				klog.ErrorS(err, "Host path; retried on the next change")
			}
		}
	}()
	return nil
}

func (d *Datapath) hop(dropletName string) (dataplane.Hop, bool) {
	dr, err := d.droplets.Get(dropletName)
	if err != nil {
		return dataplane.Hop{}, false
	}
	return d.dropletHop(dr)
}

// dropletHop is a droplet as a next hop: its MAC only when it shares this
// host's L2 segment (the FIB finds the way to the others).
func (d *Datapath) dropletHop(dr *v1alpha1.Droplet) (dataplane.Hop, bool) {
	ip, err := netip.ParseAddr(dr.Spec.IP)
	if err != nil {
		return dataplane.Hop{}, false
	}
	h := dataplane.Hop{IP: ip}
	if d.wg == nil && d.l2.Contains(ip) { // encrypted: every droplet is behind the TAP's far side
		h.MAC, _ = net.ParseMAC(dr.Spec.MAC)
	}
	return h, true
}

func (d *Datapath) vni(vpc string) (uint32, bool) {
	v, err := d.vpcs.Get(vpc)
	if err != nil || v.Spec.VNI <= 0 {
		return 0, false
	}
	return uint32(v.Spec.VNI), true
}

// syncTopology rewrites droplets, VPCs, subnets and relays from the informers.
func (d *Datapath) syncTopology() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	drops, _ := d.droplets.List(labels.Everything())
	seen := map[netip.Addr]bool{}
	for _, dr := range drops {
		h, ok := d.dropletHop(dr)
		if !ok || h.IP == d.hostIP {
			continue
		}
		seen[h.IP] = true
		if err := d.dp.UpsertDroplet(h); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ip := range d.drops {
		if !seen[ip] {
			errs = append(errs, d.dp.DeleteDroplet(ip))
		}
	}
	d.drops = d.drops[:0]
	for ip := range seen {
		d.drops = append(d.drops, ip)
	}
	if d.wg != nil {
		if err := d.syncWireGuardPeers(drops); err != nil {
			errs = append(errs, err)
		}
	}

	relays := map[uint32][]netip.Addr{}
	dividers := map[uint32][]dataplane.Hop{}
	selfRelay := map[uint32]bool{} // this droplet is a divider or bouncer of the VNI's VPC
	vpcs, _ := d.vpcs.List(labels.Everything())
	divs, _ := d.dividers.List(labels.Everything())
	for _, v := range vpcs {
		vni, ok := d.vni(v.Name)
		if !ok {
			continue
		}
		entry := dataplane.VPC{VNI: vni}
		for _, dv := range divs {
			if h, ok := d.hop(dv.Spec.Droplet); ok && dv.Spec.VPC == v.Name && len(entry.Dividers) < dataplane.MaxHops {
				entry.Dividers = append(entry.Dividers, h)
				relays[vni] = append(relays[vni], h.IP)
				selfRelay[vni] = selfRelay[vni] || dv.Spec.Droplet == d.droplet
			}
		}
		dividers[vni] = entry.Dividers
		if err := d.dp.UpsertVPC(entry); err != nil {
			errs = append(errs, err)
		}
		if _, ok := relays[vni]; !ok {
			relays[vni] = nil
		}
	}
	subs, _ := d.subnets.List(labels.Everything())
	bns, _ := d.bouncers.List(labels.Everything())
	want := map[subnetID]bool{}
	var entries []dataplane.Subnet
	for _, s := range subs {
		vni, ok := d.vni(s.Spec.VPC)
		p, err := netip.ParsePrefix(s.Spec.CIDR)
		if !ok || err != nil {
			continue
		}
		entry := dataplane.Subnet{VNI: vni, Prefix: p.Masked()}
		for _, b := range bns {
			if h, ok := d.hop(b.Spec.Droplet); ok && b.Spec.Subnet == s.Name && len(entry.Bouncers) < dataplane.MaxHops {
				entry.Bouncers = append(entry.Bouncers, h)
				relays[vni] = append(relays[vni], h.IP)
				selfRelay[vni] = selfRelay[vni] || b.Spec.Droplet == d.droplet
			}
		}
		entries = append(entries, entry)
	}
	for _, entry := range entries {
		// A bouncer trusts inner sources of its own subnet only (it holds
		// just those endpoints), so a droplet that is no relay of the VPC
		// could not reach another subnet through its bouncers. Such a
		// droplet sends every subnet's traffic through the VPC's dividers
		// instead: they hold every endpoint of the VPC and forward straight
		// to the destination's host, the same one relay hop. Relays are
		// trusted VPC-wide and keep the bouncers.
		if !selfRelay[entry.VNI] && len(dividers[entry.VNI]) > 0 {
			entry.Bouncers = dividers[entry.VNI]
		}
		if err := d.dp.UpsertSubnet(entry); err != nil {
			errs = append(errs, err)
		}
		want[subnetID{entry.VNI, entry.Prefix}] = true
	}
	for s := range d.subs {
		if !want[s] {
			errs = append(errs, d.dp.DeleteSubnet(s.vni, s.prefix))
		}
	}
	d.subs = want
	for vni, ips := range relays {
		errs = append(errs, d.dp.SetRelays(vni, ips))
	}
	for vni := range d.vnis {
		if _, ok := relays[vni]; !ok {
			errs = append(errs, d.dp.SetRelays(vni, nil), d.dp.DeleteVPC(vni))
		}
	}
	d.vnis = map[uint32]bool{}
	for vni := range relays {
		d.vnis[vni] = true
	}
	return errors.Join(errs...)
}

// endpoint resolves an endpoint to its map entry.
func (d *Datapath) endpoint(ep *v1alpha1.Endpoint) (dataplane.Endpoint, error) {
	s, err := d.subnets.Get(ep.Spec.Subnet)
	if err != nil {
		return dataplane.Endpoint{}, fmt.Errorf("endpoint %s/%s: subnet %s: %w", ep.Namespace, ep.Name, ep.Spec.Subnet, err)
	}
	vni, ok := d.vni(s.Spec.VPC)
	if !ok {
		return dataplane.Endpoint{}, fmt.Errorf("endpoint %s/%s: VPC %s has no VNI yet", ep.Namespace, ep.Name, s.Spec.VPC)
	}
	ip, err := netip.ParseAddr(ep.Spec.IP)
	if err != nil {
		return dataplane.Endpoint{}, fmt.Errorf("endpoint %s/%s: ip %q: %w", ep.Namespace, ep.Name, ep.Spec.IP, err)
	}
	mac, err := net.ParseMAC(ep.Spec.MAC)
	if err != nil {
		return dataplane.Endpoint{}, fmt.Errorf("endpoint %s/%s: mac %q: %w", ep.Namespace, ep.Name, ep.Spec.MAC, err)
	}
	h, ok := d.hop(ep.Spec.Droplet)
	if !ok {
		return dataplane.Endpoint{}, fmt.Errorf("endpoint %s/%s: droplet %s unknown", ep.Namespace, ep.Name, ep.Spec.Droplet)
	}
	return dataplane.Endpoint{VNI: vni, IP: ip, MAC: mac, HostIP: h.IP, HostMAC: h.MAC}, nil
}

func (d *Datapath) set(owner string, ep *v1alpha1.Endpoint, e dataplane.Endpoint) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	id := endpointID{e.VNI, e.IP}
	key := owner + "|" + ep.Namespace + "/" + ep.Name
	if old, ok := d.keys[key]; ok && old != id {
		d.release(owner, key, old)
	}
	if owner != "host" && d.owners[id]["host"] {
		// The host's entry (with the local veth) wins over a bouncer's.
		d.keys[key] = id
		d.own(id, owner)
		return nil
	}
	if err := d.dp.UpsertEndpoint(e); err != nil {
		return err
	}
	d.keys[key] = id
	d.own(id, owner)
	return nil
}

func (d *Datapath) own(id endpointID, owner string) {
	if d.owners[id] == nil {
		d.owners[id] = map[string]bool{}
	}
	d.owners[id][owner] = true
}

// release drops owner's claim on id, deleting the entry when nobody is left.
func (d *Datapath) release(owner, key string, id endpointID) error {
	delete(d.keys, key)
	delete(d.owners[id], owner)
	if len(d.owners[id]) > 0 {
		return nil
	}
	delete(d.owners, id)
	return d.dp.DeleteEndpoint(id.vni, id.ip)
}

func (d *Datapath) unset(owner, key string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	id, ok := d.keys[owner+"|"+key]
	if !ok {
		return nil
	}
	return d.release(owner, owner+"|"+key, id)
}

// SetHostEndpoint implements Dataplane: an endpoint of a pod on this droplet,
// delivered through its host-side veth.
func (d *Datapath) SetHostEndpoint(ep *v1alpha1.Endpoint) error {
	id, ok := ep.Labels[AttachmentLabel]
	if !ok || len(id) < 13 {
		return nil // not made by this droplet's CNI server: no interface to deliver to
	}
	e, err := d.endpoint(ep)
	if err != nil {
		return err
	}
	_, hostIf := names(id)
	h, err := handleAt(d.hostNS)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(hostIf)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil // the pod is gone already; its DEL removes the endpoint
		}
		return fmt.Errorf("endpoint %s/%s: veth %s: %w", ep.Namespace, ep.Name, hostIf, err)
	}
	e.Ifindex = l.Attrs().Index
	return d.set("host", ep, e)
}

// DeleteHostEndpoint implements Dataplane.
func (d *Datapath) DeleteHostEndpoint(key string) error { return d.unset("host", key) }

// SetBouncer implements Dataplane; the topology sync programs the subnet.
func (d *Datapath) SetBouncer(*v1alpha1.Bouncer) error { return nil }

// DeleteBouncer implements Dataplane: the bouncer's endpoint entries go.
func (d *Datapath) DeleteBouncer(name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	owner := "bouncer/" + name
	var errs []error
	for key, id := range d.keys {
		if d.owners[id][owner] && len(key) > len(owner) && key[:len(owner)+1] == owner+"|" {
			errs = append(errs, d.release(owner, key, id))
		}
	}
	return errors.Join(errs...)
}

// SetBouncerEndpoint implements Dataplane.
func (d *Datapath) SetBouncerEndpoint(bouncer string, ep *v1alpha1.Endpoint) error {
	e, err := d.endpoint(ep)
	if err != nil {
		return err
	}
	return d.set("bouncer/"+bouncer, ep, e)
}

// DeleteBouncerEndpoint implements Dataplane.
func (d *Datapath) DeleteBouncerEndpoint(bouncer, key string) error {
	return d.unset("bouncer/"+bouncer, key)
}

// SetDivider implements Dataplane; the topology sync programs the subnets.
func (d *Datapath) SetDivider(*v1alpha1.Divider) error { return nil }

// DeleteDivider implements Dataplane: the divider's endpoint entries go (the
// agent has ended its streams).
func (d *Datapath) DeleteDivider(name string) error {
	return d.DeleteBouncer(dividerOwner(name)) // same bookkeeping, another owner name
}

// dividerOwner is a divider's owner name among the bouncers' in the entries'
// bookkeeping.
func dividerOwner(name string) string { return "divider-" + name }

// SetDividerSubnet implements Dataplane; the topology sync programs the subnets.
func (d *Datapath) SetDividerSubnet(string, *v1alpha1.Subnet) error { return nil }

// DeleteDividerSubnet implements Dataplane: the agent has removed the
// subnet's endpoints already.
func (d *Datapath) DeleteDividerSubnet(string, string) error { return nil }

// SetDividerEndpoint implements Dataplane. A divider relays packets whose inner
// source is any endpoint of its VPC, and the underlay program accepts them
// only from the host the endpoints map names for that source: so a divider's
// host holds the endpoints of every subnet of the VPC, as a bouncer's host
// does for its subnet.
func (d *Datapath) SetDividerEndpoint(divider string, ep *v1alpha1.Endpoint) error {
	return d.SetBouncerEndpoint(dividerOwner(divider), ep)
}

// DeleteDividerEndpoint implements Dataplane.
func (d *Datapath) DeleteDividerEndpoint(divider, key string) error {
	return d.DeleteBouncerEndpoint(dividerOwner(divider), key)
}

var _ Dataplane = (*Datapath)(nil)

// specOf is the part of a topology object the maps are made from.
func specOf(o any) any {
	switch v := o.(type) {
	case *v1alpha1.Vpc:
		return v.Spec
	case *v1alpha1.Subnet:
		return v.Spec
	case *v1alpha1.Droplet:
		return v.Spec
	case *v1alpha1.Bouncer:
		return v.Spec
	case *v1alpha1.Divider:
		return v.Spec
	}
	return o
}

// wireGuardChanged reports whether a droplet's published WireGuard key or
// endpoint changed (a key rotation, a node's new physical address).
func wireGuardChanged(old, cur any) bool {
	was, ok1 := old.(*v1alpha1.Droplet)
	now, ok2 := cur.(*v1alpha1.Droplet)
	if !ok1 || !ok2 {
		return false
	}
	for _, k := range []string{v1alpha1.DropletWireGuardKeyAnnotation, v1alpha1.DropletWireGuardEndpointAnnotation} {
		if was.Annotations[k] != now.Annotations[k] {
			return true
		}
	}
	return false
}
