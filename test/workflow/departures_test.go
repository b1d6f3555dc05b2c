package workflow

import (
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
)

// Issue 18: every endpoint that leaves a host (moved to another droplet,
// or deleted) is listed in its subnet's status.departures, numbered without
// gaps, so agents that only learned where it lived forget it.
func TestDeparturesListed(t *testing.T) {
	ctx := testContext(t)
	srv := startServer(t)
	c := srv.Client.NetworkingV1alpha1()
	p := uniq("dep")
	agents := startAgents(t, ctx, srv.Client, p, 2)
	from, to := p+"-node0", p+"-node1"
	if _, err := c.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: p}, Spec: v1alpha1.VpcSpec{CIDR: "10.7.0.0/16"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: p}, Spec: v1alpha1.SubnetSpec{VPC: p, CIDR: "10.7.1.0/24"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns := uniq("ns")
	ep, err := c.Endpoints(ns).Create(ctx, &v1alpha1.Endpoint{ObjectMeta: metav1.ObjectMeta{Name: "ep"},
		Spec: v1alpha1.EndpointSpec{Subnet: p, Droplet: from, MAC: "02:42:0a:07:01:05"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "endpoint Provisioned", func() (bool, error) {
		got, err := c.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
		return err == nil && got.Status.Phase == v1alpha1.PhaseProvisioned, err
	})
	departures := func(want int) []v1alpha1.EndpointDeparture {
		t.Helper()
		var deps []v1alpha1.EndpointDeparture
		eventually(t, ctx, fmt.Sprintf("%d departures listed", want), func() (bool, error) {
			s, err := c.Subnets().Get(ctx, p, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			deps = s.Status.Departures
			return len(deps) >= want, fmt.Errorf("departures %+v", deps)
		})
		return deps
	}
	key := ns + "/ep"

	// A move: listed with the droplet it left.
	ep, err = c.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ep.Spec.Droplet = to
	if _, err := c.Endpoints(ns).Update(ctx, ep, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deps := departures(1)
	if d := deps[0]; d.Sequence != 1 || d.Endpoint != key || d.IP != ep.Spec.IP || d.Droplet != from {
		t.Errorf("after the move: departure %+v, want #1 of %s (%s) from %s", d, key, ep.Spec.IP, from)
	}

	// A delete: listed once its host and relays let it go.
	if err := c.Endpoints(ns).Delete(ctx, ep.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deps = departures(2)
	if d := deps[len(deps)-1]; d.Sequence != 2 || d.Endpoint != key || d.IP != ep.Spec.IP || d.Droplet != to {
		t.Errorf("after the delete: departure %+v, want #2 of %s (%s) from %s", d, key, ep.Spec.IP, to)
	}
	eventually(t, ctx, "endpoint gone", func() (bool, error) {
		_, err := c.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
	if got := agents[to].dp.HostEndpoints()[key]; got != "" {
		t.Errorf("host %s still programs %s", to, key)
	}

	// Many at once (a namespace deleted): every one listed, numbered
	// without gaps, the operator's workers writing the subnet together.
	const many = 24
	var keys []string
	for i := range many {
		ep, err := c.Endpoints(ns).Create(ctx, &v1alpha1.Endpoint{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("m%d", i)},
			Spec: v1alpha1.EndpointSpec{Subnet: p, Droplet: from, MAC: fmt.Sprintf("02:42:0a:07:02:%02x", i)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, ns+"/"+ep.Name)
	}
	eventually(t, ctx, "all Provisioned", func() (bool, error) {
		l, err := c.Endpoints(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range l.Items {
			if e.Status.Phase != v1alpha1.PhaseProvisioned {
				return false, fmt.Errorf("%s is %q", e.Name, e.Status.Phase)
			}
		}
		return len(l.Items) == many, nil
	})
	start := time.Now()
	if err := c.Endpoints(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	deps = departures(2 + many)
	t.Logf("%d departures listed %v after the delete", many, time.Since(start).Round(time.Millisecond))
	listed := map[string]bool{}
	for i, d := range deps {
		if i > 0 && d.Sequence != deps[i-1].Sequence+1 {
			t.Errorf("departures numbered %d then %d", deps[i-1].Sequence, d.Sequence)
		}
		listed[d.Endpoint] = true
	}
	for _, k := range keys {
		if !listed[k] {
			t.Errorf("%s not listed among %d departures", k, len(deps))
		}
	}

	// The list's rules hold against any writer: a gap in the numbering
	// (which agents would read as missed departures) is refused.
	s, err := c.Subnets().Get(ctx, p, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Status.Departures = append(s.Status.Departures, v1alpha1.EndpointDeparture{Sequence: 9, Endpoint: key, IP: "10.7.1.9", Droplet: from})
	if _, err := c.Subnets().UpdateStatus(ctx, s, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("a departure numbered 9 after 2 was not refused as invalid: %v", err)
	}
}
