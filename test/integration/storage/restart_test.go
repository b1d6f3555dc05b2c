package storage

import (
	"testing"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/test/integration/fixtures"
)

// TestRestartKeepsData stops a server and starts a new one on the same data
// directory: every object is back unchanged, and allocations continue from the
// stored objects instead of starting over.
func TestRestartKeepsData(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	first := apiservertest.Start(t, dir)
	c := first.Client.NetworkingV1alpha1()

	vpc, err := c.Vpcs().Create(ctx, fixtures.Vpc("keep", "10.70.0.0/16", 0), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	subnet, err := c.Subnets().Create(ctx, fixtures.Subnet("keep", "keep", "10.70.1.0/24"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ep, err := c.Endpoints("default").Create(ctx, fixtures.Endpoint("default", "keep", "keep", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	div, err := c.Dividers().Create(ctx, fixtures.Divider("keep", "keep", "node-1"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bnc, err := c.Bouncers().Create(ctx, fixtures.Bouncer("keep", "keep", "node-1"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	drop, err := c.Droplets().Create(ctx, fixtures.Droplet("keep", "192.168.70.1"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	drop.Status.Phase = v1.PhaseProvisioned
	if drop, err = c.Droplets().UpdateStatus(ctx, drop, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}

	second := apiservertest.Start(t, dir)
	c = second.Client.NetworkingV1alpha1()
	check := func(kind string, got, want any, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s after restart: %v", kind, err)
		}
		if !apiequality.Semantic.DeepEqual(got, want) {
			t.Errorf("%s after restart = %+v, want %+v", kind, got, want)
		}
	}
	gotVpc, err := c.Vpcs().Get(ctx, "keep", metav1.GetOptions{})
	check("vpc", gotVpc, vpc, err)
	gotSubnet, err := c.Subnets().Get(ctx, "keep", metav1.GetOptions{})
	check("subnet", gotSubnet, subnet, err)
	gotEp, err := c.Endpoints("default").Get(ctx, "keep", metav1.GetOptions{})
	check("endpoint", gotEp, ep, err)
	gotDiv, err := c.Dividers().Get(ctx, "keep", metav1.GetOptions{})
	check("divider", gotDiv, div, err)
	gotBnc, err := c.Bouncers().Get(ctx, "keep", metav1.GetOptions{})
	check("bouncer", gotBnc, bnc, err)
	gotDrop, err := c.Droplets().Get(ctx, "keep", metav1.GetOptions{})
	check("droplet", gotDrop, drop, err)

	// Allocation resumes from what is stored.
	next, err := c.Vpcs().Create(ctx, fixtures.Vpc("keep-2", "10.71.0.0/16", 0), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if next.Spec.VNI == vpc.Spec.VNI {
		t.Errorf("VNI %d allocated twice across a restart", next.Spec.VNI)
	}
	nextEp, err := c.Endpoints("default").Create(ctx, fixtures.Endpoint("default", "keep-2", "keep", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nextEp.Spec.IP == ep.Spec.IP {
		t.Errorf("address %s allocated twice across a restart", ep.Spec.IP)
	}
}
