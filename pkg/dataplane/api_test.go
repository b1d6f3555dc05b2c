package dataplane

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/safchain/ethtool"
	"github.com/vishvananda/netlink"
)

func TestMapsRoundTrip(t *testing.T) {
	d := loadTest(t)

	routed := Endpoint{VNI: vpc1, IP: addr("10.1.9.9"), MAC: remoteMAC, HostIP: addr("198.18.9.9")}
	eps := []Endpoint{epPod1, epRemote, epVPC2, routed}
	for _, ep := range eps {
		must(t, d.UpsertEndpoint(ep))
	}
	got, err := d.Endpoints()
	must(t, err)
	sortEndpoints(got)
	want := slices.Clone(eps)
	sortEndpoints(want)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("endpoints\n got %+v\nwant %+v", got, want)
	}

	sn := Subnet{VNI: vpc1, Prefix: netip.MustParsePrefix("10.1.0.0/16"), Bouncers: []Hop{hostA, hostB}}
	must(t, d.UpsertSubnet(sn))
	subnets, err := d.Subnets()
	must(t, err)
	if !reflect.DeepEqual(subnets, []Subnet{sn}) {
		t.Fatalf("subnets %+v, want %+v", subnets, sn)
	}

	// A divider behind a router has no MAC: the FIB finds its next hop.
	vpc := VPC{VNI: vpc2, Dividers: []Hop{hostC, {IP: addr("198.18.9.9")}}}
	must(t, d.UpsertVPC(vpc))
	vpcs, err := d.VPCs()
	must(t, err)
	if !reflect.DeepEqual(vpcs, []VPC{vpc}) {
		t.Fatalf("vpcs %+v, want %+v", vpcs, vpc)
	}

	must(t, d.UpsertPodInterface(pod1))
	ifs, err := d.PodInterfaces()
	must(t, err)
	if !reflect.DeepEqual(ifs, []PodInterface{pod1}) {
		t.Fatalf("pod interfaces %+v, want %+v", ifs, pod1)
	}

	// A with its MAC (same L2 segment), B behind a router.
	for _, h := range []Hop{hostA, {IP: hostB.IP}} {
		must(t, d.UpsertDroplet(h))
	}
	drops, err := d.Droplets()
	must(t, err)
	slices.SortFunc(drops, func(a, b Hop) int { return a.IP.Compare(b.IP) })
	if !reflect.DeepEqual(drops, []Hop{hostA, {IP: hostB.IP}}) {
		t.Fatalf("droplets %v, want A with its MAC and B without", drops)
	}
	// SetRelays replaces one VPC's set and leaves the others alone.
	must(t, d.SetRelays(vpc1, []netip.Addr{hostA.IP, hostB.IP}))
	must(t, d.SetRelays(vpc2, []netip.Addr{hostC.IP}))
	must(t, d.SetRelays(vpc1, []netip.Addr{hostB.IP, hostD.IP}))
	relays, err := d.Relays()
	must(t, err)
	for _, ips := range relays {
		slices.SortFunc(ips, netip.Addr.Compare)
	}
	if want := map[uint32][]netip.Addr{vpc1: {hostB.IP, hostD.IP}, vpc2: {hostC.IP}}; !reflect.DeepEqual(relays, want) {
		t.Fatalf("relays %v, want %v", relays, want)
	}

	// Deletes are idempotent.
	for i := 0; i < 2; i++ {
		must(t, d.DeleteDroplet(hostA.IP))
		must(t, d.SetRelays(vpc1, nil))
		must(t, d.DeleteEndpoint(epRemote.VNI, epRemote.IP))
		must(t, d.DeleteSubnet(sn.VNI, sn.Prefix))
		must(t, d.DeleteVPC(vpc.VNI))
		must(t, d.DeletePodInterface(pod1.Ifindex))
	}
	got, err = d.Endpoints()
	must(t, err)
	subnets, _ = d.Subnets()
	vpcs, _ = d.VPCs()
	ifs, _ = d.PodInterfaces()
	drops, _ = d.Droplets()
	relays, _ = d.Relays()
	if len(drops) != 1 || len(relays) != 1 {
		t.Fatalf("after deletes: droplets %v, relays %v; want B and VPC %d's", drops, relays, vpc2)
	}
	if len(got) != 3 || len(subnets)+len(vpcs)+len(ifs) != 0 {
		t.Fatalf("after deletes: %d endpoints, %d subnets, %d vpcs, %d pod interfaces", len(got), len(subnets), len(vpcs), len(ifs))
	}
}

