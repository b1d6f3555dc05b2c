package workflow

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/storage/storagebackend"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/etcd"
	"mizar.dev/pkg/operators"
	"mizar.dev/pkg/operators/endpoint"
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

// Issue 18: a move is listed whatever the operator was doing when it
// happened, and only once the subnet's relays have applied it. The API
// server records the droplet left in the move itself
// (v1alpha1.EndpointDepartedFromAnnotation): a move made while no operator
// runs is listed when one starts. A relay that has not applied a move holds
// its listing back (a host that forgot would learn the former host again
// from it); once it has, the move is listed and the record cleared.
func TestMovesListedAfterOperatorDowntimeAndRelays(t *testing.T) {
	ctx := testContext(t)
	srv := startServer(t, "--operators=false")
	c := srv.Client.NetworkingV1alpha1()
	p := uniq("mvd")
	startOperators := func(name string) (stop func()) {
		client, err := etcd.NewClient(storagebackend.TransportConfig{
			ServerList: []string{"unix://" + filepath.Join(srv.DataDir, "etcd", "client.sock")}})
		if err != nil {
			t.Fatal(err)
		}
		octx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := operators.Run(octx, operators.Options{Config: srv.Config, Etcd: client, Identity: name, LeaseTTL: 3}); err != nil && octx.Err() == nil {
				t.Errorf("operators %s: %v", name, err)
			}
		}()
		var once sync.Once
		stop = func() { once.Do(func() { cancel(); <-done; _ = client.Close() }) }
		t.Cleanup(stop)
		return stop
	}
	stopOps := startOperators(p + "-ops1")
	agents := startAgents(t, ctx, srv.Client, p, 3)
	if _, err := c.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: p}, Spec: v1alpha1.VpcSpec{CIDR: "10.8.0.0/16"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: p}, Spec: v1alpha1.SubnetSpec{VPC: p, CIDR: "10.8.1.0/24", Bouncers: 1}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "subnet Provisioned", func() (bool, error) {
		s, err := c.Subnets().Get(ctx, p, metav1.GetOptions{})
		return err == nil && s.Status.Phase == v1alpha1.PhaseProvisioned, err
	})
	bl, err := c.Bouncers().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var bouncer v1alpha1.Bouncer
	for _, b := range bl.Items {
		if b.Spec.Subnet == p {
			bouncer = b
		}
	}
	if bouncer.Name == "" {
		t.Fatalf("no bouncer of subnet %s among %d", p, len(bl.Items))
	}
	// The endpoint moves between the two droplets that are not the bouncer's.
	var hosts []string
	for i := range 3 {
		if n := fmt.Sprintf("%s-node%d", p, i); n != bouncer.Spec.Droplet {
			hosts = append(hosts, n)
		}
	}
	from, to := hosts[0], hosts[1]
	ns := uniq("ns")
	ep, err := c.Endpoints(ns).Create(ctx, &v1alpha1.Endpoint{ObjectMeta: metav1.ObjectMeta{Name: "ep"},
		Spec: v1alpha1.EndpointSpec{Subnet: p, Droplet: from, MAC: "02:42:0a:08:01:05"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "endpoint Provisioned", func() (bool, error) {
		got, err := c.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
		return err == nil && got.Status.Phase == v1alpha1.PhaseProvisioned, err
	})
	listed := func() []v1alpha1.EndpointDeparture {
		t.Helper()
		s, err := c.Subnets().Get(ctx, p, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s.Status.Departures
	}
	move := func(droplet string) *v1alpha1.Endpoint {
		t.Helper()
		got, err := c.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got.Spec.Droplet = droplet
		// A client's value for the server's record is ignored.
		got.Annotations = map[string]string{v1alpha1.EndpointDepartedFromAnnotation: "forged"}
		moved, err := c.Endpoints(ns).Update(ctx, got, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return moved
	}
	awaitListed := func(n int, droplet string) {
		t.Helper()
		eventually(t, ctx, fmt.Sprintf("departure #%d from %s listed and the record cleared", n, droplet), func() (bool, error) {
			deps := listed()
			got, err := c.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			rec := got.Annotations[v1alpha1.EndpointDepartedFromAnnotation]
			return len(deps) == n && deps[n-1].Droplet == droplet && deps[n-1].IP == got.Spec.IP && rec == "",
				fmt.Errorf("departures %+v, record %q", deps, rec)
		})
	}

	// 1. The operator is down when the endpoint moves.
	stopOps()
	moved := move(to)
	if got := moved.Annotations[v1alpha1.EndpointDepartedFromAnnotation]; got != from {
		t.Fatalf("the move recorded departed-from %q, want %q", got, from)
	}
	time.Sleep(time.Second)
	if deps := listed(); len(deps) != 0 {
		t.Fatalf("departures %+v listed with no operator running", deps)
	}
	startOperators(p + "-ops2")
	awaitListed(1, from)

	// 2. The bouncer's agent is away when the endpoint moves back: the
	// move waits for it, and is listed once it has applied it.
	agents[bouncer.Spec.Droplet].stop()
	moved = move(from)
	if got := moved.Annotations[v1alpha1.EndpointDepartedFromAnnotation]; got != to {
		t.Fatalf("the move back recorded departed-from %q, want %q", got, to)
	}
	time.Sleep(2 * time.Second)
	if deps := listed(); len(deps) != 1 {
		t.Fatalf("departures %+v listed before bouncer %s applied the move", deps, bouncer.Name)
	}
	idx := slices.Index([]string{p + "-node0", p + "-node1", p + "-node2"}, bouncer.Spec.Droplet)
	startAgent(t, srv.Client, bouncer.Spec.Droplet, idx)
	awaitListed(2, to)
	b, err := c.Bouncers().Get(ctx, bouncer.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !endpoint.Applied(b.Status.AppliedResourceVersion, moved.ResourceVersion) {
		t.Errorf("bouncer %s's watermark %s does not cover the move (%s)", b.Name, b.Status.AppliedResourceVersion, moved.ResourceVersion)
	}
}
