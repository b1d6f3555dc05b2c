package dataplane

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
)

// A pod reaches its own node and the node reaches the pod without the
// overlay: the pod program hands traffic to the node's addresses to the host
// stack (to_host), and the host answers through a /32 route over the pod's
// veth (what the agent installs at ADD, here by hand).
func TestPodToHost(t *testing.T) {
	tn := newTestNet(t, []string{"A"}, []podSpec{{"a", "A", vpc1, "10.1.1.10/24"}})
	A, a := tn.hosts["A"], tn.pods["a"]
	tn.loadMizar(t, A)
	must(t, A.dp.SetHostAddrs([]netip.Addr{A.ip}))
	got, err := A.dp.HostAddrs()
	must(t, err)
	if len(got) != 1 || got[0] != A.ip {
		t.Fatalf("host addresses %v, want [%v]", got, A.ip)
	}
	// The gateway the pod's frames are addressed to is the host-side veth
	// (as the CNI server sets it up): the host stack takes them as its own.
	hl, err := A.ns.nl.LinkByName(a.hostIf)
	must(t, err)
	must(t, A.ns.nl.LinkSetHardwareAddr(hl, gatewayMAC))
	must(t, A.ns.nl.NeighSet(&netlink.Neigh{LinkIndex: a.hostIndex, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: a.ip.AsSlice(), HardwareAddr: a.mac}))
	must(t, A.ns.nl.RouteAdd(&netlink.Route{LinkIndex: a.hostIndex, Dst: prefixNet(netip.PrefixFrom(a.ip, 32)),
		Src: A.ip.AsSlice(), Scope: netlink.SCOPE_LINK}))

	delta := counterDelta(t, A.dp)
	if out, ok := a.ping(t, A.ip, 3); !ok {
		t.Fatalf("pod -> its node %v: %s", A.ip, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := A.ns.exec(ctx, "ping", "-n", "-q", "-c", "3", "-i", "0.2", "-W", "1", a.ip.String()); err != nil {
		t.Fatalf("node -> its pod %v: %v: %s", a.ip, err, out)
	}
	c := delta().Pod
	// Echo requests from the pod, echo replies to the node's pings.
	if c["to_host"] < 6 || c["encap"] != 0 {
		t.Errorf("pod counters %v: want >= 6 to_host and nothing encapsulated", c)
	}

	// Another address is not the host's: still the overlay's (no bouncer
	// known here: dropped as an unknown destination, not passed up).
	must(t, A.dp.SetHostAddrs(nil))
	if got, _ := A.dp.HostAddrs(); len(got) != 0 {
		t.Errorf("host addresses after clearing: %v", got)
	}
	if _, ok := a.ping(t, A.ip, 1); ok {
		t.Error("pod reached the node with the node's address not in host_addrs")
	}
}

// A restart over pins of another layout (an earlier mizar's: here a
// pod_stats with fewer counters) replaces those maps and adopts the
// compatible ones with their contents; a pod_ifaces of another layout, which
// nothing could refill, is refused.
func TestLoadReplacesIncompatiblePins(t *testing.T) {
	requireRoot(t)
	root := testPinRoot(t)
	opts := Options{PinRoot: root, UnderlayIfindex: 1, HostIP: hostH.IP, HostMAC: hostH.MAC}
	d, err := Load(opts)
	must(t, err)
	must(t, d.UpsertEndpoint(epRemote))
	must(t, d.UpsertPodInterface(pod1))
	if r := d.ReplacedMaps(); r != nil {
		t.Errorf("fresh pin root: replaced %v", r)
	}
	must(t, d.Close())

	// Swap in an old-layout pod_stats.
	older := func(name string, spec *ebpf.MapSpec) {
		must(t, os.Remove(filepath.Join(root, name)))
		m, err := ebpf.NewMap(spec)
		must(t, err)
		defer m.Close()
		must(t, m.Pin(filepath.Join(root, name)))
	}
	older("pod_stats", &ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 3})
	d, err = Load(opts)
	must(t, err)
	if r := d.ReplacedMaps(); len(r) != 1 || r[0] != "pod_stats" {
		t.Errorf("replaced %v, want [pod_stats]", r)
	}
	eps, err := d.Endpoints()
	must(t, err)
	ifs, err := d.PodInterfaces()
	must(t, err)
	if len(eps) != 1 || len(ifs) != 1 {
		t.Errorf("compatible pins lost their contents: endpoints %v, pod interfaces %v", eps, ifs)
	}
	if _, err := d.Counters(); err != nil {
		t.Errorf("counters of the replaced map: %v", err)
	}
	must(t, d.Close())

	// A compatible restart replaces nothing.
	d, err = Load(opts)
	must(t, err)
	if r := d.ReplacedMaps(); r != nil {
		t.Errorf("compatible restart: replaced %v", r)
	}
	must(t, d.Close())

	older("pod_ifaces", &ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 8, MaxEntries: 16})
	if _, err := Load(opts); err == nil || !strings.Contains(err.Error(), "pod_ifaces") {
		t.Errorf("load over an old pod_ifaces: %v, want an error naming it", err)
	}
}
