package dataplane

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// BenchmarkServices: what the Service translation costs per packet
// (BPF_PROG_TEST_RUN, as BenchmarkPrograms), interleaved round by round
// against the same path with Services compiled out (x-off):
//
//	off        Options.Services false (the default): compiled out
//	on-empty   compiled in, no Service programmed: one array lookup
//	on-1       compiled in, one Service: pod-to-pod traffic pays the
//	           frontend lookup and the reply check (svc_ct)
//	service    a packet of an established connection to the Service
//	           (DNAT to a pod of this host), against off's same-host path
func BenchmarkServices(b *testing.B) {
	off := fixture(b)
	onEmpty := svcFixture(b)
	on1 := svcFixture(b)
	must(b, on1.UpsertService(Service{Frontend: Frontend{VIP: vip1, Port: 80, Proto: TCP},
		Backends: []netip.AddrPort{netip.AddrPortFrom(epLocal.IP, 7000)}}))
	toVIP := fromPod1(vip1.String())
	toVIP.dport = 80
	cases := []struct {
		name  string
		frame []byte
		prog  *ebpf.Program // the measured one; off's same-host path is the reference
	}{
		{"pod/same-host/on-empty", fromPod1(epLocal.IP.String()).frame(b), onEmpty.PodProgram()},
		{"pod/same-host/on-1", fromPod1(epLocal.IP.String()).frame(b), on1.PodProgram()},
		{"pod/encap-bouncer/on-empty", fromPod1("10.1.1.30").frame(b), onEmpty.PodProgram()},
		{"pod/encap-bouncer/on-1", fromPod1("10.1.1.30").frame(b), on1.PodProgram()},
		{"pod/service-established", toVIP.frame(b), on1.PodProgram()},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			ref := c.frame
			if c.name == "pod/service-established" {
				ref = fromPod1(epLocal.IP.String()).frame(b)
			}
			if ret, _ := run(b, c.prog, c.frame); ret != tcRedirect {
				b.Fatalf("verdict %s: not the path this case measures", verdictName(c.prog, ret))
			}
			var progT, offT []time.Duration
			for b.Loop() {
				progT = append(progT, benchOnce(b, c.prog, c.frame))
				offT = append(offT, benchOnce(b, off.PodProgram(), ref))
			}
			per, base := midMean(progT), midMean(offT)
			b.ReportMetric(per, "ns/op")
			b.ReportMetric(base, "off-ns")
			b.ReportMetric(per/base, "x-off")
		})
	}
}
