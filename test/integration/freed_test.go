package integration

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"mizar.dev/test/integration/fixtures"
)

// TestFreedValueIsFree: a droplet address given up by an update is free for
// the next droplet at once. Before, the old claim (freed only by the repair
// loop) was taken for a create still in flight: 409 "still in progress" for
// up to 121 s.
func TestFreedValueIsFree(t *testing.T) {
	ctx := testContext(t)
	u := runSuffix()
	c := client().NetworkingV1alpha1()
	ip := uniqueDropletIP()
	d, err := c.Droplets().Create(ctx, fixtures.Droplet("freed-a"+u, ip), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.Spec.IP = uniqueDropletIP()
	if _, err := c.Droplets().Update(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Droplets().Create(ctx, fixtures.Droplet("freed-b"+u, ip), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a droplet taking the address another gave up: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("the create took %v, want it not to wait for the freed claim", took)
	}
}

var dropletIPs atomic.Int32

// uniqueDropletIP is an underlay address no other test of this process uses.
func uniqueDropletIP() string {
	n := dropletIPs.Add(1)
	return fmt.Sprintf("172.30.%d.%d", n/250, n%250+1)
}
