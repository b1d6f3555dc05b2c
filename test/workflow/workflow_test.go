package workflow

import (
	"fmt"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	corev1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/operators/droplet"
	"mizar.dev/pkg/operators/subnet"
)

func TestCreateAndDeleteWorkflows(t *testing.T) {
	ctx := testContext(t)
	srv := startServer(t)
	c := srv.Client.NetworkingV1alpha1()
	p := uniq("wf")

	// Before any droplet: the VPC's divider waits with a reason a person can act on.
	vpc, err := c.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: corev1.ObjectMeta{Name: p}, Spec: v1alpha1.VpcSpec{CIDR: "10.1.0.0/16", Dividers: 2}}, corev1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "dividers waiting for a droplet", func() (bool, error) {
		d, err := c.Dividers().Get(ctx, p+"-d-0", corev1.GetOptions{})
		if err != nil {
			return false, err
		}
		cond := condition(d.Status.Conditions, droplet.ConditionPlaced)
		return cond != nil && cond.Reason == droplet.ReasonNoDroplet, nil
	})
	// A subnet whose VPC is not Provisioned waits and says why.
	sub, err := c.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: corev1.ObjectMeta{Name: p + "-a"}, Spec: v1alpha1.SubnetSpec{VPC: vpc.Name, CIDR: "10.1.1.0/24", Bouncers: 2}}, corev1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "subnet waiting for its VPC", func() (bool, error) {
		s, err := c.Subnets().Get(ctx, sub.Name, corev1.GetOptions{})
		if err != nil {
			return false, err
		}
		cond := condition(s.Status.Conditions, subnet.ConditionVpcReady)
		return cond != nil && cond.Reason == subnet.ReasonVpcNotProvisioned && s.Status.Phase == v1alpha1.PhaseInit, nil
	})

	agents := map[string]*runningAgent{}
	for i := range 3 {
		a := startAgent(t, srv.Client, fmt.Sprintf("%s-node%d", p, i), i)
		agents[a.name] = a
	}
	eventually(t, ctx, "VPC and subnet Provisioned", func() (bool, error) {
		v, err := c.Vpcs().Get(ctx, vpc.Name, corev1.GetOptions{})
		if err != nil {
			return false, err
		}
		s, err := c.Subnets().Get(ctx, sub.Name, corev1.GetOptions{})
		if err != nil {
			return false, err
		}
		return v.Status.Phase == v1alpha1.PhaseProvisioned && s.Status.Phase == v1alpha1.PhaseProvisioned, nil
	})

	// Placement spreads siblings over distinct droplets.
	dividers, err := c.Dividers().List(ctx, corev1.ListOptions{FieldSelector: "spec.vpc=" + vpc.Name})
	if err != nil {
		t.Fatal(err)
	}
	bouncers, err := c.Bouncers().List(ctx, corev1.ListOptions{FieldSelector: "spec.subnet=" + sub.Name})
	if err != nil {
		t.Fatal(err)
	}
	if len(dividers.Items) != 2 || len(bouncers.Items) != 2 {
		t.Fatalf("want 2 dividers and 2 bouncers, got %d and %d", len(dividers.Items), len(bouncers.Items))
	}
	// The bouncers came after the droplets (the dividers waited for the first one).
	if bouncers.Items[0].Spec.Droplet == bouncers.Items[1].Spec.Droplet {
		t.Errorf("bouncers of one subnet share droplet %s while others are free", bouncers.Items[0].Spec.Droplet)
	}
	for _, d := range dividers.Items {
		if got := agents[d.Spec.Droplet].dp.Dividers()[d.Name]; got[sub.Name] != sub.Spec.CIDR {
			t.Errorf("divider %s on %s does not route subnet %s: %v", d.Name, d.Spec.Droplet, sub.Name, got)
		}
	}

	// Endpoints: Provisioned once their host and both bouncers applied them.
	ns := uniq("ns")
	var eps []*v1alpha1.Endpoint
	names := make([]string, 0, len(agents))
	for n := range agents {
		names = append(names, n)
	}
	for i := range 6 {
		ep, err := c.Endpoints(ns).Create(ctx, &v1alpha1.Endpoint{
			ObjectMeta: corev1.ObjectMeta{Name: fmt.Sprintf("ep%d", i)},
			Spec:       v1alpha1.EndpointSpec{Subnet: sub.Name, Droplet: names[i%len(names)], MAC: fmt.Sprintf("02:42:0a:00:00:%02x", i+1)},
		}, corev1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Created holding the operator's finalizer: the operator's first
		// reconcile writes nothing, and the create is what agents acknowledge.
		if !slices.Contains(ep.Finalizers, v1alpha1.OperatorFinalizer) {
			t.Errorf("endpoint %s created without %s: %v", ep.Name, v1alpha1.OperatorFinalizer, ep.Finalizers)
		}
		eps = append(eps, ep)
	}
	for _, ep := range eps {
		eventually(t, ctx, "endpoint "+ep.Name+" Provisioned", func() (bool, error) {
			got, err := c.Endpoints(ns).Get(ctx, ep.Name, corev1.GetOptions{})
			if err != nil {
				return false, err
			}
			return got.Status.Phase == v1alpha1.PhaseProvisioned, fmt.Errorf("rv %s, status %+v", got.ResourceVersion, got.Status)
		})
		key := ns + "/" + ep.Name
		if ip := agents[ep.Spec.Droplet].dp.HostEndpoints()[key]; ip == "" {
			t.Errorf("host %s did not program %s", ep.Spec.Droplet, key)
		}
		for _, b := range bouncers.Items {
			if ip := agents[b.Spec.Droplet].dp.Bouncers()[b.Name][key]; ip == "" {
				t.Errorf("bouncer %s on %s did not program %s", b.Name, b.Spec.Droplet, key)
			}
		}
	}

	// One writer per transition.
	checkManager := func(kind, name string, obj corev1.Object, want string) {
		t.Helper()
		if got := phaseManager(obj); got != want {
			t.Errorf("%s %s: status.phase written by %q, want %q", kind, name, got, want)
		}
	}
	v, _ := c.Vpcs().Get(ctx, vpc.Name, corev1.GetOptions{})
	checkManager("vpc", vpc.Name, v, "mizar-vpc-operator")
	s, _ := c.Subnets().Get(ctx, sub.Name, corev1.GetOptions{})
	checkManager("subnet", sub.Name, s, "mizar-subnet-operator")
	for _, d := range dividers.Items {
		got, _ := c.Dividers().Get(ctx, d.Name, corev1.GetOptions{})
		checkManager("divider", d.Name, got, "mizar-nodeagent")
	}
	for _, b := range bouncers.Items {
		got, _ := c.Bouncers().Get(ctx, b.Name, corev1.GetOptions{})
		checkManager("bouncer", b.Name, got, "mizar-nodeagent")
	}
	for n := range agents {
		got, _ := c.Droplets().Get(ctx, n, corev1.GetOptions{})
		checkManager("droplet", n, got, "mizar-nodeagent")
	}
	for _, ep := range eps {
		got, _ := c.Endpoints(ns).Get(ctx, ep.Name, corev1.GetOptions{})
		checkManager("endpoint", ep.Name, got, "mizar-endpoint-operator")
	}

	// Delete workflows, in dependency order. The VPC waits for its subnet...
	if err := c.Vpcs().Delete(ctx, vpc.Name, corev1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "VPC Terminating while its subnet remains", func() (bool, error) {
		v, err := c.Vpcs().Get(ctx, vpc.Name, corev1.GetOptions{})
		if err != nil {
			return false, err
		}
		cond := condition(v.Status.Conditions, "Deleting")
		return v.Status.Phase == v1alpha1.PhaseTerminating && cond != nil && cond.Reason == "SubnetsRemain", nil
	})
	// ...the subnet for its endpoints...
	if err := c.Subnets().Delete(ctx, sub.Name, corev1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "subnet Terminating while endpoints remain", func() (bool, error) {
		s, err := c.Subnets().Get(ctx, sub.Name, corev1.GetOptions{})
		if err != nil {
			return false, err
		}
		cond := condition(s.Status.Conditions, "Deleting")
		return s.Status.Phase == v1alpha1.PhaseTerminating && cond != nil && cond.Reason == subnet.ReasonEndpointsRemain, nil
	})
	// ...and an endpoint leaves its host and bouncers before it goes.
	for _, ep := range eps {
		if err := c.Endpoints(ns).Delete(ctx, ep.Name, corev1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ep := range eps {
		eventually(t, ctx, "endpoint "+ep.Name+" gone", func() (bool, error) {
			_, err := c.Endpoints(ns).Get(ctx, ep.Name, corev1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		key := ns + "/" + ep.Name
		if _, ok := agents[ep.Spec.Droplet].dp.HostEndpoints()[key]; ok {
			t.Errorf("endpoint %s gone from the API but still on its host", key)
		}
		for _, b := range bouncers.Items {
			if _, ok := agents[b.Spec.Droplet].dp.Bouncers()[b.Name][key]; ok {
				t.Errorf("endpoint %s gone from the API but still in bouncer %s", key, b.Name)
			}
		}
	}
	eventually(t, ctx, "subnet, bouncers, VPC and dividers gone", func() (bool, error) {
		_, e1 := c.Subnets().Get(ctx, sub.Name, corev1.GetOptions{})
		_, e2 := c.Vpcs().Get(ctx, vpc.Name, corev1.GetOptions{})
		b, e3 := c.Bouncers().List(ctx, corev1.ListOptions{FieldSelector: "spec.subnet=" + sub.Name})
		d, e4 := c.Dividers().List(ctx, corev1.ListOptions{FieldSelector: "spec.vpc=" + vpc.Name})
		if e3 != nil || e4 != nil {
			return false, fmt.Errorf("%v %v", e3, e4)
		}
		return apierrors.IsNotFound(e1) && apierrors.IsNotFound(e2) && len(b.Items) == 0 && len(d.Items) == 0, nil
	})
	for n, a := range agents {
		if len(a.dp.Bouncers()) != 0 || len(a.dp.Dividers()) != 0 {
			t.Errorf("droplet %s still serves bouncers %v / dividers %v", n, a.dp.Bouncers(), a.dp.Dividers())
		}
	}
}
