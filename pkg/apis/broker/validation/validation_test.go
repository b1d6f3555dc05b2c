package validation_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"mizar.dev/pkg/apis/broker"
	"mizar.dev/pkg/apis/broker/install"
	"mizar.dev/pkg/apis/broker/validation"
)

// mysqlClass decodes the shipped catalog entry, defaults and all, into the internal type.
func mysqlClass(t *testing.T) *broker.ServiceClass {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "../../../../artifacts/broker/mysql-class.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	scheme := k8sruntime.NewScheme()
	install.Install(scheme)
	obj, _, err := serializer.NewCodecFactory(scheme).UniversalDecoder(broker.SchemeGroupVersion).Decode(data, nil, nil)
	if err != nil {
		t.Fatalf("decoding mysql-class.yaml: %v", err)
	}
	return obj.(*broker.ServiceClass)
}

func TestShippedMysqlClassIsValid(t *testing.T) {
	c := mysqlClass(t)
	if errs := validation.ValidateServiceClass(c); len(errs) > 0 {
		t.Fatalf("artifacts/broker/mysql-class.yaml is invalid: %v", errs)
	}
	if len(c.Spec.Plans) < 2 {
		t.Fatalf("the mysql class offers %d plans, want at least 2", len(c.Spec.Plans))
	}
}

// fieldErrors renders errors as "type path" for exact comparison.
func fieldErrors(errs field.ErrorList) []string {
	out := make([]string, 0, len(errs))
	for _, e := range errs {
		out = append(out, string(e.Type)+" "+e.Field)
	}
	return out
}

func wantErrors(t *testing.T, errs field.ErrorList, want ...string) {
	t.Helper()
	got := fieldErrors(errs)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("errors:\n got %q\nwant %q\n(full: %v)", got, want, errs)
	}
}

func TestServiceClassRules(t *testing.T) {
	cases := map[string]struct {
		mutate func(*broker.ServiceClass)
		want   []string
	}{
		"no plans":          {func(c *broker.ServiceClass) { c.Spec.Plans = nil }, []string{"FieldValueRequired spec.plans"}},
		"duplicate plan":    {func(c *broker.ServiceClass) { c.Spec.Plans[1].Name = c.Spec.Plans[0].Name }, []string{"FieldValueDuplicate spec.plans[1].name"}},
		"duplicate plan id": {func(c *broker.ServiceClass) { c.Spec.Plans[1].ID = c.Spec.ID }, []string{"FieldValueDuplicate spec.plans[1].id"}},
		"id with a slash":   {func(c *broker.ServiceClass) { c.Spec.ID = "a/b" }, []string{"FieldValueInvalid spec.id"}},
		"no image":          {func(c *broker.ServiceClass) { c.Spec.Image = "" }, []string{"FieldValueRequired spec.image"}},
		"zero replicas":     {func(c *broker.ServiceClass) { c.Spec.Plans[0].Replicas = 0 }, []string{"FieldValueInvalid spec.plans[0].replicas"}},
		"too many replicas": {func(c *broker.ServiceClass) { c.Spec.Plans[0].Replicas = 10 }, []string{"FieldValueInvalid spec.plans[0].replicas"}},
		"no storage":        {func(c *broker.ServiceClass) { c.Spec.Plans[1].Storage.Set(0) }, []string{"FieldValueInvalid spec.plans[1].storage"}},
		"negative deadline": {func(c *broker.ServiceClass) { c.Spec.Plans[0].MaxProvisioningDuration.Duration = -time.Second }, []string{"FieldValueInvalid spec.plans[0].maxProvisioningDuration"}},
		"schema not object": {func(c *broker.ServiceClass) { c.Spec.Plans[0].ParametersSchema.Raw = []byte(`{"type":"string"}`) }, []string{"FieldValueInvalid spec.plans[0].parametersSchema"}},
		"schema not json":   {func(c *broker.ServiceClass) { c.Spec.Plans[0].ParametersSchema.Raw = []byte(`{`) }, []string{"FieldValueInvalid spec.plans[0].parametersSchema"}},
		"schema with a $ref": {func(c *broker.ServiceClass) {
			c.Spec.Plans[0].ParametersSchema.Raw = []byte(`{"type":"object","properties":{"a":{"$ref":"http://x/y"}}}`)
		}, []string{"FieldValueInvalid spec.plans[0].parametersSchema"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := mysqlClass(t)
			tc.mutate(c)
			wantErrors(t, validation.ValidateServiceClass(c), tc.want...)
		})
	}
}

