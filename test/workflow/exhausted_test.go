package workflow

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/operators/subnet"
)

// A full subnet says so in a condition, besides refusing the next endpoint.
func TestExhaustedSubnet(t *testing.T) {
	ctx := testContext(t)
	srv := startServer(t)
	c := srv.Client.NetworkingV1alpha1()
	p := uniq("ex")
	if _, err := c.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: p}, Spec: v1alpha1.VpcSpec{CIDR: "10.5.0.0/16"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A /29 has 8 addresses: network, broadcast and gateway leave 5.
	sub, err := c.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: p + "-small"}, Spec: v1alpha1.SubnetSpec{VPC: p, CIDR: "10.5.1.0/29"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cond := func() *metav1.Condition {
		s, err := c.Subnets().Get(ctx, sub.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return condition(s.Status.Conditions, subnet.ConditionAddresses)
	}
	eventually(t, ctx, "addresses available", func() (bool, error) {
		c := cond()
		return c != nil && c.Reason == subnet.ReasonFree, nil
	})
	ns := uniq("ns")
	for i := range 5 {
		if _, err := c.Endpoints(ns).Create(ctx, &v1alpha1.Endpoint{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ep%d", i)},
			Spec: v1alpha1.EndpointSpec{Subnet: sub.Name, Droplet: p + "-node", MAC: fmt.Sprintf("02:42:0a:00:01:%02x", i+1)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, ctx, "SubnetExhausted", func() (bool, error) {
		c := cond()
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == subnet.ReasonExhausted, nil
	})
	if _, err := c.Endpoints(ns).Create(ctx, &v1alpha1.Endpoint{ObjectMeta: metav1.ObjectMeta{Name: "one-too-many"},
		Spec: v1alpha1.EndpointSpec{Subnet: sub.Name, Droplet: p + "-node", MAC: "02:42:0a:00:01:99"}}, metav1.CreateOptions{}); err == nil {
		t.Error("an endpoint was created in a full subnet")
	}
	if err := c.Endpoints(ns).Delete(ctx, "ep0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "addresses available again", func() (bool, error) {
		c := cond()
		return c != nil && c.Reason == subnet.ReasonFree, nil
	})
}
