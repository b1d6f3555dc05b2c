package broker

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/yaml"

	v1 "mizar.dev/pkg/apis/broker/v1alpha1"
)

// createClass stores the shipped mysql class under a name of the test's own.
func createClass(t testing.TB) *v1.ServiceClass {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "../../../artifacts/broker/mysql-class.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c := &v1.ServiceClass{}
	if err := yaml.UnmarshalStrict(data, c); err != nil {
		t.Fatalf("artifacts/broker/mysql-class.yaml: %v", err)
	}
	c.Name = "mysql-" + utilrand.String(6)
	// OSB ids are globally unique (the server refuses a second class with
	// the shipped ones): each test's class has its own.
	suffix := utilrand.String(8)
	c.Spec.ID += "-" + suffix
	for i := range c.Spec.Plans {
		c.Spec.Plans[i].ID += "-" + suffix
	}
	c, err = shared.Client.BrokerV1alpha1().ServiceClasses().Create(testContext(t), c, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the mysql class: %v", err)
	}
	t.Cleanup(func() {
		_ = shared.Client.BrokerV1alpha1().ServiceClasses().Delete(testContext(t), c.Name, metav1.DeleteOptions{})
	})
	return c
}

func order(namespace, name, class, plan, params string) *v1.ServiceInstance {
	in := &v1.ServiceInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       v1.ServiceInstanceSpec{Class: class, Plan: plan},
	}
	if params != "" {
		in.Spec.Parameters = &k8sruntime.RawExtension{Raw: []byte(params)}
	}
	return in
}

// causes returns "reason field" for each cause of a 422, sorted.
func causes(t *testing.T, err error) []string {
	t.Helper()
	if !apierrors.IsInvalid(err) {
		t.Fatalf("want 422 Invalid, got %v", err)
	}
	var out []string
	for _, c := range err.(apierrors.APIStatus).Status().Details.Causes {
		out = append(out, string(c.Type)+" "+c.Field)
	}
	sort.Strings(out)
	return out
}

func TestClassDefaultsAndColumns(t *testing.T) {
	c := createClass(t)
	if got := c.Spec.Plans[0].MaxProvisioningDuration.Duration.String(); got != "15m0s" {
		t.Errorf("small plan maxProvisioningDuration = %s, want 15m0s", got)
	}
	bad := c.DeepCopy()
	bad.ResourceVersion = ""
	bad.Name = "bad-" + utilrand.String(6)
	bad.Spec.Plans[1].Name = bad.Spec.Plans[0].Name
	bad.Spec.Plans[0].Replicas = 99
	bad.Spec.ID, bad.Spec.Plans[0].ID, bad.Spec.Plans[1].ID = bad.Spec.ID+"-bad", bad.Spec.Plans[0].ID+"-bad", bad.Spec.Plans[1].ID+"-bad"
	_, err := shared.Client.BrokerV1alpha1().ServiceClasses().Create(testContext(t), bad, metav1.CreateOptions{})
	if got, want := strings.Join(causes(t, err), ","), "FieldValueDuplicate spec.plans[1].name,FieldValueInvalid spec.plans[0].replicas"; got != want {
		t.Errorf("causes %q, want %q", got, want)
	}
	tbl := table(t, "/apis/broker.mizar.dev/v1alpha1/serviceclasses/"+c.Name)
	if row := cells(tbl); row["Plans"] != "small,ha" || row["Bindable"] != true {
		t.Errorf("row %v", row)
	}
}

