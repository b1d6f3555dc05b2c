package dataplane

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// BenchmarkDropEvents: what drop events cost. Every path runs through the
// programs of three datapaths holding the same maps, interleaved round by
// round (BPF_PROG_TEST_RUN, as BenchmarkPrograms): drop events off (the
// counter-only drop, the baseline), on at their default budget (what a
// flood of drops meets: one report a jiffy per CPU, the rest only
// counted), and on with a budget no run exhausts (every drop reported:
// the cost of one report, which the budget bounds to a few hundred a second
// per CPU). A reader drains the rings as the agent does. x-no-events is the
// ratio to the counter-only program: the goal is <= 1.1 for the drops at
// the default budget and 1.0 (noise) for the delivery paths, where nothing
// of the events runs.
func BenchmarkDropEvents(b *testing.B) {
	load := func(burst int) *Datapath {
		requireRoot(b)
		d, err := Load(Options{PinRoot: testPinRoot(b), UnderlayIfindex: 1, HostIP: hostH.IP, HostMAC: hostH.MAC, UnderlayMTU: 1500,
			DropEventBurst: burst})
		must(b, err)
		b.Cleanup(func() { _ = d.Close() })
		return populate(b, d)
	}
	off, on, every := load(-1), load(0), load(1<<16)
	var reports, everyReports atomic.Int64
	for _, d := range []*Datapath{on, every} {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		n := &reports
		if d == every {
			n = &everyReports
		}
		go func() { done <- d.ReadDropEvents(ctx, func(DropEvent) { n.Add(1) }) }()
		b.Cleanup(func() {
			cancel()
			must(b, <-done)
		})
	}
	spoof := fromPod1("10.1.1.20")
	spoof.src = addr("10.1.1.66")
	macSpoof := fromPod1("10.1.1.20")
	macSpoof.srcMAC = remoteMAC
	stranger := fromA(vpc1)
	stranger.src = addr("198.18.0.99")
	cases := []struct {
		name    string
		prog    func(*Datapath) *ebpf.Program
		frame   []byte
		verdict uint32
	}{
		{"underlay/drop-unknown-vni", (*Datapath).UnderlayProgram, fromA(unknownVNI).geneve(b, podPacket("10.1.1.10").frame(b)), xdpDrop},
		{"underlay/drop-not-droplet", (*Datapath).UnderlayProgram, stranger.geneve(b, podPacket("10.1.1.10").frame(b)), xdpDrop},
		{"underlay/drop-unknown-dst", (*Datapath).UnderlayProgram, fromA(vpc2).geneve(b, podPacket("10.1.1.77").frame(b)), xdpDrop},
		{"pod/drop-spoof", (*Datapath).PodProgram, spoof.frame(b), tcShot},
		{"pod/drop-mac-spoof", (*Datapath).PodProgram, macSpoof.frame(b), tcShot},
		{"underlay/decap-deliver", (*Datapath).UnderlayProgram, fromA(vpc1).geneve(b, podPacket("10.1.1.10").frame(b)), xdpRedirect},
		{"underlay/bouncer", (*Datapath).UnderlayProgram, fromA(vpc1).geneve(b, podPacket("10.1.1.20").frame(b)), xdpTX},
		{"pod/encap-bouncer", (*Datapath).PodProgram, fromPod1("10.1.1.30").frame(b), tcRedirect},
		{"pod/same-host", (*Datapath).PodProgram, fromPod1(epLocal.IP.String()).frame(b), tcRedirect},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			for _, d := range []*Datapath{off, on, every} {
				if ret, _ := run(b, c.prog(d), c.frame); ret != c.verdict {
					b.Fatalf("verdict %s, want %s: not the path this case measures", verdictName(c.prog(d), ret), verdictName(c.prog(d), c.verdict))
				}
			}
			before, everyBefore := reports.Load(), everyReports.Load()
			start := time.Now()
			var offT, onT, everyT []time.Duration
			// Each of the three goes first, second and third in turn: the
			// position in a round costs something of its own.
			progs := []*ebpf.Program{c.prog(off), c.prog(on), c.prog(every)}
			times := []*[]time.Duration{&offT, &onT, &everyT}
			round := 0
			for b.Loop() {
				for i := range 3 {
					k := (round + i) % 3
					*times[k] = append(*times[k], benchOnce(b, progs[k], c.frame))
				}
				round++
			}
			took := time.Since(start)
			base, def, all := midMean(offT), midMean(onT), midMean(everyT)
			b.ReportMetric(def, "ns/op")
			b.ReportMetric(base, "no-events-ns")
			b.ReportMetric(def/base, "x-no-events")
			b.ReportMetric(all, "every-drop-reported-ns")
			b.ReportMetric(all/base, "every-drop-reported-x-no-events")
			time.Sleep(2 * DropEventPoll) // the readers catch up
			b.ReportMetric(float64(reports.Load()-before)/took.Seconds(), "reports/s")
			b.ReportMetric(float64(everyReports.Load()-everyBefore)/took.Seconds(), "every-drop-reports/s")
		})
	}
}
