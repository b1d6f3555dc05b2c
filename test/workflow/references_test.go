package workflow

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/operators/reconcile"
)

// A divider or bouncer made by hand that names a VPC, subnet or droplet that
// does not exist is held with a condition naming what is missing, and the
// condition clears once they exist.
func TestReferencesHeldWithCondition(t *testing.T) {
	ctx := testContext(t)
	srv := startServer(t)
	c := srv.Client.NetworkingV1alpha1()
	p := uniq("ref")
	drop := p + "-node"
	if _, err := c.Dividers().Create(ctx, &v1alpha1.Divider{ObjectMeta: metav1.ObjectMeta{Name: p + "-div"},
		Spec: v1alpha1.DividerSpec{VPC: p, Droplet: drop}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Bouncers().Create(ctx, &v1alpha1.Bouncer{ObjectMeta: metav1.ObjectMeta{Name: p + "-bnc"},
		Spec: v1alpha1.BouncerSpec{Subnet: p + "-net", Droplet: drop}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	refs := func(kind string) *metav1.Condition {
		var conds []metav1.Condition
		switch kind {
		case "divider":
			d, err := c.Dividers().Get(ctx, p+"-div", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			conds = d.Status.Conditions
		default:
			b, err := c.Bouncers().Get(ctx, p+"-bnc", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			conds = b.Status.Conditions
		}
		return condition(conds, reconcile.ConditionReferences)
	}
	for kind, want := range map[string]string{"divider": "VPC " + p + " and droplet " + drop, "bouncer": "subnet " + p + "-net and droplet " + drop} {
		eventually(t, ctx, kind+" held for missing references", func() (bool, error) {
			c := refs(kind)
			return c != nil && c.Status == metav1.ConditionFalse && c.Reason == reconcile.ReasonReferenceMissing && strings.Contains(c.Message, want), nil
		})
	}

	if _, err := c.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: p}, Spec: v1alpha1.VpcSpec{CIDR: "10.6.0.0/16"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: p + "-net"}, Spec: v1alpha1.SubnetSpec{VPC: p, CIDR: "10.6.1.0/24"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ip := fmt.Sprintf("198.19.%d.%d", rand.IntN(250)+1, rand.IntN(250)+1)
	if _, err := c.Droplets().Create(ctx, &v1alpha1.Droplet{ObjectMeta: metav1.ObjectMeta{Name: drop},
		Spec: v1alpha1.DropletSpec{Node: drop, IP: ip, MAC: "02:00:00:00:10:01", Interface: "eth0"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"divider", "bouncer"} {
		eventually(t, ctx, kind+" references resolved", func() (bool, error) {
			c := refs(kind)
			return c != nil && c.Status == metav1.ConditionTrue && c.Reason == reconcile.ReasonReferencesFound, nil
		})
	}
}
