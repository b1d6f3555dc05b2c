package integration

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
)

// /metrics reports each subnet's addresses in use and its capacity from the
// allocation index, as endpoints take and free them.
func TestClaimsInUseByRange(t *testing.T) {
	ctx := testContext(t)
	sfx := runSuffix()
	api := client().NetworkingV1alpha1()
	vpc, subnet := "claimsm-vpc"+sfx, "claimsm-sn"+sfx
	if _, err := api.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: vpc}, Spec: v1alpha1.VpcSpec{CIDR: "10.231.0.0/16"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Vpcs().Delete(ctx, vpc, metav1.DeleteOptions{}) })
	if _, err := api.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: subnet}, Spec: v1alpha1.SubnetSpec{VPC: vpc, CIDR: "10.231.1.0/24"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Subnets().Delete(ctx, subnet, metav1.DeleteOptions{}) })
	eps := api.Endpoints("default")
	for i := range 3 {
		name := fmt.Sprintf("claimsm-%d%s", i, sfx)
		if _, err := eps.Create(ctx, &v1alpha1.Endpoint{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.EndpointSpec{Subnet: subnet, Droplet: "d", MAC: fmt.Sprintf("02:00:00:31:00:%02x", i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = eps.Delete(ctx, name, metav1.DeleteOptions{}) })
	}
	series := `{range="ip/` + subnet + `"}`
	if got := scrapeCounter(t, ctx, "mizar_claims_in_use"+series); got != 3 {
		t.Errorf("mizar_claims_in_use%s = %v, want 3", series, got)
	}
	// A /24 has 254 hosts; the gateway is reserved.
	if got := scrapeCounter(t, ctx, "mizar_claims_capacity"+series); got != 253 {
		t.Errorf("mizar_claims_capacity%s = %v, want 253", series, got)
	}
	if err := eps.Delete(ctx, fmt.Sprintf("claimsm-0%s", sfx), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := scrapeCounter(t, ctx, "mizar_claims_in_use"+series); got != 2 {
		t.Errorf("after a delete, mizar_claims_in_use%s = %v, want 2", series, got)
	}
	if got := scrapeCounter(t, ctx, `mizar_claims_in_use{range="vni"}`); got < 1 {
		t.Errorf(`mizar_claims_in_use{range="vni"} = %v, want >= 1`, got)
	}
}