func TestOrderCheckedAgainstItsPlan(t *testing.T) {
	ctx := testContext(t)
	c := createClass(t)
	ns := "team-" + utilrand.String(6)
	instances := shared.Client.BrokerV1alpha1().ServiceInstances(ns)

	in, err := instances.Create(ctx, order(ns, "db", c.Name, "ha", `{"database":"shop","maxConnections":300}`), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a valid order: %v", err)
	}
	if in.Status.Phase != v1.PhasePending || !strings.HasPrefix(in.Status.Operation, "provision-") {
		t.Errorf("new order status %+v, want Pending with a provision operation", in.Status)
	}

	for name, tc := range map[string]struct {
		in   *v1.ServiceInstance
		want string
	}{
		"unknown class":       {order(ns, "x1", "nosuchclass", "ha", ""), "FieldValueNotFound spec.class"},
		"unknown plan":        {order(ns, "x2", c.Name, "huge", ""), "FieldValueNotSupported spec.plan"},
		"unknown parameter":   {order(ns, "x3", c.Name, "small", `{"maxConnections":30}`), "FieldValueForbidden spec.parameters.maxConnections"},
		"out of range":        {order(ns, "x4", c.Name, "ha", `{"maxConnections":1}`), "FieldValueInvalid spec.parameters.maxConnections"},
		"not an object":       {order(ns, "x5", c.Name, "ha", `"text"`), "FieldValueInvalid spec.parameters"},
		"static before class": {order(ns, "Bad_Name", "nosuchclass", "ha", ""), "FieldValueInvalid metadata.name"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := instances.Create(ctx, tc.in, metav1.CreateOptions{})
			if got := strings.Join(causes(t, err), ","); got != tc.want {
				t.Errorf("causes %q, want %q", got, tc.want)
			}
			if _, err := instances.Get(ctx, tc.in.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("a rejected order was stored: %v", err)
			}
		})
	}

	// A plan change is checked again; the stored order stays as it was.
	changed := in.DeepCopy()
	changed.Spec.Plan = "small"
	_, err = instances.Update(ctx, changed, metav1.UpdateOptions{})
	if got := strings.Join(causes(t, err), ","); got != "FieldValueForbidden spec.parameters.maxConnections" {
		t.Errorf("plan change to small keeping maxConnections: causes %q", got)
	}
	// Valid parameters, but small has other storage than ha: a StatefulSet's
	// claims cannot be resized, so the change is refused up front.
	changed.Spec.Parameters = &k8sruntime.RawExtension{Raw: []byte(`{"database":"shop"}`)}
	_, err = instances.Update(ctx, changed, metav1.UpdateOptions{})
	if got := strings.Join(causes(t, err), ","); got != "FieldValueInvalid spec.plan" || !strings.Contains(err.Error(), "storage cannot change") {
		t.Errorf("plan change to other storage: causes %q (%v)", got, err)
	}
	// A parameter change within the plan is accepted, as an update operation.
	params := in.DeepCopy()
	params.Spec.Parameters = &k8sruntime.RawExtension{Raw: []byte(`{"database":"shop","maxConnections":200}`)}
	updated, err := instances.Update(ctx, params, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("parameter change: %v", err)
	}
	if !strings.HasPrefix(updated.Status.Operation, "update-") || updated.Generation == in.Generation {
		t.Errorf("after a parameter change: operation %q, generation %d (was %d)", updated.Status.Operation, updated.Generation, in.Generation)
	}
}

