package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	v1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/test/integration/fixtures"
)

func TestFieldSelectorLists(t *testing.T) {
	ctx := testContext(t)
	u := runSuffix()
	c := client().NetworkingV1alpha1()
	for i := 0; i < 5; i++ {
		mustCreate(t, func() error {
			_, err := c.Dividers().Create(ctx, fixtures.Divider(fmt.Sprintf("sel-far-%d", i)+u, "sel-vpc"+u, "sel-far"+u), metav1.CreateOptions{})
			return err
		})
	}
	for i := 0; i < 2; i++ {
		mustCreate(t, func() error {
			_, err := c.Dividers().Create(ctx, fixtures.Divider(fmt.Sprintf("sel-near-%d", i)+u, "sel-vpc"+u, "sel-near"+u), metav1.CreateOptions{})
			return err
		})
	}

	fetchedBefore := scrapeCounter(t, ctx, `apiserver_cache_list_fetched_objects_total{group="networking.mizar.dev",index="f:spec.droplet",resource="dividers"}`)
	list, err := c.Dividers().List(ctx, metav1.ListOptions{FieldSelector: "spec.droplet=sel-near" + u})
	if err != nil {
		t.Fatal(err)
	}
	if got := dividerNames(list.Items); got != "sel-near-0"+u+",sel-near-1"+u {
		t.Errorf("spec.droplet=sel-near listed %s", got)
	}
	// Served from the watch cache through the spec.droplet index: only the two
	// matching objects were read, not every divider.
	fetched := scrapeCounter(t, ctx, `apiserver_cache_list_fetched_objects_total{group="networking.mizar.dev",index="f:spec.droplet",resource="dividers"}`) - fetchedBefore
	if fetched != 2 {
		t.Errorf("the indexed list read %v objects from the watch cache, want 2", fetched)
	}

	list, err = c.Dividers().List(ctx, metav1.ListOptions{FieldSelector: "spec.vpc=sel-vpc" + u + ",spec.droplet!=sel-near" + u})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 5 {
		t.Errorf("spec.vpc=sel-vpc,spec.droplet!=sel-near listed %d dividers, want 5", len(list.Items))
	}

	// Endpoints of one subnet across namespaces.
	mustCreate(t, func() error {
		_, err := c.Vpcs().Create(ctx, fixtures.Vpc("sel-vpc"+u, "10.60.0.0/16", 0), metav1.CreateOptions{})
		return err
	})
	for _, s := range []struct{ name, cidr string }{{"sel-a" + u, "10.60.1.0/24"}, {"sel-b" + u, "10.60.2.0/24"}} {
		mustCreate(t, func() error {
			_, err := c.Subnets().Create(ctx, fixtures.Subnet(s.name, "sel-vpc"+u, s.cidr), metav1.CreateOptions{})
			return err
		})
	}
	for _, e := range []struct{ ns, name, subnet string }{{"ns-1" + u, "ep-1", "sel-a" + u}, {"ns-2" + u, "ep-2", "sel-a" + u}, {"ns-1" + u, "ep-3", "sel-b" + u}} {
		mustCreate(t, func() error {
			_, err := c.Endpoints(e.ns).Create(ctx, fixtures.Endpoint(e.ns, e.name, e.subnet, ""), metav1.CreateOptions{})
			return err
		})
	}
	eps, err := c.Endpoints(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.subnet=sel-a" + u})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range eps.Items {
		names = append(names, e.Namespace+"/"+e.Name)
	}
	if want := "ns-1" + u + "/ep-1,ns-2" + u + "/ep-2"; strings.Join(names, ",") != want {
		t.Errorf("spec.subnet=sel-a%s listed %v, want %s", u, names, want)
	}
	subnets, err := c.Subnets().List(ctx, metav1.ListOptions{FieldSelector: "spec.vpc=sel-vpc" + u})
	if err != nil {
		t.Fatal(err)
	}
	if len(subnets.Items) != 2 {
		t.Errorf("spec.vpc=sel-vpc listed %d subnets, want 2", len(subnets.Items))
	}

	_, err = c.Dividers().List(ctx, metav1.ListOptions{FieldSelector: "spec.color=blue"})
	if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), "spec.color") {
		t.Errorf("unknown field selector: got %v, want 400 naming spec.color", err)
	}
}

func TestFieldSelectorWatch(t *testing.T) {
	ctx := testContext(t)
	u := runSuffix()
	c := client().NetworkingV1alpha1()
	list, err := c.Bouncers().List(ctx, metav1.ListOptions{FieldSelector: "spec.droplet=watch-near" + u})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Bouncers().Watch(ctx, metav1.ListOptions{FieldSelector: "spec.droplet=watch-near" + u, ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	// Events for the other droplet come first; the watcher must never see them.
	far, err := c.Bouncers().Create(ctx, fixtures.Bouncer("watch-far"+u, "watch-net"+u, "watch-far"+u), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Bouncers().Create(ctx, fixtures.Bouncer("watch-near"+u, "watch-net"+u, "watch-near"+u), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	far.Status.Phase = v1.PhaseProvisioned
	if _, err := c.Bouncers().UpdateStatus(ctx, far, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Bouncers().Delete(ctx, "watch-far"+u, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Bouncers().Delete(ctx, "watch-near"+u, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []watch.EventType{watch.Added, watch.Deleted} {
		select {
		case ev := <-w.ResultChan():
			b, ok := ev.Object.(*v1.Bouncer)
			if !ok || ev.Type != want || b.Name != "watch-near"+u {
				t.Fatalf("got %s %v, want %s of watch-near", ev.Type, ev.Object, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no %s event", want)
		}
	}
}

func dividerNames(items []v1.Divider) string {
	var names []string
	for _, d := range items {
		names = append(names, d.Name)
	}
	return strings.Join(names, ",")
}

// scrapeCounter reads one sample of the server's /metrics (0 when absent).
func scrapeCounter(t *testing.T, ctx context.Context, series string) float64 {
	t.Helper()
	body, err := client().Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("scraping /metrics: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", series, err)
			}
			return f
		}
	}
	return 0
}