func TestServiceClassIDsAreImmutable(t *testing.T) {
	old := mysqlClass(t)
	old.ResourceVersion = "1"
	c := old.DeepCopy()
	c.Spec.ID = "other"
	c.Spec.Plans[0].ID = "other-plan"
	wantErrors(t, validation.ValidateServiceClassUpdate(c, old), "FieldValueInvalid spec.id", "FieldValueInvalid spec.plans[0].id")
}

func instance(plan, params string) *broker.ServiceInstance {
	in := &broker.ServiceInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "team"},
		Spec:       broker.ServiceInstanceSpec{Class: "mysql", Plan: plan},
	}
	if params != "" {
		in.Spec.Parameters = &k8sruntime.RawExtension{Raw: []byte(params)}
	}
	return in
}

func TestParametersAgainstPlanSchema(t *testing.T) {
	c := mysqlClass(t)
	cases := map[string]struct {
		in   *broker.ServiceInstance
		want []string
	}{
		"no parameters":      {instance("small", ""), nil},
		"valid parameters":   {instance("ha", `{"database":"shop","maxConnections":200}`), nil},
		"unknown plan":       {instance("huge", ""), []string{"FieldValueNotSupported spec.plan"}},
		"unknown parameter":  {instance("small", `{"maxConnections":200}`), []string{"FieldValueForbidden spec.parameters.maxConnections"}},
		"wrong type":         {instance("ha", `{"maxConnections":"many"}`), []string{"FieldValueInvalid spec.parameters.maxConnections"}},
		"below minimum":      {instance("ha", `{"maxConnections":1}`), []string{"FieldValueInvalid spec.parameters.maxConnections"}},
		"pattern mismatch":   {instance("small", `{"database":"drop table"}`), []string{"FieldValueInvalid spec.parameters.database"}},
		"enum mismatch":      {instance("small", `{"characterSet":"ebcdic"}`), []string{"FieldValueNotSupported spec.parameters.characterSet"}},
		"two errors at once": {instance("ha", `{"database":"1x","maxConnections":9999}`), []string{"FieldValueInvalid spec.parameters.database", "FieldValueInvalid spec.parameters.maxConnections"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if errs := validation.ValidateServiceInstance(tc.in); len(errs) > 0 {
				t.Fatalf("static validation: %v", errs)
			}
			wantErrors(t, validation.ValidateInstanceAgainstClass(tc.in, c), tc.want...)
		})
	}
}

func TestServiceInstanceStaticRules(t *testing.T) {
	long := instance("small", "")
	long.Name = strings.Repeat("a", validation.MaxInstanceName+1)
	noClass := instance("small", "")
	noClass.Spec.Class = ""
	badDeadline := instance("small", "")
	badDeadline.Spec.Deadline = &metav1.Duration{Duration: -time.Minute}
	array := instance("small", `[1,2]`)
	badSubnet := instance("small", "")
	badSubnet.Spec.Subnet = "Not_A_Name"
	wantErrors(t, validation.ValidateServiceInstance(long), "FieldValueTooLong metadata.name")
	wantErrors(t, validation.ValidateServiceInstance(noClass), "FieldValueRequired spec.class")
	wantErrors(t, validation.ValidateServiceInstance(badDeadline), "FieldValueInvalid spec.deadline")
	wantErrors(t, validation.ValidateServiceInstance(array), "FieldValueInvalid spec.parameters")
	wantErrors(t, validation.ValidateServiceInstance(badSubnet), "FieldValueInvalid spec.subnet")

	old := instance("small", "")
	old.ResourceVersion = "1"
	moved := old.DeepCopy()
	moved.Spec.Class, moved.Spec.Subnet, moved.Spec.Plan = "postgres", "s1", "ha"
	wantErrors(t, validation.ValidateServiceInstanceUpdate(moved, old), "FieldValueInvalid spec.class", "FieldValueInvalid spec.subnet")
}

func TestServiceInstanceStatusRules(t *testing.T) {
	in := instance("small", "")
	in.Generation = 2
	in.Status = broker.ServiceInstanceStatus{
		Phase:              "Sleeping",
		ObservedGeneration: 3,
		Steps: []broker.Step{
			{Name: "EnsureSecret", State: broker.StepDone},
			{Name: "EnsureSecret", State: "Maybe"},
		},
	}
	wantErrors(t, validation.ValidateServiceInstanceStatus(in),
		"FieldValueNotSupported status.phase",
		"FieldValueInvalid status.observedGeneration",
		"FieldValueDuplicate status.steps[1].name",
		"FieldValueNotSupported status.steps[1].state")
}