func sortEndpoints(eps []Endpoint) {
	slices.SortFunc(eps, func(a, b Endpoint) int {
		if a.VNI != b.VNI {
			return int(a.VNI) - int(b.VNI)
		}
		return a.IP.Compare(b.IP)
	})
}

func TestMapInputValidation(t *testing.T) {
	d := loadTest(t)
	v6 := netip.MustParseAddr("fd00::1")
	tooMany := make([]Hop, MaxHops+1)
	for i := range tooMany {
		tooMany[i] = hostA
	}
	badPod := pod1
	badPod.IP = addr("10.9.9.9")
	mcastPod := pod1
	mcastPod.MAC = mustMAC("03:00:00:00:00:01")
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"VNI 0", d.UpsertEndpoint(Endpoint{VNI: 0, IP: epRemote.IP, MAC: epRemote.MAC, HostIP: hostB.IP, HostMAC: hostB.MAC}), "VNI 0"},
		{"VNI too big", d.UpsertVPC(VPC{VNI: MaxVNI + 1}), "out of range"},
		{"IPv6 endpoint", d.UpsertEndpoint(Endpoint{VNI: 1, IP: v6, MAC: remoteMAC, HostIP: hostB.IP, HostMAC: hostB.MAC}), "not an IPv4"},
		{"remote endpoint without host", d.UpsertEndpoint(Endpoint{VNI: 1, IP: addr("10.0.0.1"), MAC: remoteMAC}), "host IP"},
		{"short MAC", d.UpsertEndpoint(Endpoint{VNI: 1, IP: addr("10.0.0.1"), MAC: net.HardwareAddr{1, 2}, Ifindex: 3}), "6-byte"},
		{"zero MAC", d.UpsertEndpoint(Endpoint{VNI: 1, IP: addr("10.0.0.1"), MAC: make(net.HardwareAddr, 6), Ifindex: 3}), "all zeros"},
		{"negative ifindex", d.UpsertEndpoint(Endpoint{VNI: 1, IP: addr("10.0.0.1"), MAC: remoteMAC, Ifindex: -1}), "negative"},
		{"prefix with host bits", d.UpsertSubnet(Subnet{VNI: 1, Prefix: netip.MustParsePrefix("10.1.1.5/24")}), "host bits"},
		{"IPv6 prefix", d.UpsertSubnet(Subnet{VNI: 1, Prefix: netip.MustParsePrefix("fd00::/64")}), "not an IPv4 prefix"},
		{"too many bouncers", d.UpsertSubnet(Subnet{VNI: 1, Prefix: netip.MustParsePrefix("10.1.0.0/16"), Bouncers: tooMany}), "at most 16"},
		{"divider with a short MAC", d.UpsertVPC(VPC{VNI: 1, Dividers: []Hop{{IP: hostA.IP, MAC: net.HardwareAddr{1}}}}), "hop MAC"},
		{"pod IP outside its subnet", d.UpsertPodInterface(badPod), "outside its subnet"},
		{"pod ifindex 0", d.UpsertPodInterface(PodInterface{}), "ifindex 0"},
		{"multicast pod MAC", d.UpsertPodInterface(mcastPod), "multicast"},
		{"IPv6 droplet", d.UpsertDroplet(Hop{IP: v6}), "not an IPv4"},
		{"zero droplet MAC", d.UpsertDroplet(Hop{IP: hostA.IP, MAC: make(net.HardwareAddr, 6)}), "all zeros"},
		{"broadcast droplet", d.UpsertDroplet(Hop{IP: addr("255.255.255.255")}), "not a unicast"},
		{"loopback droplet", d.UpsertDroplet(Hop{IP: addr("127.0.0.1")}), "not a unicast"},
		{"multicast droplet", d.UpsertDroplet(Hop{IP: addr("224.0.0.1")}), "not a unicast"},
		{"0/8 droplet", d.UpsertDroplet(Hop{IP: addr("0.1.2.3")}), "not a unicast"},
		{"droplet 0.0.0.0", d.DeleteDroplet(netip.IPv4Unspecified()), "0.0.0.0"},
		{"relays of VNI 0", d.SetRelays(0, nil), "VNI 0"},
		{"relay not IPv4", d.SetRelays(vpc1, []netip.Addr{hostA.IP, v6}), "not an IPv4"},
	}
	for _, c := range cases {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: error %v, want one mentioning %q", c.name, c.err, c.want)
		}
	}
}

