package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	v1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/test/integration/fixtures"
)

// typedClient is what every generated typed client offers.
type typedClient[T, L any] interface {
	Create(context.Context, *T, metav1.CreateOptions) (*T, error)
	Update(context.Context, *T, metav1.UpdateOptions) (*T, error)
	UpdateStatus(context.Context, *T, metav1.UpdateOptions) (*T, error)
	Delete(context.Context, string, metav1.DeleteOptions) error
	Get(context.Context, string, metav1.GetOptions) (*T, error)
	List(context.Context, metav1.ListOptions) (*L, error)
	Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
}

// crudCase describes one kind for the lifecycle test.
type crudCase[T, L any] struct {
	client typedClient[T, L]
	obj    *T
	// changeSpec makes a valid spec change.
	changeSpec func(*T)
	spec       func(*T) any
	status     func(*T) *v1.ProvisioningStatus
	items      func(*L) []T
}

func objMeta[T any](o *T) metav1.Object { return any(o).(metav1.Object) }

// testCRUD drives one object through create, get, list, watch, spec update,
// status update, a stale update and delete.
func testCRUD[T, L any](t *testing.T, c crudCase[T, L]) {
	ctx := testContext(t)
	name := objMeta(c.obj).GetName()

	list, err := c.client.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	w, err := c.client.Watch(ctx, metav1.ListOptions{ResourceVersion: any(list).(metav1.ListInterface).GetResourceVersion()})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Stop()

	// Create: status is the server's, whatever the client sent.
	c.status(c.obj).Phase = v1.PhaseProvisioned
	created, err := c.client.Create(ctx, c.obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if got := c.status(created).Phase; got != v1.PhaseInit {
		t.Errorf("phase after create = %q, want Init", got)
	}
	if g := objMeta(created).GetGeneration(); g != 1 {
		t.Errorf("generation after create = %d, want 1", g)
	}

	got, err := c.client.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if !equality.Semantic.DeepEqual(got, created) {
		t.Errorf("get returned %+v, created %+v", got, created)
	}
	list, err = c.client.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	if !containsName(c.items(list), name) {
		t.Errorf("list does not contain %s", name)
	}

	// A spec update bumps the generation and cannot touch status.
	toUpdate := got
	c.changeSpec(toUpdate)
	c.status(toUpdate).Phase = v1.PhaseFailed
	updated, err := c.client.Update(ctx, toUpdate, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	if g := objMeta(updated).GetGeneration(); g != 2 {
		t.Errorf("generation after spec change = %d, want 2", g)
	}
	if p := c.status(updated).Phase; p != v1.PhaseInit {
		t.Errorf("spec update changed status.phase to %q", p)
	}

	// A status update cannot touch spec or the generation.
	wantSpec := c.spec(updated)
	toStatus, err := c.client.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	st := c.status(toStatus)
	st.Phase = v1.PhaseProvisioned
	st.ObservedGeneration = 2
	st.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Applied", LastTransitionTime: metav1.Now()}}
	c.changeSpec(toStatus)
	statusUpdated, err := c.client.UpdateStatus(ctx, toStatus, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update status: %v", err)
	}
	if p := c.status(statusUpdated).Phase; p != v1.PhaseProvisioned {
		t.Errorf("phase after status update = %q, want Provisioned", p)
	}
	if !equality.Semantic.DeepEqual(c.spec(statusUpdated), wantSpec) {
		t.Errorf("status update changed spec: got %+v, want %+v", c.spec(statusUpdated), wantSpec)
	}
	if g := objMeta(statusUpdated).GetGeneration(); g != 2 {
		t.Errorf("status update changed generation to %d", g)
	}

	// Writing from a stale read is a conflict, and changes nothing.
	c.changeSpec(created)
	if _, err := c.client.Update(ctx, created, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("update with stale resourceVersion: got %v, want 409 Conflict", err)
	}
	after, err := c.client.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if objMeta(after).GetResourceVersion() != objMeta(statusUpdated).GetResourceVersion() {
		t.Errorf("a rejected update changed the object")
	}

	if err := c.client.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := c.client.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("get after delete: got %v, want NotFound", err)
	}

	want := []watch.EventType{watch.Added, watch.Modified, watch.Modified, watch.Deleted}
	for i, typ := range want {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed after %d events", i)
			}
			if ev.Type != typ {
				t.Fatalf("watch event %d = %s, want %s", i, ev.Type, typ)
			}
			if n := ev.Object.(metav1.Object).GetName(); n != name {
				t.Fatalf("watch event %d for %s, want %s", i, n, name)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no watch event %d (%s)", i, typ)
		}
	}
}

