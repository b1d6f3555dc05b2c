package nodeagent

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apiserver/apiservertest"
)

// A divider's agent follows every subnet of its VPC and acknowledges each
// subnet's endpoints with that subnet's own watermark: an endpoint created in
// one subnet moves that watermark only, a quiet subnet's stays where its
// stream is (one watermark for the divider would be held there), and a
// subnet that leaves the VPC takes its watermark along.
func TestDividerWatermarksPerSubnet(t *testing.T) {
	srv := apiservertest.Start(t, t.TempDir()) // operators off: this test plays them
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := srv.Client.NetworkingV1alpha1()
	p := "dv-" + utilrand.String(5)
	dp := NewRecorder()
	a, err := New(Options{Client: srv.Client, Dataplane: dp, AckInterval: 10 * time.Millisecond, Droplet: &v1alpha1.Droplet{
		ObjectMeta: metav1.ObjectMeta{Name: p + "-node"},
		Spec:       v1alpha1.DropletSpec{Node: p, IP: "192.168.7.1", MAC: "02:00:00:00:07:01", Interface: "eth0"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	actx, stop := context.WithCancel(ctx)
	go func() { done <- a.Run(actx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}()

	if _, err := c.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: p}, Spec: v1alpha1.VpcSpec{CIDR: "10.7.0.0/16"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	subnets := []string{p + "-a", p + "-b"}
	for i, s := range subnets {
		if _, err := c.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: s},
			Spec: v1alpha1.SubnetSpec{VPC: p, CIDR: fmt.Sprintf("10.7.%d.0/24", i+1)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	div := p + "-d"
	if _, err := c.Dividers().Create(ctx, &v1alpha1.Divider{ObjectMeta: metav1.ObjectMeta{Name: div},
		Spec: v1alpha1.DividerSpec{VPC: p, Droplet: p + "-node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var d *v1alpha1.Divider
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			var err error
			d, err = c.Dividers().Get(ctx, div, metav1.GetOptions{})
			return err == nil && cond(), nil
		}); err != nil {
			t.Fatalf("waiting for %s: %v (divider status %+v)", what, err, d.Status)
		}
	}
	waitFor("the divider Provisioned with a watermark per subnet", func() bool {
		return d.Status.Phase == v1alpha1.PhaseProvisioned && len(d.Status.AppliedResourceVersions) == 2
	})
	quiet := d.Status.AppliedResourceVersion(subnets[1])

	// An awaited endpoint (the Endpoint operator's finalizer, not Provisioned)
	// in the first subnet moves the first subnet's watermark past it.
	ep, err := c.Endpoints(p).Create(ctx, &v1alpha1.Endpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "ep", Finalizers: []string{v1alpha1.OperatorFinalizer}},
		Spec:       v1alpha1.EndpointSpec{Subnet: subnets[0], Droplet: p + "-node", MAC: "02:42:0a:07:01:05"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor("the first subnet's watermark covering the endpoint", func() bool {
		return applied(d.Status.AppliedResourceVersion(subnets[0]), ep.ResourceVersion)
	})
	if got := d.Status.AppliedResourceVersion(subnets[1]); got != quiet {
		t.Errorf("the quiet subnet's watermark moved from %s to %s", quiet, got)
	}
	if applied(quiet, ep.ResourceVersion) {
		t.Errorf("the quiet subnet's watermark %s covers the endpoint's %s: this test proves nothing", quiet, ep.ResourceVersion)
	}
	if got := dp.DividerEndpoints()[div][p+"/ep"]; got != ep.Spec.IP {
		t.Errorf("divider holds %q for the endpoint, want %q", got, ep.Spec.IP)
	}

	// A subnet that goes takes its watermark and the endpoints the divider
	// held for it along (here it goes under them: no operator holds it).
	other, err := c.Endpoints(p).Create(ctx, &v1alpha1.Endpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "other"},
		Spec:       v1alpha1.EndpointSpec{Subnet: subnets[1], Droplet: p + "-node", MAC: "02:42:0a:07:02:05"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor("the divider holding the second subnet's endpoint", func() bool {
		return dp.DividerEndpoints()[div][p+"/other"] == other.Spec.IP
	})
	if err := c.Subnets().Delete(ctx, subnets[1], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("the gone subnet's watermark withdrawn", func() bool {
		return len(d.Status.AppliedResourceVersions) == 1 && d.Status.AppliedResourceVersion(subnets[0]) != ""
	})
	if _, ok := dp.Dividers()[div][subnets[1]]; ok {
		t.Errorf("divider still routes the gone subnet %s", subnets[1])
	}
	held := dp.DividerEndpoints()[div]
	if _, ok := held[p+"/other"]; ok {
		t.Errorf("divider still holds %s/other of the gone subnet", p)
	}
	if held[p+"/ep"] != ep.Spec.IP {
		t.Errorf("divider lost the first subnet's endpoint: %v", held)
	}
}

// applied reports whether watermark w covers resourceVersion rv.
func applied(w, rv string) bool {
	var a, b uint64
	_, err1 := fmt.Sscan(w, &a)
	_, err2 := fmt.Sscan(rv, &b)
	return err1 == nil && err2 == nil && a >= b
}