func TestLoadRejectsBadOptions(t *testing.T) {
	requireRoot(t)
	good := Options{PinRoot: "/sys/fs/bpf/mizar-test-unused", UnderlayIfindex: 1, HostIP: hostH.IP, HostMAC: hostH.MAC}
	tmp := t.TempDir()
	for _, c := range []struct {
		name   string
		mutate func(*Options)
		want   string
	}{
		{"relative pin root", func(o *Options) { o.PinRoot = "mizar" }, "absolute"},
		{"pin root off bpffs", func(o *Options) { o.PinRoot = tmp }, "not on bpffs"},
		{"no underlay", func(o *Options) { o.UnderlayIfindex = 0 }, "underlay ifindex"},
		{"IPv6 host", func(o *Options) { o.HostIP = netip.MustParseAddr("fd00::1") }, "host IP"},
		{"no host MAC", func(o *Options) { o.HostMAC = nil }, "host MAC"},
		{"bad XDP mode", func(o *Options) { o.XDPMode = 7 }, "XDP mode"},
	} {
		o := good
		c.mutate(&o)
		if _, err := Load(o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one mentioning %q", c.name, err, c.want)
		}
	}
	if _, err := os.Stat(good.PinRoot); err == nil {
		t.Errorf("a rejected Load left %s behind", good.PinRoot)
	}
	if err := Purge(tmp); err == nil || !strings.Contains(err.Error(), "not on bpffs") {
		t.Errorf("Purge of a non-bpffs directory: %v, want a refusal", err)
	}
}

func TestCounterNamesCoverEnums(t *testing.T) {
	d := loadTest(t)
	c, err := d.Counters()
	must(t, err)
	if len(c.Underlay) != int(mizarUnderlayCounterUL_MAX) || len(c.Pod) != int(mizarPodCounterPOD_MAX) {
		t.Fatalf("%d underlay and %d pod counters, want %d and %d", len(c.Underlay), len(c.Pod),
			mizarUnderlayCounterUL_MAX, mizarPodCounterPOD_MAX)
	}
	for _, name := range []string{"pass", "deliver", "fwd_endpoint", "drop_unknown_vni"} {
		if _, ok := c.Underlay[name]; !ok {
			t.Errorf("underlay counter %q missing from %v", name, c.Underlay)
		}
	}
	for _, name := range []string{"encap", "local", "arp_reply", "drop_spoof"} {
		if _, ok := c.Pod[name]; !ok {
			t.Errorf("pod counter %q missing from %v", name, c.Pod)
		}
	}
}

func TestPodMTU(t *testing.T) {
	if mtu, err := PodMTU(1500); err != nil || mtu != 1450 {
		t.Errorf("PodMTU(1500) = %d, %v; want 1450", mtu, err)
	}
	if mtu, err := PodMTU(9000); err != nil || mtu != 8950 {
		t.Errorf("PodMTU(9000) = %d, %v; want 8950", mtu, err)
	}
	if _, err := PodMTU(100); err == nil {
		t.Error("PodMTU(100) succeeded; 50 bytes cannot carry IPv4")
	}
}

