package broker

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"

	v1 "mizar.dev/pkg/apis/broker/v1alpha1"
)

// The catalog refuses what would mislead platforms or strand orders: one
// OSB id on two classes, deleting a class or removing a plan that orders use,
// a schema with an escaped $ref; server-side apply of a class with a
// duplicated plan name is a 422, not a 500.
func TestCatalogRefusals(t *testing.T) {
	ctx := testContext(t)
	classes := shared.Client.BrokerV1alpha1().ServiceClasses()
	c := createClass(t)

	twin := c.DeepCopy()
	twin.Name, twin.ResourceVersion = c.Name+"-twin", ""
	twin.Spec.Plans[0].ID += "-twin"
	twin.Spec.Plans[1].ID = c.Spec.Plans[0].ID
	_, err := classes.Create(ctx, twin, metav1.CreateOptions{})
	if got := strings.Join(causes(t, err), ","); got != "FieldValueDuplicate spec.id,FieldValueDuplicate spec.plans[1].id" {
		t.Errorf("a class with another class's ids: %q", got)
	}

	escaped := c.DeepCopy()
	escaped.Spec.Plans[0].ParametersSchema = rawJSON(`{"type":"object","properties":{"a":{"\u0024ref":"#/definitions/x"}}}`)
	_, err = classes.Update(ctx, escaped, metav1.UpdateOptions{})
	if got := strings.Join(causes(t, err), ","); got != "FieldValueInvalid spec.plans[0].parametersSchema" || !strings.Contains(err.Error(), "$ref is not supported") {
		t.Errorf("an escaped $ref: %v", err)
	}

	dup := `{"apiVersion":"broker.mizar.dev/v1alpha1","kind":"ServiceClass","metadata":{"name":"dup-` + utilrand.String(6) + `"},"spec":{"id":"dup-` + utilrand.String(8) + `","description":"d","image":"i","plans":[` +
		`{"name":"a","id":"p1-` + utilrand.String(8) + `","description":"d","storage":"1Gi","cpu":"1","memory":"1Gi"},` +
		`{"name":"a","id":"p2-` + utilrand.String(8) + `","description":"d","storage":"1Gi","cpu":"1","memory":"1Gi"}]}}`
	_, err = classes.Patch(ctx, "dup-x", types.ApplyPatchType, []byte(dup), metav1.PatchOptions{FieldManager: "test"})
	if status, ok := err.(apierrors.APIStatus); !ok || status.Status().Code != 422 {
		t.Errorf("server-side apply of a duplicated plan name: %v, want 422", err)
	}

	ns := "team-" + utilrand.String(6)
	if _, err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, "db", c.Name, "ha", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = classes.Delete(ctx, c.Name, metav1.DeleteOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), ns+"/db") {
		t.Errorf("deleting a class an order uses: %v, want 422 naming the order", err)
	}
	lessPlans, _ := classes.Get(ctx, c.Name, metav1.GetOptions{})
	lessPlans.Spec.Plans = lessPlans.Spec.Plans[:1]
	if _, err := classes.Update(ctx, lessPlans, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "plan ha is used by") {
		t.Errorf("removing a plan an order uses: %v, want 422", err)
	}
	if err := classes.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "metadata.name=" + c.Name}); !apierrors.IsInvalid(err) {
		t.Errorf("deleting a used class by collection: %v, want 422", err)
	}
	if _, err := classes.Get(ctx, c.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the used class is gone: %v", err)
	}
	// An unused plan may go; without orders, the class may go.
	lessPlans, _ = classes.Get(ctx, c.Name, metav1.GetOptions{})
	lessPlans.Spec.Plans = lessPlans.Spec.Plans[1:]
	if _, err := classes.Update(ctx, lessPlans, metav1.UpdateOptions{}); err != nil {
		t.Errorf("removing an unused plan: %v", err)
	}
	if err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := classes.Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting an unused class: %v", err)
	}
}

// A binding needs an instance that exists, is not being deleted, and whose
// class is bindable; its parameters must satisfy the plan's binding schema.
func TestBindingRefusals(t *testing.T) {
	ctx := testContext(t)
	c := createClass(t)
	c.Spec.Plans[0].BindingParametersSchema = rawJSON(`{"type":"object","additionalProperties":false,"properties":{"readOnly":{"type":"boolean"}}}`)
	c, err := shared.Client.BrokerV1alpha1().ServiceClasses().Update(ctx, c, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns := "team-" + utilrand.String(6)
	instances := shared.Client.BrokerV1alpha1().ServiceInstances(ns)
	bindings := shared.Client.BrokerV1alpha1().ServiceBindings(ns)
	binding := func(name, instance, params string) *v1.ServiceBinding {
		b := &v1.ServiceBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.ServiceBindingSpec{Instance: instance}}
		if params != "" {
			b.Spec.Parameters = rawJSON(params)
		}
		return b
	}
	_, err = bindings.Create(ctx, binding("b0", "nosuch", ""), metav1.CreateOptions{})
	if got := strings.Join(causes(t, err), ","); got != "FieldValueNotFound spec.instance" {
		t.Errorf("a binding to a missing instance: %q", got)
	}
	if _, err := instances.Create(ctx, order(ns, "db", c.Name, "small", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for params, want := range map[string]string{
		`{"readOnly":"yes"}`: "FieldValueInvalid spec.parameters.readOnly",
		`{"other":1}`:        "FieldValueForbidden spec.parameters.other",
		`[1]`:                "FieldValueInvalid spec.parameters",
	} {
		_, err = bindings.Create(ctx, binding("b1", "db", params), metav1.CreateOptions{})
		if got := strings.Join(causes(t, err), ","); got != want {
			t.Errorf("binding parameters %s: %q, want %q", params, got, want)
		}
	}
	b, err := bindings.Create(ctx, binding("b1", "db", `{"readOnly":true}`), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.Spec.Parameters = rawJSON(`{"readOnly":false}`)
	if _, err := bindings.Update(ctx, b, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("changing a binding's parameters: %v, want 422", err)
	}
	// A plan without a binding schema takes no binding parameters.
	if _, err := instances.Create(ctx, order(ns, "db2", c.Name, "ha", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = bindings.Create(ctx, binding("b2", "db2", `{"readOnly":true}`), metav1.CreateOptions{})
	if got := strings.Join(causes(t, err), ","); got != "FieldValueForbidden spec.parameters" {
		t.Errorf("parameters for a plan without a binding schema: %q", got)
	}
	// Not bindable.
	c.Spec.Bindable = false
	if _, err := shared.Client.BrokerV1alpha1().ServiceClasses().Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = bindings.Create(ctx, binding("b3", "db2", ""), metav1.CreateOptions{})
	if got := strings.Join(causes(t, err), ","); got != "FieldValueInvalid spec.instance" || !strings.Contains(err.Error(), "not bindable") {
		t.Errorf("a binding to a non-bindable instance: %v", err)
	}
}
