package apiserver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	v1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// TestNodeAgentsReadTheirSlice: a droplet identity lists and watches
// endpoints only with the selectors of its slice (its own droplet, a subnet
// whose bouncer it hosts, a subnet of a VPC whose divider it hosts); a watch
// of the whole collection, the replay that took the server's memory, and a
// look at another droplet's or subnet's endpoints are refused with 403 naming
// the rule. Before, any droplet could watch every endpoint.
func TestNodeAgentsReadTheirSlice(t *testing.T) {
	s := apiservertest.Start(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := s.Client.NetworkingV1alpha1()
	sfx := rand5()
	me, other := "me-"+sfx, "other-"+sfx
	vpcA, vpcB := "va-"+sfx, "vb-"+sfx
	bounced, divided, elsewhere := "bounced-"+sfx, "divided-"+sfx, "elsewhere-"+sfx
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(n.Vpcs().Create(ctx, &v1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: vpcA}, Spec: v1.VpcSpec{CIDR: "10.50.0.0/16"}}, metav1.CreateOptions{}))
	must(n.Vpcs().Create(ctx, &v1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: vpcB}, Spec: v1.VpcSpec{CIDR: "10.51.0.0/16"}}, metav1.CreateOptions{}))
	must(n.Subnets().Create(ctx, &v1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: bounced}, Spec: v1.SubnetSpec{VPC: vpcA, CIDR: "10.50.1.0/24"}}, metav1.CreateOptions{}))
	must(n.Subnets().Create(ctx, &v1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: elsewhere}, Spec: v1.SubnetSpec{VPC: vpcA, CIDR: "10.50.2.0/24"}}, metav1.CreateOptions{}))
	must(n.Subnets().Create(ctx, &v1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: divided}, Spec: v1.SubnetSpec{VPC: vpcB, CIDR: "10.51.1.0/24"}}, metav1.CreateOptions{}))
	must(n.Droplets().Create(ctx, droplet(me, "192.168.91.1"), metav1.CreateOptions{}))
	must(n.Droplets().Create(ctx, droplet(other, "192.168.91.2"), metav1.CreateOptions{}))
	must(n.Bouncers().Create(ctx, &v1.Bouncer{ObjectMeta: metav1.ObjectMeta{Name: "b-" + sfx}, Spec: v1.BouncerSpec{Subnet: bounced, Droplet: me}}, metav1.CreateOptions{}))
	must(n.Bouncers().Create(ctx, &v1.Bouncer{ObjectMeta: metav1.ObjectMeta{Name: "b2-" + sfx}, Spec: v1.BouncerSpec{Subnet: elsewhere, Droplet: other}}, metav1.CreateOptions{}))

	agent, err := versioned.NewForConfig(dropletConfig(t, s.DataDir, me))
	if err != nil {
		t.Fatal(err)
	}
	eps := agent.NetworkingV1alpha1().Endpoints(metav1.NamespaceAll)
	sel := func(field, value string) string { return fields.OneTermEqualSelector(field, value).String() }
	check := func(selector string, allowed bool) {
		t.Helper()
		_, listErr := eps.List(ctx, metav1.ListOptions{FieldSelector: selector})
		w, watchErr := eps.Watch(ctx, metav1.ListOptions{FieldSelector: selector})
		if w != nil {
			w.Stop()
		}
		for verb, err := range map[string]error{"list": listErr, "watch": watchErr} {
			switch {
			case allowed && err != nil:
				t.Errorf("%s endpoints with %q as droplet %s: %v, want it allowed", verb, selector, me, err)
			case !allowed && !apierrors.IsForbidden(err):
				t.Errorf("%s endpoints with %q as droplet %s: %v, want 403", verb, selector, me, err)
			case !allowed && !strings.Contains(err.Error(), "node agents may list and watch endpoints only with the field selector spec.droplet="+me):
				t.Errorf("%s endpoints with %q: the refusal does not name the rule: %v", verb, selector, err)
			}
		}
	}
	check("", false)                         // the whole collection: the replay
	check(sel("spec.droplet", me), true)     // its own endpoints
	check(sel("spec.droplet", other), false) // another droplet's
	check(sel("spec.subnet", bounced), true) // a subnet it bounces
	check(sel("spec.subnet", elsewhere), false)
	check(sel("spec.subnet", divided), false)
	check("spec.droplet!="+other, false)
	// A divider placed on it right now is seen at once: the agent starts the
	// VPC's subnets' streams as soon as its own watch shows the divider.
	must(n.Dividers().Create(ctx, &v1.Divider{ObjectMeta: metav1.ObjectMeta{Name: "d-" + sfx}, Spec: v1.DividerSpec{VPC: vpcB, Droplet: me}}, metav1.CreateOptions{}))
	check(sel("spec.subnet", divided), true)
	check(sel("spec.subnet", "no-such-subnet-"+sfx), false)

	// Admins read everything as before.
	if _, err := n.Endpoints(metav1.NamespaceAll).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("admin list of every endpoint: %v", err)
	}
}