// Attach, reload (update in place), interface recreated, GC, detach: all on
// veths inside a private netns.
func TestAttachLifecycle(t *testing.T) {
	requireRoot(t)
	n := newNetNS(t, "mzt-"+randSuffix(t)+"-lc")
	for _, name := range []string{"u0", "h0"} {
		must(t, n.nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}))
	}
	index := func(name string) int {
		l, err := n.nl.LinkByName(name)
		must(t, err)
		return l.Attrs().Index
	}
	root := testPinRoot(t)
	load := func() *Datapath {
		d, err := Load(Options{PinRoot: root, UnderlayIfindex: index("u0"), HostIP: hostH.IP, HostMAC: hostH.MAC})
		must(t, err)
		t.Cleanup(func() { _ = d.Close() })
		return d
	}
	progID := func(d *Datapath, prog string) uint32 {
		p := d.PodProgram()
		if prog == underlayPin {
			p = d.UnderlayProgram()
		}
		info, err := p.Info()
		must(t, err)
		id, _ := info.ID()
		return uint32(id)
	}
	links := func(d *Datapath) map[string]AttachedLink {
		ls, err := d.Links()
		must(t, err)
		m := map[string]AttachedLink{}
		for _, l := range ls {
			m[l.Ifname+"/"+l.Program] = l
		}
		return m
	}

	d1 := load()
	must(t, d1.UpsertPodInterface(PodInterface{Ifindex: index("h0"), VNI: vpc1, IP: pod1.IP, MAC: pod1.MAC,
		Subnet: pod1.Subnet, GatewayIP: pod1.GatewayIP, GatewayMAC: pod1.GatewayMAC}))
	must(t, d1.UpsertEndpoint(Endpoint{VNI: vpc1, IP: pod1.IP, MAC: pod1.MAC, Ifindex: index("h0")}))
	must(t, d1.UpsertEndpoint(epRemote))
	n.do(t, func() error { return d1.AttachUnderlay("u0") })
	// An earlier mizar attached pods through tcx, with a pinned link: the
	// filter replaces it.
	n.do(t, func() error {
		l, err := link.AttachTCX(link.TCXOptions{Program: d1.PodProgram(), Interface: index("h0"), Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return err
		}
		defer l.Close()
		must(t, os.MkdirAll(filepath.Join(root, linksDir, "h0"), 0o700))
		return l.Pin(filepath.Join(root, linksDir, "h0", podPin))
	})
	if ls := links(d1); len(ls) != 2 {
		t.Fatalf("links before AttachPod: %+v, want the underlay's and an old tcx one", ls)
	}
	must(t, d1.AttachPodAt(n.nl, "h0"))
	podProg := func(d *Datapath) uint32 {
		id, ok, err := d.PodProgramOn(n.nl, "h0")
		must(t, err)
		if !ok {
			return 0
		}
		return id
	}
	first := links(d1)
	if len(first) != 1 || first["u0/underlay_xdp"].Ifindex != index("u0") || first["u0/underlay_xdp"].ProgID != progID(d1, underlayPin) {
		t.Fatalf("links after attach: %+v, want the underlay's only (the old tcx link gone)", first)
	}
	if podProg(d1) != progID(d1, podPin) {
		t.Fatalf("pod filter on h0 runs program %d, want %d", podProg(d1), progID(d1, podPin))
	}
	ul, err := n.nl.LinkByName("u0")
	must(t, err)
	if ul.Attrs().Xdp == nil || !ul.Attrs().Xdp.Attached {
		t.Fatal("no XDP program on u0 after AttachUnderlay")
	}

	// Attaching to an interface that does not exist names it.
	n.do(t, func() error {
		if err := d1.AttachPod("nope0"); err == nil || !strings.Contains(err.Error(), "nope0") {
			t.Errorf("attach to a missing interface: %v", err)
		}
		return nil
	})

	// A restarted agent: same pins, new programs, same links.
	must(t, d1.Close())
	d2 := load()
	n.do(t, func() error { return d2.AttachUnderlay("u0") })
	must(t, d2.AttachPodAt(n.nl, "h0"))
	second := links(d2)
	for k, l := range first {
		if second[k].LinkID != l.LinkID {
			t.Errorf("%s: link %d replaced by %d, want an in-place update", k, l.LinkID, second[k].LinkID)
		}
	}
	if second["u0/underlay_xdp"].ProgID != progID(d2, underlayPin) || podProg(d2) != progID(d2, podPin) {
		t.Errorf("still the old programs: links %+v, pod filter %d", second, podProg(d2))
	}
	hl, err := n.nl.LinkByName("h0")
	must(t, err)
	if fs, err := n.nl.FilterList(hl, netlink.HANDLE_MIN_INGRESS); err != nil || len(fs) != 1 {
		t.Errorf("filters on h0 after the restart: %v %v, want one (replaced in place)", fs, err)
	}
	eps, err := d2.Endpoints()
	must(t, err)
	if len(eps) != 2 {
		t.Errorf("maps lost on reload: %d endpoints, want 2", len(eps))
	}

	// The pod's veth goes away and comes back under the same name: the old
	// link is defunct and gets replaced.
	h0, err := n.nl.LinkByName("h0")
	must(t, err)
	must(t, n.nl.LinkDel(h0))
	must(t, n.nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "h0"}, PeerName: "h0p"}))
	if podProg(d2) != 0 {
		t.Error("a new h0 has a pod filter before AttachPod")
	}
	n.do(t, func() error { return d2.AttachPod("h0") })
	if podProg(d2) != progID(d2, podPin) {
		t.Errorf("recreated h0: pod filter runs %d, want %d", podProg(d2), progID(d2, podPin))
	}

	// GC with only the underlay valid: h0's pin, interface entry and local
	// endpoint go; the underlay and remote endpoints stay.
	n.do(t, func() error { return d2.GC([]string{"u0"}) })
	after := links(d2)
	if len(after) != 1 {
		t.Errorf("links after GC: %+v, want only u0's", after)
	}
	ifs, err := d2.PodInterfaces()
	must(t, err)
	eps, err = d2.Endpoints()
	must(t, err)
	if len(ifs) != 0 || len(eps) != 1 || eps[0].IP != epRemote.IP {
		t.Errorf("after GC: pod interfaces %+v, endpoints %+v; want none and only the remote one", ifs, eps)
	}

	// DetachPodAt: the filter goes; again is no error, nor a missing device.
	must(t, d2.DetachPodAt(n.nl, "h0"))
	must(t, d2.DetachPodAt(n.nl, "h0"))
	must(t, d2.DetachPodAt(n.nl, "nope0"))
	if podProg(d2) != 0 {
		t.Error("pod filter still on h0 after DetachPodAt")
	}

	// Detach: the program leaves the device, the pin directory goes.
	must(t, d2.Detach("u0"))
	must(t, d2.Detach("u0")) // idempotent
	ul, err = n.nl.LinkByName("u0")
	must(t, err)
	if ul.Attrs().Xdp != nil && ul.Attrs().Xdp.Attached {
		t.Error("XDP program still on u0 after Detach")
	}
	if ls, _ := d2.Links(); len(ls) != 0 {
		t.Errorf("links after Detach: %+v", ls)
	}
}

func TestEnableGRO(t *testing.T) {
	requireRoot(t)
	n := newNetNS(t, "mzt-"+randSuffix(t)+"-gro")
	must(t, n.nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "v0"}, PeerName: "v1"}))
	must(t, EnableGROInNetns(n.path(), "v0"))
	n.do(t, func() error {
		e, err := ethtool.NewEthtool()
		if err != nil {
			return err
		}
		defer e.Close()
		f, err := e.Features("v0")
		if err != nil {
			return err
		}
		if !f["rx-gro"] {
			t.Error("rx-gro still off")
		}
		if err := SetFeatures("v0", map[string]bool{"no-such-feature": true}); err == nil {
			t.Error("SetFeatures accepted an unknown feature")
		}
		return nil
	})
	if err := EnableGROInNetns("/run/netns/mzt-does-not-exist", "v0"); err == nil {
		t.Error("EnableGROInNetns succeeded in a missing netns")
	}
}
