package workflow

import (
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/operators/droplet"
	"mizar.dev/pkg/operators/endpoint"
)

// A droplet that goes away: its bouncer is re-placed and provisioned again by
// another agent, and the endpoints it hosted are marked Failed.
func TestDropletGone(t *testing.T) {
	ctx := testContext(t)
	srv := startServer(t)
	c := srv.Client.NetworkingV1alpha1()
	p := uniq("dg")
	agents := startAgents(t, ctx, srv.Client, p, 2)
	vpc, err := c.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: p}, Spec: v1alpha1.VpcSpec{CIDR: "10.3.0.0/16"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: p + "-a"}, Spec: v1alpha1.SubnetSpec{VPC: vpc.Name, CIDR: "10.3.1.0/24"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "subnet Provisioned", func() (bool, error) {
		s, err := c.Subnets().Get(ctx, sub.Name, metav1.GetOptions{})
		return err == nil && s.Status.Phase == v1alpha1.PhaseProvisioned, err
	})
	b, err := c.Bouncers().Get(ctx, sub.Name+"-b-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gone := b.Spec.Droplet
	ns := uniq("ns")
	ep, err := c.Endpoints(ns).Create(ctx, &v1alpha1.Endpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "ep"},
		Spec:       v1alpha1.EndpointSpec{Subnet: sub.Name, Droplet: gone, MAC: "02:42:0a:00:00:09"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "endpoint Provisioned", func() (bool, error) {
		e, err := c.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
		return err == nil && e.Status.Phase == v1alpha1.PhaseProvisioned, err
	})

	agents[gone].stop()
	if err := c.Droplets().Delete(ctx, gone, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var survivor string
	for n := range agents {
		if n != gone {
			survivor = n
		}
	}
	eventually(t, ctx, "bouncer re-placed and Provisioned on "+survivor, func() (bool, error) {
		b, err := c.Bouncers().Get(ctx, b.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		cond := condition(b.Status.Conditions, droplet.ConditionPlaced)
		return b.Spec.Droplet == survivor && b.Status.Phase == v1alpha1.PhaseProvisioned && cond != nil && cond.Reason == droplet.ReasonReplaced, nil
	})
	if got := agents[survivor].dp.Bouncers()[b.Name][ns+"/"+ep.Name]; got != ep.Spec.IP {
		t.Errorf("re-placed bouncer holds %q for the endpoint, want %q", got, ep.Spec.IP)
	}
	eventually(t, ctx, "endpoint on the gone droplet Failed", func() (bool, error) {
		e, err := c.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		cond := condition(e.Status.Conditions, endpoint.ConditionApplied)
		return e.Status.Phase == v1alpha1.PhaseFailed && cond != nil && cond.Reason == endpoint.ReasonDropletGone, nil
	})
	// Deleting it does not wait for the agent that is gone.
	if err := c.Endpoints(ns).Delete(ctx, ep.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "failed endpoint deleted", func() (bool, error) {
		_, err := c.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}
