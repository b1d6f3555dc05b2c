package integration

import (
	"fmt"
	"testing"

	"mizar.dev/test/integration/fixtures"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestConcurrentOverlappingSubnets: of many overlapping subnets created at the
// same moment exactly one is stored and the others get 422: each claims its range
// in a transaction guarded by the VPC's other claims, and a create that meets one
// still in flight waits for its outcome instead of answering 409.
func TestConcurrentOverlappingSubnets(t *testing.T) {
	ctx := testContext(t)
	u := runSuffix()
	c := client().NetworkingV1alpha1()
	mustCreate(t, func() error {
		_, err := c.Vpcs().Create(ctx, fixtures.Vpc("race-vpc"+u, "10.80.0.0/16", 0), metav1.CreateOptions{})
		return err
	})
	errs := fixtures.Race(8, func(i int) error {
		// /24, /25 and /26 prefixes that all contain 10.80.5.0.
		cidr := fmt.Sprintf("10.80.5.0/%d", 24+i%3)
		_, err := c.Subnets().Create(ctx, fixtures.Subnet(fmt.Sprintf("race-%d", i)+u, "race-vpc"+u, cidr), metav1.CreateOptions{})
		return err
	})
	stored := 0
	for i, err := range errs {
		switch {
		case err == nil:
			stored++
		case !apierrors.IsInvalid(err):
			t.Errorf("create %d: got %v, want success or 422", i, err)
		}
	}
	if stored != 1 {
		t.Errorf("%d overlapping subnets were stored, want exactly 1", stored)
	}
}

// TestConcurrentAllocation: endpoints and VPCs created at once all get distinct
// addresses and VNIs.
func TestConcurrentAllocation(t *testing.T) {
	ctx := testContext(t)
	u := runSuffix()
	c := client().NetworkingV1alpha1()
	mustCreate(t, func() error {
		_, err := c.Vpcs().Create(ctx, fixtures.Vpc("alloc-vpc"+u, "10.81.0.0/16", 0), metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := c.Subnets().Create(ctx, fixtures.Subnet("alloc-net"+u, "alloc-vpc"+u, "10.81.0.0/27"), metav1.CreateOptions{})
		return err
	})

	// A /27 has 30 host addresses; one is the gateway, so 29 endpoints fit.
	const n = 29
	ips := make([]string, n)
	errs := fixtures.Race(n, func(i int) error {
		ep, err := c.Endpoints(fmt.Sprintf("alloc-%d", i%3)+u).Create(ctx, fixtures.Endpoint(fmt.Sprintf("alloc-%d", i%3)+u, fmt.Sprintf("ep-%d", i), "alloc-net"+u, ""), metav1.CreateOptions{})
		if err == nil {
			ips[i] = ep.Spec.IP
		}
		return err
	})
	seen := map[string]int{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("endpoint %d: %v", i, err)
		}
		if j, dup := seen[ips[i]]; dup {
			t.Errorf("endpoints %d and %d both got %s", j, i, ips[i])
		}
		seen[ips[i]] = i
	}
	// The subnet is full now: the next one is refused, with the field named.
	_, err := c.Endpoints("alloc-0"+u).Create(ctx, fixtures.Endpoint("alloc-0"+u, "one-too-many", "alloc-net"+u, ""), metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Errorf("endpoint in a full subnet: got %v, want 422", err)
	}

	vnis := make([]int32, 10)
	errs = fixtures.Race(len(vnis), func(i int) error {
		vpc, err := c.Vpcs().Create(ctx, fixtures.Vpc(fmt.Sprintf("alloc-vpc-%d", i)+u, "10.82.0.0/16", 0), metav1.CreateOptions{})
		if err == nil {
			vnis[i] = vpc.Spec.VNI
		}
		return err
	})
	seenVNI := map[int32]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("vpc %d: %v", i, err)
		}
		if seenVNI[vnis[i]] {
			t.Errorf("VNI %d allocated twice", vnis[i])
		}
		seenVNI[vnis[i]] = true
	}
}
