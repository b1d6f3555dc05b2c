package workflow

import (
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/operators/endpoint"
)

// A droplet that relays for none of a VPC sends cross-subnet packets through
// the VPC's dividers, so an endpoint is Provisioned only once they have
// applied it too, and its deletion waits for them as well. The divider's agent
// is stopped while its host and bouncer apply it: the endpoint waits, and
// goes on when that agent comes back.
func TestEndpointWaitsForDividers(t *testing.T) {
	ctx := testContext(t)
	srv := startServer(t)
	c := srv.Client.NetworkingV1alpha1()
	p := uniq("dw")
	agents := startAgents(t, ctx, srv.Client, p, 3)
	index := map[string]int{} // droplet -> its number, to start its agent again
	for i := range 3 {
		index[fmt.Sprintf("%s-node%d", p, i)] = i
	}
	vpc, err := c.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: p}, Spec: v1alpha1.VpcSpec{CIDR: "10.6.0.0/16"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var subs []*v1alpha1.Subnet
	for i := range 2 {
		s, err := c.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", p, i)},
			Spec: v1alpha1.SubnetSpec{VPC: vpc.Name, CIDR: fmt.Sprintf("10.6.%d.0/24", i+1)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	divName := vpc.Name + "-d-0"
	var div *v1alpha1.Divider
	eventually(t, ctx, "subnets Provisioned and the divider holding both", func() (bool, error) {
		for _, s := range subs {
			s, err := c.Subnets().Get(ctx, s.Name, metav1.GetOptions{})
			if err != nil || s.Status.Phase != v1alpha1.PhaseProvisioned {
				return false, err
			}
		}
		div, err = c.Dividers().Get(ctx, divName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return div.Status.Phase == v1alpha1.PhaseProvisioned && div.Status.AppliedResourceVersion(subs[0].Name) != "" &&
			div.Status.AppliedResourceVersion(subs[1].Name) != "", nil
	})
	if got := phaseManager(div); got != "mizar-nodeagent" {
		t.Errorf("divider's phase written by %q, want mizar-nodeagent", got)
	}
	divDroplet := div.Spec.Droplet
	// The endpoint's host and its subnet's bouncer are other droplets than the
	// divider's, so only the divider can hold it back.
	sub := subs[0]
	bouncer, err := c.Bouncers().Get(ctx, sub.Name+"-b-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if bouncer.Spec.Droplet == divDroplet {
		t.Fatalf("bouncer %s placed with the divider on %s while other droplets were free", bouncer.Name, divDroplet)
	}
	host := bouncer.Spec.Droplet

	agents[divDroplet].stop()
	ns := uniq("ns")
	ep, err := c.Endpoints(ns).Create(ctx, &v1alpha1.Endpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "ep"},
		Spec:       v1alpha1.EndpointSpec{Subnet: sub.Name, Droplet: host, MAC: "02:42:0a:06:00:01"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	key := ns + "/" + ep.Name
	// applied reports whether the host and the bouncer have applied version rv
	// of the endpoint.
	applied := func(rv string) (bool, error) {
		d, err := c.Droplets().Get(ctx, host, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		b, err := c.Bouncers().Get(ctx, bouncer.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return endpoint.Applied(d.Status.AppliedResourceVersion, rv) && endpoint.Applied(b.Status.AppliedResourceVersion, rv), nil
	}
	eventually(t, ctx, "host and bouncer applied the endpoint", func() (bool, error) { return applied(ep.ResourceVersion) })
	// The operator reacts to a watermark within milliseconds; give it a while.
	time.Sleep(time.Second)
	e, err := c.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if e.Status.Phase == v1alpha1.PhaseProvisioned {
		t.Fatalf("endpoint Provisioned while the divider's agent is stopped (host and bouncer applied it)")
	}
	if got := agents[host].dp.HostEndpoints()[key]; got != e.Spec.IP {
		t.Errorf("host holds %q for the endpoint, want %q", got, e.Spec.IP)
	}

	// The divider's agent comes back: it lists the endpoint, acknowledges it,
	// and the endpoint is Provisioned.
	back := startAgent(t, srv.Client, divDroplet, index[divDroplet])
	agents[divDroplet] = back
	eventually(t, ctx, "endpoint Provisioned once the divider applied it", func() (bool, error) {
		e, err := c.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
		return err == nil && e.Status.Phase == v1alpha1.PhaseProvisioned, err
	})
	if got := back.dp.DividerEndpoints()[divName][key]; got != e.Spec.IP {
		t.Errorf("divider holds %q for the endpoint, want %q", got, e.Spec.IP)
	}
	e, err = c.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cond := condition(e.Status.Conditions, endpoint.ConditionApplied); cond == nil || cond.Reason != endpoint.ReasonApplied {
		t.Errorf("Applied condition %+v, want reason %s", cond, endpoint.ReasonApplied)
	}

	// Deletion waits for the divider as well: with its agent stopped, the
	// host and the bouncer remove the endpoint but it stays.
	agents[divDroplet].stop()
	if err := c.Endpoints(ns).Delete(ctx, ep.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e, err = c.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("endpoint deleted before the divider removed it: %v", err)
	}
	eventually(t, ctx, "host and bouncer removed the endpoint", func() (bool, error) { return applied(e.ResourceVersion) })
	time.Sleep(time.Second)
	if _, err := c.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("endpoint deleted before the divider removed it: %v", err)
	}
	if _, ok := agents[host].dp.HostEndpoints()[key]; ok {
		t.Error("host still holds the deleted endpoint")
	}
	startAgent(t, srv.Client, divDroplet, index[divDroplet])
	eventually(t, ctx, "endpoint gone once the divider removed it", func() (bool, error) {
		_, err := c.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}