func TestStatusStepsAndColumns(t *testing.T) {
	ctx := testContext(t)
	c := createClass(t)
	ns := "team-" + utilrand.String(6)
	instances := shared.Client.BrokerV1alpha1().ServiceInstances(ns)
	in, err := instances.Create(ctx, order(ns, "db", c.Name, "small", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	in.Status.Phase = v1.PhaseProvisioning
	in.Status.Steps = []v1.Step{
		{Name: "ValidatingOrder", State: v1.StepDone},
		{Name: "CreatingSecret", State: v1.StepDone},
		{Name: "CreatingStatefulSet", State: v1.StepRunning, Attempts: 2},
		{Name: "WaitingForReplicas", State: v1.StepPending},
	}
	in.Spec.Plan = "ha" // ignored by /status
	in, err = instances.UpdateStatus(ctx, in, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if in.Spec.Plan != "small" {
		t.Errorf("a status write changed spec.plan to %s", in.Spec.Plan)
	}
	row := cells(table(t, "/apis/broker.mizar.dev/v1alpha1/namespaces/"+ns+"/serviceinstances/db"))
	if row["Step"] != "3/4 CreatingStatefulSet" || row["Phase"] != "Provisioning" || row["Class"] != c.Name {
		t.Errorf("row %v", row)
	}

	in.Status.Steps[3].Name = "CreatingSecret"
	in.Status.Phase = "Done"
	_, err = instances.UpdateStatus(ctx, in, metav1.UpdateOptions{})
	if got := strings.Join(causes(t, err), ","); got != "FieldValueDuplicate status.steps[3].name,FieldValueNotSupported status.phase" {
		t.Errorf("causes %q", got)
	}

	list, err := instances.List(ctx, metav1.ListOptions{FieldSelector: "status.phase=Provisioning,spec.class=" + c.Name})
	if err != nil || len(list.Items) != 1 {
		t.Errorf("field selector: %v, %d items", err, len(list.Items))
	}
}

func TestBindingSelectedByInstance(t *testing.T) {
	ctx := testContext(t)
	ns := "team-" + utilrand.String(6)
	bindings := shared.Client.BrokerV1alpha1().ServiceBindings(ns)
	c := createClass(t)
	for _, name := range []string{"db", "cache"} {
		if _, err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, name, c.Name, "small", ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range []struct{ name, instance string }{{"app-a", "db"}, {"app-b", "db"}, {"app-c", "cache"}} {
		_, err := bindings.Create(ctx, &v1.ServiceBinding{
			ObjectMeta: metav1.ObjectMeta{Name: b.name}, Spec: v1.ServiceBindingSpec{Instance: b.instance},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	list, err := bindings.List(ctx, metav1.ListOptions{FieldSelector: "spec.instance=db"})
	if err != nil || len(list.Items) != 2 {
		t.Fatalf("bindings of db: %v, %d items", err, len(list.Items))
	}
	if list.Items[0].Status.Phase != v1.PhasePending {
		t.Errorf("new binding phase %q", list.Items[0].Status.Phase)
	}
	_, err = bindings.Create(ctx, &v1.ServiceBinding{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
	if got := strings.Join(causes(t, err), ","); got != "FieldValueInvalid spec.instance" {
		t.Errorf("causes %q", got)
	}
	if _, err := bindings.List(ctx, metav1.ListOptions{FieldSelector: "spec.secret=x"}); !apierrors.IsBadRequest(err) {
		t.Errorf("unknown field selector: %v, want 400", err)
	}
}

// table GETs path as a kubectl Table.
func table(t *testing.T, path string) *metav1.Table {
	t.Helper()
	raw, err := shared.Client.BrokerV1alpha1().RESTClient().Get().AbsPath(path).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(testContext(t))
	if err != nil {
		t.Fatalf("GET %s as Table: %v", path, err)
	}
	tbl := &metav1.Table{}
	if err := json.Unmarshal(raw, tbl); err != nil {
		t.Fatal(err)
	}
	return tbl
}

// cells maps the column names of a one-row table to the row's cells.
func cells(tbl *metav1.Table) map[string]any {
	row := map[string]any{}
	if len(tbl.Rows) != 1 {
		return row
	}
	for i, c := range tbl.ColumnDefinitions {
		row[c.Name] = tbl.Rows[0].Cells[i]
	}
	return row
}

// TestShippedExamplesAreAccepted applies artifacts/examples/broker.yaml (after the class).
func TestShippedExamplesAreAccepted(t *testing.T) {
	ctx := testContext(t)
	_, file, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "../../../artifacts/examples/broker.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(data), "\n---\n")
	in, b := &v1.ServiceInstance{}, &v1.ServiceBinding{}
	if len(docs) != 2 || yaml.UnmarshalStrict([]byte(docs[0]), in) != nil || yaml.UnmarshalStrict([]byte(docs[1]), b) != nil {
		t.Fatalf("artifacts/examples/broker.yaml: want a ServiceInstance and a ServiceBinding")
	}
	c := createClass(t)
	ns := "shop-" + utilrand.String(6)
	in.Namespace, in.Spec.Class, b.Namespace = ns, c.Name, ns
	if _, err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, in, metav1.CreateOptions{}); err != nil {
		t.Errorf("example order: %v", err)
	}
	if _, err := shared.Client.BrokerV1alpha1().ServiceBindings(ns).Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Errorf("example binding: %v", err)
	}
}
