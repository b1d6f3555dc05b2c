package dataplane

import (
	"net/netip"
	"testing"
)

// The unit-test world, seen from host H:
//
//	VPC 100: subnet 10.1.1.0/24 (bouncer C), 10.1.2.0/24 (bouncer B),
//	         10.1.3.0/24 (bouncers B, C, D), dividers [C]: relays B, C, D and
//	         H (the tests make H forward as a bouncer and a divider).
//	         pods here: pod1 10.1.1.10 (ifindex 1), 10.1.1.11 (ifindex 7),
//	         10.1.2.11 (ifindex 8); remote: 10.1.1.20 on B, 10.1.1.99 on A.
//	VPC 200: subnet 10.1.1.0/24 (bouncer H: this host), dividers [H]: relay H.
//	         pod 10.1.1.20 here (ifindex 9): same IP as VPC 100's remote one;
//	         remote: 10.1.1.99 on A (same IP as in VPC 100), 10.1.1.98 on A.
//
// Droplets: A, B, C, D. A is a plain host: it speaks only for its pods.
const (
	vpc1       = 100
	vpc2       = 200
	unknownVNI = 300
)

var (
	pod1 = PodInterface{
		Ifindex: 1, VNI: vpc1,
		IP: netip.MustParseAddr("10.1.1.10"), MAC: mustMAC("02:aa:00:01:01:10"),
		Subnet:    netip.MustParsePrefix("10.1.1.0/24"),
		GatewayIP: netip.MustParseAddr("10.1.1.1"), GatewayMAC: mustMAC("02:ff:00:01:01:01"),
	}
	epPod1    = Endpoint{VNI: vpc1, IP: pod1.IP, MAC: pod1.MAC, Ifindex: 1}
	epLocal   = Endpoint{VNI: vpc1, IP: netip.MustParseAddr("10.1.1.11"), MAC: mustMAC("02:aa:00:01:01:11"), Ifindex: 7}
	epLocalS2 = Endpoint{VNI: vpc1, IP: netip.MustParseAddr("10.1.2.11"), MAC: mustMAC("02:aa:00:01:02:11"), Ifindex: 8}
	epRemote  = Endpoint{VNI: vpc1, IP: netip.MustParseAddr("10.1.1.20"), MAC: mustMAC("02:aa:00:01:01:20"),
		HostIP: hostB.IP, HostMAC: hostB.MAC}
	// The senders of the underlay tests: pods on host A.
	epFromA  = Endpoint{VNI: vpc1, IP: addr("10.1.1.99"), MAC: remoteMAC, HostIP: hostA.IP, HostMAC: hostA.MAC}
	epFromA2 = Endpoint{VNI: vpc2, IP: addr("10.1.1.99"), MAC: remoteMAC, HostIP: hostA.IP, HostMAC: hostA.MAC}
	epOnlyA2 = Endpoint{VNI: vpc2, IP: addr("10.1.1.98"), MAC: remoteMAC, HostIP: hostA.IP, HostMAC: hostA.MAC}
	epVPC2   = Endpoint{VNI: vpc2, IP: netip.MustParseAddr("10.1.1.20"), MAC: mustMAC("02:bb:00:01:01:20"), Ifindex: 9}

	s3Bouncers = []Hop{hostB, hostC, hostD}

	// A pod on some other host that sends to pods here.
	remoteMAC = mustMAC("02:aa:00:01:01:99")
)

func fixture(tb testing.TB) *Datapath {
	tb.Helper()
	return populate(tb, loadTest(tb))
}

// populate writes the unit-test world into d's maps.
func populate(tb testing.TB, d *Datapath) *Datapath {
	tb.Helper()
	must := func(err error) {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
	}
	must(d.UpsertPodInterface(pod1))
	for _, ep := range []Endpoint{epPod1, epLocal, epLocalS2, epRemote, epVPC2, epFromA, epFromA2, epOnlyA2} {
		must(d.UpsertEndpoint(ep))
	}
	must(d.UpsertSubnet(Subnet{VNI: vpc1, Prefix: netip.MustParsePrefix("10.1.1.0/24"), Bouncers: []Hop{hostC}}))
	must(d.UpsertSubnet(Subnet{VNI: vpc1, Prefix: netip.MustParsePrefix("10.1.2.0/24"), Bouncers: []Hop{hostB}}))
	must(d.UpsertSubnet(Subnet{VNI: vpc1, Prefix: netip.MustParsePrefix("10.1.3.0/24"), Bouncers: s3Bouncers}))
	must(d.UpsertSubnet(Subnet{VNI: vpc2, Prefix: netip.MustParsePrefix("10.1.1.0/24"), Bouncers: []Hop{hostH}}))
	must(d.UpsertVPC(VPC{VNI: vpc1, Dividers: []Hop{hostC}}))
	must(d.UpsertVPC(VPC{VNI: vpc2, Dividers: []Hop{hostH}}))
	for _, h := range []Hop{hostA, hostB, hostC, hostD} {
		must(d.UpsertDroplet(h))
	}
	must(d.SetRelays(vpc1, []netip.Addr{hostB.IP, hostC.IP, hostD.IP, hostH.IP}))
	must(d.SetRelays(vpc2, []netip.Addr{hostH.IP}))
	return d
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }
