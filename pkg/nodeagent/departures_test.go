package nodeagent

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
)

// forgotten records what departures asked the datapath to forget.
type forgotten []string

func (f *forgotten) ForgetLearned(vni uint32, ip netip.Addr) error {
	*f = append(*f, fmt.Sprintf("%d/%s", vni, ip))
	return nil
}

func (f *forgotten) ForgetLearnedIn(vni uint32, p netip.Prefix) error {
	*f = append(*f, fmt.Sprintf("%d/%s", vni, p))
	return nil
}

func TestDeparturesForget(t *testing.T) {
	var f forgotten
	h := newDepartures(&f, func(vpc string) (uint32, bool) { return 7, vpc == "v" }).handler()
	subnet := func(seqs ...int64) *v1alpha1.Subnet {
		s := &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: "s", UID: "u1"}, Spec: v1alpha1.SubnetSpec{VPC: "v", CIDR: "10.1.1.0/24"}}
		for _, q := range seqs {
			s.Status.Departures = append(s.Status.Departures, v1alpha1.EndpointDeparture{Sequence: q, Endpoint: "ns/ep", IP: fmt.Sprintf("10.1.1.%d", q), Droplet: "d"})
		}
		return s
	}
	step := func(what string, do func(), want ...string) {
		t.Helper()
		f = nil
		do()
		if !slices.Equal(f, want) {
			t.Errorf("%s: forgot %v, want %v", what, f, want)
		}
	}
	// First sight (the agent's start, which forgets everything anyway).
	step("first sight", func() { h.OnAdd(subnet(1, 2), true) })
	step("two new", func() { h.OnUpdate(subnet(1, 2), subnet(1, 2, 3, 4)) }, "7/10.1.1.3", "7/10.1.1.4")
	step("status write without departures", func() { h.OnUpdate(subnet(1, 2, 3, 4), subnet(1, 2, 3, 4)) })
	step("oldest dropped, one new", func() { h.OnUpdate(subnet(1, 2, 3, 4), subnet(3, 4, 5)) }, "7/10.1.1.5")
	step("a gap: some missed", func() { h.OnUpdate(subnet(3, 4, 5), subnet(9, 10)) }, "7/10.1.1.0/24")
	step("deleted", func() { h.OnDelete(cache.DeletedFinalStateUnknown{Obj: subnet(9, 10)}) }, "7/10.1.1.0/24")
	other := subnet(1)
	other.Spec.VPC = "unknown"
	step("VPC without VNI", func() {
		h.OnAdd(other, false)
		other = other.DeepCopy()
		other.Status.Departures = subnet(1, 2).Status.Departures
		h.OnUpdate(nil, other)
	})
}
