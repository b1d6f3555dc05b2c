package dataplane

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"

	"mizar.dev/pkg/dataplane/maglev"
)

// loadSvcTest is loadTest with the Service translation compiled in.
func loadSvcTest(tb testing.TB, root string) *Datapath {
	tb.Helper()
	requireRoot(tb)
	d, err := Load(Options{PinRoot: root, UnderlayIfindex: 1, HostIP: hostH.IP, HostMAC: hostH.MAC, UnderlayMTU: 1500,
		Services: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = d.Close() })
	return d
}

func svcFixture(tb testing.TB) *Datapath {
	tb.Helper()
	requireRoot(tb)
	return populate(tb, loadSvcTest(tb, testPinRoot(tb)))
}

var (
	vip1 = addr("10.96.0.10")
	vip2 = addr("10.96.0.11")
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func TestServiceProgramming(t *testing.T) {
	root := testPinRoot(t)
	d := loadSvcTest(t, root)
	web := Service{Frontend: Frontend{VIP: vip1, Port: 80, Proto: TCP},
		Backends: []netip.AddrPort{ap("10.1.1.11:7000"), ap("10.1.1.12:7000")}}
	dns := Service{Frontend: Frontend{VIP: vip2, Port: 53, Proto: UDP}, Backends: []netip.AddrPort{ap("10.1.1.12:5353")}}
	must(t, d.UpsertService(web))
	must(t, d.UpsertService(dns))
	ids, bids, err := d.serviceIDs()
	must(t, err)
	if len(ids) != 2 || ids[web.Frontend] == ids[dns.Frontend] || len(bids) != 3 {
		t.Fatalf("ids %v, backend ids %v: want 2 Services, 3 distinct backends", ids, bids)
	}

	// The Maglev table in the map is the builder's, in backend ids.
	table, err := d.readMaglev(ids[web.Frontend])
	must(t, err)
	want, err := maglev.Table([]string{"10.1.1.11:7000", "10.1.1.12:7000"}, MaglevTableSize)
	must(t, err)
	order := []netip.AddrPort{ap("10.1.1.11:7000"), ap("10.1.1.12:7000")}
	for s := range table {
		if table[s] != bids[order[want[s]]] {
			t.Fatalf("slot %d names backend id %d, want %d (%s)", s, table[s], bids[order[want[s]]], order[want[s]])
		}
	}

	// The port filter names the frontends' and the backends' ports.
	expectPortBits(t, d, map[uint16]string{80: "frontend", 53: "frontend", 7000: "backend", 5353: "backend"})

	// A third backend: the others keep their ids.
	web.Backends = append(web.Backends, ap("10.1.1.13:7000"))
	must(t, d.UpsertService(web))
	ids2, bids2, err := d.serviceIDs()
	must(t, err)
	for f, id := range ids {
		if ids2[f] != id {
			t.Errorf("Service %s moved from id %d to %d", f, id, ids2[f])
		}
	}
	for b, id := range bids {
		if bids2[b] != id {
			t.Errorf("backend %s moved from id %d to %d", b, id, bids2[b])
		}
	}

	// A restarted agent reads the ids back from the pins.
	d2 := loadSvcTest(t, root)
	ids3, bids3, err := d2.serviceIDs()
	must(t, err)
	if !mapsEqual(ids2, ids3) || !mapsEqual(bids2, bids3) {
		t.Fatalf("after reload: ids %v / %v, backend ids %v / %v", ids3, ids2, bids3, bids2)
	}
	got, err := d2.Services()
	must(t, err)
	if len(got) != 2 || !slices.Equal(got[0].Backends, web.Backends) || !slices.Equal(got[1].Backends, dns.Backends) {
		t.Fatalf("Services() = %+v, want %+v and %+v", got, web, dns)
	}

	// A resync without dns: dns and the backend only it used are gone.
	must(t, d2.SetServices([]Service{web}))
	ids4, bids4, err := d2.serviceIDs()
	must(t, err)
	if len(ids4) != 1 || ids4[web.Frontend] != ids[web.Frontend] {
		t.Fatalf("after resync ids %v", ids4)
	}
	if _, ok := bids4[ap("10.1.1.12:5353")]; ok || len(bids4) != 3 {
		t.Fatalf("after resync backend ids %v: want dns's backend removed", bids4)
	}
	var n int
	var bid uint32
	var bv mizarSvcBackend
	for it := d2.objs.SvcBackends.Iterate(); it.Next(&bid, &bv); {
		n++
	}
	var info mizarSvcInfo
	must(t, d2.objs.SvcState.Lookup(uint32(0), &info))
	if n != 3 || info.Nfrontends != 1 {
		t.Fatalf("maps hold %d backends and count %d frontends, want 3 and 1", n, info.Nfrontends)
	}

	// Removing a backend frees its id; deleting the last Service leaves
	// the maps empty.
	web.Backends = web.Backends[1:]
	must(t, d2.UpsertService(web))
	must(t, d2.DeleteService(web.Frontend))
	got, err = d2.Services()
	must(t, err)
	_, bids5, err := d2.serviceIDs()
	must(t, err)
	must(t, d2.objs.SvcState.Lookup(uint32(0), &info))
	if len(got) != 0 || len(bids5) != 0 || info.Nfrontends != 0 {
		t.Fatalf("after delete: Services %v, backend ids %v, count %d", got, bids5, info.Nfrontends)
	}
	expectPortBits(t, d2, map[uint16]string{})
}

// expectPortBits checks svc_ports holds exactly the given ports' bits.
func expectPortBits(t *testing.T, d *Datapath, want map[uint16]string) {
	t.Helper()
	got := map[uint16]string{}
	var w uint32
	var b mizarSvcPortBits
	for it := d.objs.SvcPorts.Iterate(); it.Next(&w, &b); {
		for i := range uint32(32) {
			port := uint16(w*32 + i)
			if b.Frontend>>i&1 != 0 {
				got[port] += "frontend"
			}
			if b.Backend>>i&1 != 0 {
				got[port] += "backend"
			}
		}
	}
	if !maps.Equal(got, want) {
		t.Fatalf("svc_ports holds %v, want %v", got, want)
	}
}

func TestServiceRefused(t *testing.T) {
	d := loadSvcTest(t, testPinRoot(t))
	for name, s := range map[string]Service{
		"IPv6 VIP":          {Frontend: Frontend{VIP: addr("fd00::1"), Port: 80, Proto: TCP}},
		"port 0":            {Frontend: Frontend{VIP: vip1, Port: 0, Proto: TCP}},
		"SCTP":              {Frontend: Frontend{VIP: vip1, Port: 80, Proto: 132}},
		"backend port":      {Frontend: Frontend{VIP: vip1, Port: 80, Proto: TCP}, Backends: []netip.AddrPort{ap("10.1.1.1:0")}},
		"affinity under 1s": {Frontend: Frontend{VIP: vip1, Port: 80, Proto: TCP}, AffinityTimeout: 500 * time.Millisecond},
	} {
		if err := d.UpsertService(s); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if got, err := d.Services(); err != nil || len(got) != 0 {
		t.Fatalf("refused Services left %v, %v", got, err)
	}
}

func mapsEqual[K comparable](a, b map[K]uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// A pod's packet to a Service is translated to the backend, checksums
// and all (compared byte for byte with what gopacket computes), then
// routed as a packet to the backend.
func TestPodServiceDNAT(t *testing.T) {
	d := svcFixture(t)
	for _, proto := range []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP} {
		t.Run(proto.String(), func(t *testing.T) {
			p := proto
			f := Frontend{VIP: vip1, Port: 80, Proto: Protocol(p)}
			must(t, d.UpsertService(Service{Frontend: f, Backends: []netip.AddrPort{netip.AddrPortFrom(epLocal.IP, 7000)}}))
			t.Cleanup(func() { must(t, d.DeleteService(f)) })
			in := fromPod1(vip1.String())
			in.proto, in.dport = p, 80
			out := in
			out.dst, out.dport = epLocal.IP, 7000
			delta := counterDelta(t, d)
			expectVerdict(t, d.PodProgram(), in.frame(t), tcRedirect, withMACs(out.frame(t), epLocal.MAC, pod1.GatewayMAC))
			expectCounts(t, delta().Pod, "svc_nat", "local")
		})
	}
}

// The reply path, in one pod: pod1 reaching itself through a Service
// (hairpin). Its reply from the backend port leaves with the VIP as source.
func TestPodServiceReverseNAT(t *testing.T) {
	d := svcFixture(t)
	f := Frontend{VIP: vip1, Port: 80, Proto: TCP}
	must(t, d.UpsertService(Service{Frontend: f, Backends: []netip.AddrPort{netip.AddrPortFrom(pod1.IP, 7000)}}))
	req := fromPod1(vip1.String())
	req.dport = 80
	expectVerdict(t, d.PodProgram(), req.frame(t), tcRedirect, nil)

	reply := fromPod1(pod1.IP.String())
	reply.sport, reply.dport = 7000, req.sport
	seen := reply
	seen.src, seen.sport = vip1, 80
	delta := counterDelta(t, d)
	// Routed as a packet to its destination (pod1, on-link): no TTL taken,
	// as none was on the way in (decided on the backend's address).
	expectVerdict(t, d.PodProgram(), reply.frame(t), tcRedirect, withMACs(seen.frame(t), pod1.MAC, pod1.GatewayMAC))
	expectCounts(t, delta().Pod, "svc_rev_nat", "local")
}

// A Service without backends drops, counted by reason.
func TestPodServiceNoBackend(t *testing.T) {
	d := svcFixture(t)
	must(t, d.UpsertService(Service{Frontend: Frontend{VIP: vip2, Port: 80, Proto: TCP}}))
	in := fromPod1(vip2.String())
	in.dport = 80
	delta := counterDelta(t, d)
	expectVerdict(t, d.PodProgram(), in.frame(t), tcShot, nil)
	expectCounts(t, delta().Pod, "drop_no_backend")
}

// Other traffic is untouched with Services on, and so is a VIP's other
// port.
func TestPodServiceOtherTraffic(t *testing.T) {
	d := svcFixture(t)
	must(t, d.UpsertService(Service{Frontend: Frontend{VIP: vip1, Port: 80, Proto: TCP},
		Backends: []netip.AddrPort{netip.AddrPortFrom(epLocal.IP, 7000)}}))
	p := fromPod1(epLocal.IP.String())
	delta := counterDelta(t, d)
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, withMACs(p.frame(t), epLocal.MAC, pod1.GatewayMAC))
	expectCounts(t, delta().Pod, "local")

	other := fromPod1(vip1.String())
	other.dport = 81
	ret, _ := run(t, d.PodProgram(), other.frame(t))
	if c := delta().Pod; c["svc_nat"] != 0 {
		t.Fatalf("a packet to the VIP's port 81 was translated (verdict %s, counters %v)", verdictName(d.PodProgram(), ret), c)
	}
}

// Off (the default), the Service maps are one entry each and programming
// is refused; loading with Services on over the same pins replaces them.
func TestServicesOffThenOn(t *testing.T) {
	requireRoot(t)
	root := testPinRoot(t)
	off, err := Load(Options{PinRoot: root, UnderlayIfindex: 1, HostIP: hostH.IP, HostMAC: hostH.MAC})
	must(t, err)
	t.Cleanup(func() { _ = off.Close() })
	if off.objs.SvcCt.MaxEntries() != 1 || off.objs.SvcMaglev.MaxEntries() != 1 {
		t.Fatalf("Services off: svc_ct %d, svc_maglev %d entries, want 1", off.objs.SvcCt.MaxEntries(), off.objs.SvcMaglev.MaxEntries())
	}
	s := Service{Frontend: Frontend{VIP: vip1, Port: 80, Proto: TCP}, Backends: []netip.AddrPort{ap("10.1.1.11:7000")}}
	if err := off.UpsertService(s); !errors.Is(err, errServicesOff) {
		t.Fatalf("UpsertService with Services off: %v, want %v", err, errServicesOff)
	}
	on := loadSvcTest(t, root)
	if got := on.ReplacedMaps(); !slices.Contains(got, "svc_ct") || !slices.Contains(got, "svc_maglev") {
		t.Fatalf("replaced %v, want the shrunk Service maps among them", got)
	}
	if want := uint32(MaglevTableSize * MaxServices); on.objs.SvcMaglev.MaxEntries() != want {
		t.Fatalf("svc_maglev %d entries, want %d", on.objs.SvcMaglev.MaxEntries(), want)
	}
	must(t, on.UpsertService(s))
}

// A thousand Services of three backends each, programmed by one resync
// and then changed by one backend each: how long it takes (logged), and
// that ids stay.
func TestServiceProgrammingThousand(t *testing.T) {
	d := loadSvcTest(t, testPinRoot(t))
	const n = 1000
	mk := func(extra int) []Service {
		all := make([]Service, n)
		for i := range all {
			vip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
			var bs []netip.AddrPort
			for j := range 3 + extra {
				bs = append(bs, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), uint16(8000+j)))
			}
			all[i] = Service{Frontend: Frontend{VIP: vip, Port: 80, Proto: TCP}, Backends: bs}
		}
		return all
	}
	start := time.Now()
	must(t, d.SetServices(mk(0)))
	first := time.Since(start)
	ids, _, err := d.serviceIDs()
	must(t, err)
	start = time.Now()
	must(t, d.SetServices(mk(1)))
	second := time.Since(start)
	ids2, bids2, err := d.serviceIDs()
	must(t, err)
	if !mapsEqual(ids, ids2) || len(ids2) != n || len(bids2) != 4*n {
		t.Fatalf("after the change: %d Services (ids kept: %v), %d backends", len(ids2), mapsEqual(ids, ids2), len(bids2))
	}
	got, err := d.Services()
	must(t, err)
	if len(got) != n || len(got[n-1].Backends) != 4 {
		t.Fatalf("read back %d Services", len(got))
	}
	t.Logf("programmed %d Services x 3 backends in %v, then one more backend each in %v", n, first, second)
}
