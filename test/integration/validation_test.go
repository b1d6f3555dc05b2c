package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "mizar.dev/pkg/apis/networking/v1alpha1"
	typed "mizar.dev/pkg/generated/clientset/versioned/typed/networking/v1alpha1"
	"mizar.dev/test/integration/fixtures"
)

// badRequest is one request the server must refuse with 422 naming field, and
// that must leave the store as it was.
type badRequest struct {
	name  string
	field string
	// do sends the request; unchanged reports whether the store is as before.
	do        func(ctx context.Context) error
	unchanged func(ctx context.Context) (bool, error)
}

// Each helper builds a valid object from the shared bases, breaks it with mutate,
// and checks afterwards that no object of that name exists.

func createCase[T any](name, field string, obj *T, mutate func(*T), create func(context.Context, *T, metav1.CreateOptions) (*T, error), get func(context.Context, string, metav1.GetOptions) (*T, error)) badRequest {
	mutate(obj)
	return badRequest{
		name: name, field: field,
		do: func(ctx context.Context) error { _, err := create(ctx, obj, metav1.CreateOptions{}); return err },
		unchanged: func(ctx context.Context) (bool, error) {
			_, err := get(ctx, objMeta(obj).GetName(), metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return false, err
		},
	}
}

// updateCase reads the named object, breaks it with mutate, sends update (spec
// or status), and checks the stored object kept its resourceVersion.
func updateCase[T any](name, field, objName string, mutate func(*T), update func(context.Context, *T, metav1.UpdateOptions) (*T, error), get func(context.Context, string, metav1.GetOptions) (*T, error)) badRequest {
	var rv string
	return badRequest{
		name: name, field: field,
		do: func(ctx context.Context) error {
			obj, err := get(ctx, objName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			rv = objMeta(obj).GetResourceVersion()
			mutate(obj)
			_, err = update(ctx, obj, metav1.UpdateOptions{})
			return err
		},
		unchanged: func(ctx context.Context) (bool, error) {
			obj, err := get(ctx, objName, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return objMeta(obj).GetResourceVersion() == rv, nil
		},
	}
}

func TestValidation(t *testing.T) {
	ctx := testContext(t)
	u := runSuffix()
	// The VNI and droplet address are unique per run too: both must be unique in the store.
	run := runs.Load()
	vni := 3000 + run
	dropletIP := fmt.Sprintf("192.168.%d.%d", 60+run/200, 1+run%200)
	c := client().NetworkingV1alpha1()
	mustCreate(t, func() error {
		_, err := c.Vpcs().Create(ctx, fixtures.Vpc("val-vpc"+u, "10.30.0.0/16", vni), metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := c.Subnets().Create(ctx, fixtures.Subnet("val-net"+u, "val-vpc"+u, "10.30.1.0/24"), metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		ep, err := c.Endpoints("val"+u).Create(ctx, fixtures.Endpoint("val"+u, "val-ep"+u, "val-net"+u, "10.30.1.10"), metav1.CreateOptions{})
		// No operator runs here to remove its finalizer: the server must not set it.
		if err == nil && slices.Contains(ep.Finalizers, v1.OperatorFinalizer) {
			t.Errorf("endpoint created by a server without operators holds %s", v1.OperatorFinalizer)
		}
		return err
	})
	mustCreate(t, func() error {
		_, err := c.Dividers().Create(ctx, fixtures.Divider("val-div"+u, "val-vpc"+u, "node-1"), metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := c.Bouncers().Create(ctx, fixtures.Bouncer("val-bnc"+u, "val-net"+u, "node-1"), metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := c.Droplets().Create(ctx, fixtures.Droplet("val-drop"+u, dropletIP), metav1.CreateOptions{})
		return err
	})
	// A VPC held in deletion by a finalizer: nothing may be created in it.
	held := fixtures.Vpc("val-held"+u, "10.31.0.0/16", 0)
	held.Finalizers = []string{"test.mizar.dev/hold"}
	mustCreate(t, func() error { _, err := c.Vpcs().Create(ctx, held, metav1.CreateOptions{}); return err })
	if err := c.Vpcs().Delete(ctx, "val-held"+u, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { releaseFinalizers(t, c, "val-held"+u) })

	vpcs, subnets, eps := c.Vpcs(), c.Subnets(), c.Endpoints("val"+u)
	dividers, bouncers, droplets := c.Dividers(), c.Bouncers(), c.Droplets()
	vpc := func(name string) *v1.Vpc { return fixtures.Vpc(name, "10.40.0.0/16", 0) }
	subnet := func(name string) *v1.Subnet { return fixtures.Subnet(name, "val-vpc"+u, "10.30.2.0/24") }
	ep := func(name string) *v1.Endpoint { return fixtures.Endpoint("val"+u, name, "val-net"+u, "") }
	drop := func(name string) *v1.Droplet { return fixtures.Droplet(name, "192.168.59.2") }

	cases := []badRequest{
		createCase("vpc name", "metadata.name", vpc("Bad_Name"), func(o *v1.Vpc) {}, vpcs.Create, vpcs.Get),
		createCase("vpc cidr missing", "spec.cidr", vpc("v1"), func(o *v1.Vpc) { o.Spec.CIDR = "" }, vpcs.Create, vpcs.Get),
		createCase("vpc cidr not a cidr", "spec.cidr", vpc("v2"), func(o *v1.Vpc) { o.Spec.CIDR = "10.0.0.0" }, vpcs.Create, vpcs.Get),
		createCase("vpc cidr not canonical", "spec.cidr", vpc("v3"), func(o *v1.Vpc) { o.Spec.CIDR = "10.0.0.1/16" }, vpcs.Create, vpcs.Get),
		createCase("vpc cidr IPv6", "spec.cidr", vpc("v4"), func(o *v1.Vpc) { o.Spec.CIDR = "fd00::/64" }, vpcs.Create, vpcs.Get),
		createCase("vpc cidr too small", "spec.cidr", vpc("v5"), func(o *v1.Vpc) { o.Spec.CIDR = "10.0.0.0/30" }, vpcs.Create, vpcs.Get),
		createCase("vpc vni too large", "spec.vni", vpc("v6"), func(o *v1.Vpc) { o.Spec.VNI = 1 << 24 }, vpcs.Create, vpcs.Get),
		createCase("vpc vni negative", "spec.vni", vpc("v7"), func(o *v1.Vpc) { o.Spec.VNI = -1 }, vpcs.Create, vpcs.Get),
		createCase("vpc too many dividers", "spec.dividers", vpc("v8"), func(o *v1.Vpc) { o.Spec.Dividers = 17 }, vpcs.Create, vpcs.Get),
		createCase("vpc negative dividers", "spec.dividers", vpc("v9"), func(o *v1.Vpc) { o.Spec.Dividers = -1 }, vpcs.Create, vpcs.Get),
		createCase("vpc vni taken", "spec.vni", vpc("v10"), func(o *v1.Vpc) { o.Spec.VNI = vni }, vpcs.Create, vpcs.Get),
		updateCase("vpc cidr immutable", "spec.cidr", "val-vpc"+u, func(o *v1.Vpc) { o.Spec.CIDR = "10.30.0.0/15" }, vpcs.Update, vpcs.Get),
		updateCase("vpc vni immutable", "spec.vni", "val-vpc"+u, func(o *v1.Vpc) { o.Spec.VNI = vni + 1 }, vpcs.Update, vpcs.Get),

		createCase("subnet vpc missing", "spec.vpc", subnet("s1"), func(o *v1.Subnet) { o.Spec.VPC = "" }, subnets.Create, subnets.Get),
		createCase("subnet vpc bad name", "spec.vpc", subnet("s2"), func(o *v1.Subnet) { o.Spec.VPC = "Bad/Name" }, subnets.Create, subnets.Get),
		createCase("subnet vpc not found", "spec.vpc", subnet("s3"), func(o *v1.Subnet) { o.Spec.VPC = "no-such-vpc" }, subnets.Create, subnets.Get),
		createCase("subnet vpc being deleted", "spec.vpc", subnet("s4"), func(o *v1.Subnet) { o.Spec.VPC, o.Spec.CIDR = "val-held"+u, "10.31.1.0/24" }, subnets.Create, subnets.Get),
		createCase("subnet outside vpc", "spec.cidr", subnet("s5"), func(o *v1.Subnet) { o.Spec.CIDR = "10.99.0.0/24" }, subnets.Create, subnets.Get),
		createCase("subnet larger than vpc", "spec.cidr", subnet("s6"), func(o *v1.Subnet) { o.Spec.CIDR = "10.30.0.0/15" }, subnets.Create, subnets.Get),
		createCase("subnet overlaps sibling", "spec.cidr", subnet("s7"), func(o *v1.Subnet) { o.Spec.CIDR = "10.30.1.128/25" }, subnets.Create, subnets.Get),
		createCase("subnet gateway outside", "spec.gateway", subnet("s8"), func(o *v1.Subnet) { o.Spec.Gateway = "10.30.3.1" }, subnets.Create, subnets.Get),
		createCase("subnet gateway is network", "spec.gateway", subnet("s9"), func(o *v1.Subnet) { o.Spec.Gateway = "10.30.2.0" }, subnets.Create, subnets.Get),
		createCase("subnet gateway is broadcast", "spec.gateway", subnet("s10"), func(o *v1.Subnet) { o.Spec.Gateway = "10.30.2.255" }, subnets.Create, subnets.Get),
		createCase("subnet gateway not an IP", "spec.gateway", subnet("s11"), func(o *v1.Subnet) { o.Spec.Gateway = "gw" }, subnets.Create, subnets.Get),
		createCase("subnet bouncers negative", "spec.bouncers", subnet("s12"), func(o *v1.Subnet) { o.Spec.Bouncers = -2 }, subnets.Create, subnets.Get),
		updateCase("subnet cidr immutable", "spec.cidr", "val-net"+u, func(o *v1.Subnet) { o.Spec.CIDR = "10.30.1.0/25" }, subnets.Update, subnets.Get),
		updateCase("subnet vpc immutable", "spec.vpc", "val-net"+u, func(o *v1.Subnet) { o.Spec.VPC = "other" }, subnets.Update, subnets.Get),

		createCase("endpoint subnet missing", "spec.subnet", ep("e1"), func(o *v1.Endpoint) { o.Spec.Subnet = "" }, eps.Create, eps.Get),
		createCase("endpoint subnet not found", "spec.subnet", ep("e2"), func(o *v1.Endpoint) { o.Spec.Subnet = "no-such-net" }, eps.Create, eps.Get),
		createCase("endpoint mac garbage", "spec.mac", ep("e3"), func(o *v1.Endpoint) { o.Spec.MAC = "zz" }, eps.Create, eps.Get),
		createCase("endpoint mac multicast", "spec.mac", ep("e4"), func(o *v1.Endpoint) { o.Spec.MAC = "01:00:5e:00:00:01" }, eps.Create, eps.Get),
		createCase("endpoint mac upper case", "spec.mac", ep("e5"), func(o *v1.Endpoint) { o.Spec.MAC = "02:00:00:00:00:AA" }, eps.Create, eps.Get),
		createCase("endpoint ip outside subnet", "spec.ip", ep("e6"), func(o *v1.Endpoint) { o.Spec.IP = "10.30.9.9" }, eps.Create, eps.Get),
		createCase("endpoint ip is gateway", "spec.ip", ep("e7"), func(o *v1.Endpoint) { o.Spec.IP = "10.30.1.1" }, eps.Create, eps.Get),
		createCase("endpoint ip is broadcast", "spec.ip", ep("e8"), func(o *v1.Endpoint) { o.Spec.IP = "10.30.1.255" }, eps.Create, eps.Get),
		createCase("endpoint ip taken", "spec.ip", ep("e9"), func(o *v1.Endpoint) { o.Spec.IP = "10.30.1.10" }, eps.Create, eps.Get),
		createCase("endpoint ip not IPv4", "spec.ip", ep("e10"), func(o *v1.Endpoint) { o.Spec.IP = "fd00::1" }, eps.Create, eps.Get),
		createCase("endpoint interface too long", "spec.interface", ep("e11"), func(o *v1.Endpoint) { o.Spec.Interface = "a-very-long-ifname" }, eps.Create, eps.Get),
		createCase("endpoint droplet missing", "spec.droplet", ep("e12"), func(o *v1.Endpoint) { o.Spec.Droplet = "" }, eps.Create, eps.Get),
		createCase("endpoint pod bad name", "spec.pod", ep("e13"), func(o *v1.Endpoint) { o.Spec.Pod = "Pod A" }, eps.Create, eps.Get),
		updateCase("endpoint ip immutable", "spec.ip", "val-ep"+u, func(o *v1.Endpoint) { o.Spec.IP = "10.30.1.11" }, eps.Update, eps.Get),
		updateCase("endpoint subnet immutable", "spec.subnet", "val-ep"+u, func(o *v1.Endpoint) { o.Spec.Subnet = "other" }, eps.Update, eps.Get),

		createCase("divider vpc missing", "spec.vpc", fixtures.Divider("d1", "", ""), func(o *v1.Divider) {}, dividers.Create, dividers.Get),
		createCase("divider droplet bad name", "spec.droplet", fixtures.Divider("d2", "val-vpc"+u, "Node_1"), func(o *v1.Divider) {}, dividers.Create, dividers.Get),
		updateCase("divider vpc immutable", "spec.vpc", "val-div"+u, func(o *v1.Divider) { o.Spec.VPC = "other" }, dividers.Update, dividers.Get),
		createCase("bouncer subnet missing", "spec.subnet", fixtures.Bouncer("b1", "", ""), func(o *v1.Bouncer) {}, bouncers.Create, bouncers.Get),
		updateCase("bouncer subnet immutable", "spec.subnet", "val-bnc"+u, func(o *v1.Bouncer) { o.Spec.Subnet = "other" }, bouncers.Update, bouncers.Get),

		createCase("droplet node missing", "spec.node", drop("p1"), func(o *v1.Droplet) { o.Spec.Node = "" }, droplets.Create, droplets.Get),
		createCase("droplet ip invalid", "spec.ip", drop("p2"), func(o *v1.Droplet) { o.Spec.IP = "300.1.1.1" }, droplets.Create, droplets.Get),
		createCase("droplet ip IPv6", "spec.ip", drop("p3"), func(o *v1.Droplet) { o.Spec.IP = "fd00::1" }, droplets.Create, droplets.Get),
		createCase("droplet mac missing", "spec.mac", drop("p4"), func(o *v1.Droplet) { o.Spec.MAC = "" }, droplets.Create, droplets.Get),
		createCase("droplet interface with slash", "spec.interface", drop("p5"), func(o *v1.Droplet) { o.Spec.Interface = "eth/0" }, droplets.Create, droplets.Get),

		updateCase("status phase unknown", "status.phase", "val-vpc"+u, func(o *v1.Vpc) { o.Status.Phase = "Running" }, vpcs.UpdateStatus, vpcs.Get),
		updateCase("status observedGeneration ahead", "status.observedGeneration", "val-net"+u, func(o *v1.Subnet) { o.Status.ObservedGeneration = 5 }, subnets.UpdateStatus, subnets.Get),
		updateCase("status with a bad finalizer", "metadata.finalizers", "val-bnc"+u, func(o *v1.Bouncer) { o.Finalizers = []string{"no slash"} }, bouncers.UpdateStatus, bouncers.Get),
		updateCase("status condition status", "status.conditions[0].status", "val-drop"+u, func(o *v1.Droplet) {
			o.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: "Maybe", Reason: "Test", LastTransitionTime: metav1.Now()}}
		}, droplets.UpdateStatus, droplets.Get),
	}
	if len(cases) < 30 {
		t.Fatalf("only %d bad requests; the contract is at least 30", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do(ctx)
			if !apierrors.IsInvalid(err) {
				t.Fatalf("got %v, want 422 Invalid", err)
			}
			var fields []string
			for _, cause := range err.(apierrors.APIStatus).Status().Details.Causes {
				fields = append(fields, cause.Field)
			}
			if !slices.Contains(fields, tc.field) {
				t.Errorf("422 names fields %v, want %s (message: %v)", fields, tc.field, err)
			}
			ok, err := tc.unchanged(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				t.Errorf("a rejected request changed the store")
			}
		})
	}
}

func mustCreate(t *testing.T, create func() error) {
	t.Helper()
	if err := create(); err != nil {
		t.Fatal(err)
	}
}

func releaseFinalizers(t *testing.T, c typed.NetworkingV1alpha1Interface, vpc string) {
	ctx := context.Background()
	o, err := c.Vpcs().Get(ctx, vpc, metav1.GetOptions{})
	if err != nil {
		t.Errorf("releasing %s: %v", vpc, err)
		return
	}
	o.Finalizers = nil
	if _, err := c.Vpcs().Update(ctx, o, metav1.UpdateOptions{}); err != nil {
		t.Errorf("releasing %s: %v", vpc, err)
	}
}