func containsName[T any](items []T, name string) bool {
	for i := range items {
		if objMeta(&items[i]).GetName() == name {
			return true
		}
	}
	return false
}

func TestCRUDEveryKind(t *testing.T) {
	ctx := testContext(t)
	u := runSuffix()
	c := client().NetworkingV1alpha1()
	// Parents the relational checks require.
	if _, err := c.Vpcs().Create(ctx, fixtures.Vpc("crud-parent"+u, "10.20.0.0/16", 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Subnets().Create(ctx, fixtures.Subnet("crud-parent"+u, "crud-parent"+u, "10.20.0.0/24"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("Vpc", func(t *testing.T) {
		testCRUD(t, crudCase[v1.Vpc, v1.VpcList]{
			client: c.Vpcs(), obj: fixtures.Vpc("crud-vpc"+u, "10.21.0.0/16", 0),
			changeSpec: func(o *v1.Vpc) { o.Spec.Dividers++ },
			spec:       func(o *v1.Vpc) any { return o.Spec },
			status:     func(o *v1.Vpc) *v1.ProvisioningStatus { return &o.Status.ProvisioningStatus },
			items:      func(l *v1.VpcList) []v1.Vpc { return l.Items },
		})
	})
	t.Run("Subnet", func(t *testing.T) {
		testCRUD(t, crudCase[v1.Subnet, v1.SubnetList]{
			client: c.Subnets(), obj: fixtures.Subnet("crud-subnet"+u, "crud-parent"+u, "10.20.1.0/24"),
			changeSpec: func(o *v1.Subnet) { o.Spec.Bouncers++ },
			spec:       func(o *v1.Subnet) any { return o.Spec },
			status:     func(o *v1.Subnet) *v1.ProvisioningStatus { return &o.Status.ProvisioningStatus },
			items:      func(l *v1.SubnetList) []v1.Subnet { return l.Items },
		})
	})
	t.Run("Endpoint", func(t *testing.T) {
		testCRUD(t, crudCase[v1.Endpoint, v1.EndpointList]{
			client: c.Endpoints("crud" + u), obj: fixtures.Endpoint("crud"+u, "crud-ep"+u, "crud-parent"+u, ""),
			changeSpec: func(o *v1.Endpoint) { o.Spec.Droplet += "x" },
			spec:       func(o *v1.Endpoint) any { return o.Spec },
			status:     func(o *v1.Endpoint) *v1.ProvisioningStatus { return &o.Status.ProvisioningStatus },
			items:      func(l *v1.EndpointList) []v1.Endpoint { return l.Items },
		})
	})
	t.Run("Divider", func(t *testing.T) {
		testCRUD(t, crudCase[v1.Divider, v1.DividerList]{
			client: c.Dividers(), obj: fixtures.Divider("crud-div"+u, "crud-parent"+u, ""),
			changeSpec: func(o *v1.Divider) { o.Spec.Droplet += "d" },
			spec:       func(o *v1.Divider) any { return o.Spec },
			status:     func(o *v1.Divider) *v1.ProvisioningStatus { return &o.Status.ProvisioningStatus },
			items:      func(l *v1.DividerList) []v1.Divider { return l.Items },
		})
	})
	t.Run("Bouncer", func(t *testing.T) {
		testCRUD(t, crudCase[v1.Bouncer, v1.BouncerList]{
			client: c.Bouncers(), obj: fixtures.Bouncer("crud-bnc"+u, "crud-parent"+u, ""),
			changeSpec: func(o *v1.Bouncer) { o.Spec.Droplet += "b" },
			spec:       func(o *v1.Bouncer) any { return o.Spec },
			status:     func(o *v1.Bouncer) *v1.ProvisioningStatus { return &o.Status.ProvisioningStatus },
			items:      func(l *v1.BouncerList) []v1.Bouncer { return l.Items },
		})
	})
	t.Run("Droplet", func(t *testing.T) {
		testCRUD(t, crudCase[v1.Droplet, v1.DropletList]{
			client: c.Droplets(), obj: fixtures.Droplet("crud-drop"+u, fmt.Sprintf("192.168.%d.%d", 50+runs.Load()/200, 1+runs.Load()%200)),
			changeSpec: func(o *v1.Droplet) { o.Spec.Interface = "eth1" },
			spec:       func(o *v1.Droplet) any { return o.Spec },
			status:     func(o *v1.Droplet) *v1.ProvisioningStatus { return &o.Status.ProvisioningStatus },
			items:      func(l *v1.DropletList) []v1.Droplet { return l.Items },
		})
	})
}
