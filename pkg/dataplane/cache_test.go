package dataplane

import (
	"testing"
	"time"
)

// The programs' per-CPU flow caches never outlive what they were decided
// from: each case sends a flow's packet twice (the second one is served from
// the cache), changes a map through the API, and expects the next packet to
// follow the change.

func TestFlowCacheFollowsEndpointMoves(t *testing.T) {
	d := fixture(t)
	// Bouncer path: A's pod to 10.1.1.20, which lives on B.
	in := podPacket("10.1.1.20").frame(t)
	for range 2 {
		expectVerdict(t, d.UnderlayProgram(), fromA(vpc1).geneve(t, in), xdpTX, fromA(vpc1).toward(hostB).geneve(t, in))
	}
	// Pod side: pod1 straight to the endpoint's host.
	p := fromPod1(epRemote.IP.String())
	innerOut := withMACs(p.frame(t), epRemote.MAC, nil)
	// (The first packet introduces pod1 there, see TestPodEncapDirect.)
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, encapTo(hostB, p, vpc1).geneve(t, innerOut))
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, encapTo(hostB, p, vpc1).direct().geneve(t, innerOut))

	moved := epRemote
	moved.HostIP, moved.HostMAC = hostD.IP, hostD.MAC
	must(t, d.UpsertEndpoint(moved))
	expectVerdict(t, d.UnderlayProgram(), fromA(vpc1).geneve(t, in), xdpTX, fromA(vpc1).toward(hostD).geneve(t, in))
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, encapTo(hostD, p, vpc1).geneve(t, innerOut))

	// Gone: the pod side sends it to the subnet's bouncer (C) instead.
	must(t, d.DeleteEndpoint(vpc1, epRemote.IP))
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, encapTo(hostC, p, vpc1).geneve(t, p.frame(t)))
}

func TestFlowCacheFollowsTrustAndPods(t *testing.T) {
	d := fixture(t)
	in := podPacket("10.1.1.10").frame(t)
	for range 2 {
		expectVerdict(t, d.UnderlayProgram(), fromA(vpc1).geneve(t, in), xdpRedirect, nil)
	}
	must(t, d.DeleteDroplet(hostA.IP))
	delta := counterDelta(t, d)
	expectVerdict(t, d.UnderlayProgram(), fromA(vpc1).geneve(t, in), xdpDrop, nil)
	expectCounts(t, delta().Underlay, "rx", "drop_not_droplet")
	must(t, d.UpsertDroplet(hostA))
	expectVerdict(t, d.UnderlayProgram(), fromA(vpc1).geneve(t, in), xdpRedirect, nil)

	// The pod's description is cached too.
	p := fromPod1(epLocal.IP.String())
	for range 2 {
		expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, nil)
	}
	must(t, d.DeletePodInterface(pod1.Ifindex))
	delta = counterDelta(t, d)
	expectVerdict(t, d.PodProgram(), p.frame(t), tcShot, nil)
	expectCounts(t, delta().Pod, "drop_no_config")
}

// The program's own learning empties the caches too: a flow that found
// nothing learned about its destination sees the host a relay teaches.
func TestFlowCacheSeesLearning(t *testing.T) {
	d := fixture(t)
	p := fromPod1("10.1.1.50")
	bounced := encapTo(hostC, p, vpc1).geneve(t, p.frame(t))
	for range 2 {
		expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, bounced)
	}
	expectVerdict(t, d.UnderlayProgram(), stampedFrom(t, hostC, hostA.IP, "10.1.1.50", "10.1.1.10"), xdpRedirect, nil)
	delta := counterDelta(t, d)
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, bounced)
	expectCounts(t, delta().Pod, "introduce")
	time.Sleep(10 * time.Millisecond)
	delta = counterDelta(t, d)
	for range 2 {
		expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, nil)
	}
	expectCounts(t, delta().Pod, "encap_learned", "encap_learned")
	// Forgotten: back through the bouncer at once, cached direct path or not.
	must(t, d.ForgetLearned(vpc1, addr("10.1.1.50")))
	expectVerdict(t, d.PodProgram(), p.frame(t), tcRedirect, bounced)
}