// Schemas that cannot validate anything sensibly are refused when the class
// is stored, wherever in the schema they sit; "$ref" is found in the parsed
// schema, so spelling it with JSON escapes does not smuggle it in.
func TestPlanSchemasAreChecked(t *testing.T) {
	for name, tc := range map[string]struct {
		schema, want string
	}{
		"escaped $ref":          {`{"type":"object","properties":{"a":{"\u0024ref":"#/definitions/x"}}}`, "$ref is not supported"},
		"escaped $ref, nested":  {`{"type":"object","properties":{"a":{"type":"array","items":{"\u0024r\u0065f":"http://evil/x"}}}}`, "$ref is not supported"},
		"$ref in allOf":         {`{"type":"object","allOf":[{"$ref":"#/x"}]}`, "$ref is not supported"},
		"bad regex":             {`{"type":"object","properties":{"a":{"type":"string","pattern":"(["}}}`, "is not a regular expression"},
		"bad patternProperties": {`{"type":"object","patternProperties":{"(":{"type":"string"}}}`, "is not a regular expression"},
		"multipleOf 0":          {`{"type":"object","properties":{"a":{"type":"number","multipleOf":0}}}`, "multipleOf must be greater than 0"},
		"empty enum":            {`{"type":"object","properties":{"a":{"enum":[]}}}`, "enum must list at least one value"},
		"minimum > maximum":     {`{"type":"object","properties":{"a":{"type":"integer","minimum":5,"maximum":1}}}`, "minimum 5 is greater than maximum 1"},
		"minLength > maxLength": {`{"type":"object","properties":{"a":{"type":"string","minLength":5,"maxLength":1}}}`, "minLength 5 is greater than maxLength 1"},
		"unknown format":        {`{"type":"object","properties":{"a":{"type":"string","format":"banana"}}}`, `format "banana" is not known`},
	} {
		t.Run(name, func(t *testing.T) {
			for _, binding := range []bool{false, true} {
				c := mysqlClass(t)
				raw := &k8sruntime.RawExtension{Raw: []byte(tc.schema)}
				at := "spec.plans[0].parametersSchema"
				if binding {
					c.Spec.Plans[0].BindingParametersSchema, at = raw, "spec.plans[0].bindingParametersSchema"
				} else {
					c.Spec.Plans[0].ParametersSchema = raw
				}
				errs := validation.ValidateServiceClass(c)
				if len(errs) != 1 || errs[0].Field != at || !strings.Contains(errs[0].Detail, tc.want) {
					t.Errorf("binding=%v: %v; want one error at %s saying %q", binding, errs, at, tc.want)
				}
			}
		})
	}
	ok := mysqlClass(t)
	ok.Spec.Plans[0].ParametersSchema = &k8sruntime.RawExtension{Raw: []byte(`{"type":"object","properties":{"a":{"type":"string","format":"email","pattern":"^[a-z]+@","minLength":1,"maxLength":9},"n":{"type":"number","multipleOf":0.5,"minimum":1,"maximum":1}}}`)}
	if errs := validation.ValidateServiceClass(ok); len(errs) > 0 {
		t.Errorf("a sound schema: %v", errs)
	}
}

func TestServiceInstanceWorkloadName(t *testing.T) {
	in := instance("small", "")
	in.Generation = 1
	for name, tc := range map[string]struct {
		workload string
		want     []string
	}{
		"unset":           {"", nil},
		"DNS-1035 label":  {"mysql-abcdefghijkl", nil},
		"leading digit":   {"4mysql", []string{"FieldValueInvalid status.workloadName"}},
		"over 52":         {"a" + strings.Repeat("b", validation.MaxWorkloadName), []string{"FieldValueTooLong status.workloadName"}},
		"upper case":      {"MySQL", []string{"FieldValueInvalid status.workloadName"}},
		"a trailing dash": {"mysql-", []string{"FieldValueInvalid status.workloadName"}},
	} {
		t.Run(name, func(t *testing.T) {
			c := in.DeepCopy()
			c.Status.WorkloadName = tc.workload
			wantErrors(t, validation.ValidateServiceInstanceStatus(c), tc.want...)
		})
	}
	old := in.DeepCopy()
	old.Status.WorkloadName = "mysql-abcdefghijkl"
	renamed := old.DeepCopy()
	renamed.Status.WorkloadName = "mysql-zzzzzzzzzzzz"
	wantErrors(t, validation.ValidateServiceInstanceStatusUpdate(renamed, old), "FieldValueInvalid status.workloadName")
	unset := in.DeepCopy()
	unset.Status.WorkloadName = "mysql-abcdefghijkl"
	wantErrors(t, validation.ValidateServiceInstanceStatusUpdate(unset, in))
}
