package endpoint

import (
	"testing"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
)

func TestAppendDeparture(t *testing.T) {
	var deps []v1alpha1.EndpointDeparture
	for i := range v1alpha1.MaxSubnetDepartures + 5 {
		deps = AppendDeparture(deps, v1alpha1.EndpointDeparture{Endpoint: "ns/ep", IP: "10.0.0.1", Droplet: "d"})
		if n := len(deps); deps[n-1].Sequence != int64(i+1) {
			t.Fatalf("departure %d numbered %d", i+1, deps[n-1].Sequence)
		}
	}
	if len(deps) != v1alpha1.MaxSubnetDepartures || deps[0].Sequence != 6 {
		t.Fatalf("kept %d departures from #%d, want the newest %d from #6", len(deps), deps[0].Sequence, v1alpha1.MaxSubnetDepartures)
	}
	for i := 1; i < len(deps); i++ {
		if deps[i].Sequence != deps[i-1].Sequence+1 {
			t.Fatalf("gap between #%d and #%d", deps[i-1].Sequence, deps[i].Sequence)
		}
	}
}
