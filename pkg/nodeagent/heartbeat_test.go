package nodeagent

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The agent creates its Lease, labelled with its droplet, and keeps
// renewing it; when it stops, the renewals stop.
func TestHeartbeatRenewsItsLease(t *testing.T) {
	c := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Heartbeat(ctx, c, "mizar", "node-hb", 20*time.Millisecond); close(done) }()
	get := func() time.Time {
		l, err := c.CoordinationV1().Leases("mizar").Get(context.Background(), HeartbeatLeaseName("node-hb"), metav1.GetOptions{})
		if err != nil || l.Spec.RenewTime == nil {
			return time.Time{}
		}
		if l.Labels[HeartbeatLabel] != "node-hb" || *l.Spec.HolderIdentity != "node-hb" {
			t.Fatalf("lease %+v: want label and holder node-hb", l)
		}
		return l.Spec.RenewTime.Time
	}
	deadline := time.Now().Add(5 * time.Second)
	first := get()
	for first.IsZero() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
		first = get()
	}
	if first.IsZero() {
		t.Fatal("no lease created")
	}
	for !get().After(first) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if !get().After(first) {
		t.Fatal("the lease was not renewed")
	}
	cancel()
	<-done
	last := get()
	time.Sleep(100 * time.Millisecond)
	if !get().Equal(last) {
		t.Fatal("renewed after the agent stopped")
	}
}
