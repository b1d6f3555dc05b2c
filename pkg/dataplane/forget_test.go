package dataplane

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ForgetLearnedIn drops what was learned inside one subnet of one VNI, and
// nothing else; the programs refuse the forgotten sources from the next
// packet (issue 18: a host that missed some of a subnet's departures).
func TestForgetLearnedIn(t *testing.T) {
	d := fixture(t)
	prog := d.UnderlayProgram()
	var ts unix.Timespec
	must(t, unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts))
	learn := func(vni uint32, ip string) {
		k, err := endpointKey(vni, addr(ip))
		must(t, err)
		must(t, d.objs.Learned.Put(&k, &mizarLearnedEntry{HostIp: hostA.IP.As4(), Expires: uint64(ts.Nano() + int64(time.Hour))}))
	}
	learn(vpc1, "10.1.1.77")
	learn(vpc1, "10.1.2.77")
	learn(vpc2, "10.1.1.77")
	fromAAs := func(src string) []byte {
		p := podPacket("10.1.1.10")
		p.src = addr(src)
		return fromA(vpc1).geneve(t, p.frame(t))
	}
	expectVerdict(t, prog, fromAAs("10.1.1.77"), xdpRedirect, nil)

	if err := d.ForgetLearnedIn(vpc1, netip.MustParsePrefix("10.1.1.5/24")); err != nil {
		t.Fatal(err)
	}
	left := learnedKeys(t, d)
	if want := []string{"100/10.1.2.77", "200/10.1.1.77"}; !slices.Equal(left, want) {
		t.Fatalf("after forgetting 10.1.1.0/24 of VNI %d: learned %v, want %v", vpc1, left, want)
	}
	delta := counterDelta(t, d)
	expectVerdict(t, prog, fromAAs("10.1.1.77"), xdpDrop, nil)
	expectCounts(t, delta().Underlay, "rx", "drop_src_unknown")
	expectVerdict(t, prog, fromAAs("10.1.2.77"), xdpRedirect, nil)

	for _, bad := range []struct {
		vni    uint32
		prefix string
	}{{0, "10.1.1.0/24"}, {vpc1, "fd00::/64"}} {
		if err := d.ForgetLearnedIn(bad.vni, netip.MustParsePrefix(bad.prefix)); err == nil {
			t.Errorf("ForgetLearnedIn(%d, %s) accepted", bad.vni, bad.prefix)
		}
	}

	must(t, d.ForgetAllLearned())
	if left := learnedKeys(t, d); len(left) != 0 {
		t.Fatalf("after ForgetAllLearned: learned %v", left)
	}
}

func learnedKeys(t *testing.T, d *Datapath) []string {
	t.Helper()
	l, err := d.Learned()
	must(t, err)
	var out []string
	for _, e := range l {
		out = append(out, fmt.Sprintf("%d/%s", e.VNI, e.IP))
	}
	slices.Sort(out)
	return out
}
