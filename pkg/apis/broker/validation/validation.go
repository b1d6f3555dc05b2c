// Package validation checks broker.mizar.dev objects. Static rules look at one
// object; ValidateInstanceAgainstClass checks an order against its ServiceClass,
// which the registry reads for it.
package validation

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	openapierrors "k8s.io/kube-openapi/pkg/validation/errors"
	"k8s.io/kube-openapi/pkg/validation/spec"

	"mizar.dev/pkg/apis/broker"
)

const (
	// MaxReplicas bounds a plan's workload; a MySQL group beyond this is not a plan but a project.
	MaxReplicas = 9
	// MaxSchemaBytes is the Open Service Broker limit on a plan's parameter schema.
	MaxSchemaBytes = 64 << 10
	// MaxParametersBytes keeps an order's parameters small enough to sit in etcd beside it.
	MaxParametersBytes = 64 << 10
	// MaxInstanceName leaves room in the workload's names: the StatefulSet is named
	// after the instance and its pods' controller-revision-hash label must stay
	// within 63 characters (kube limits StatefulSet names to 52 for the same reason).
	MaxInstanceName = 52
	// MaxWorkloadName is the StatefulSet limit: its pods' controller-revision-hash
	// label is the name plus 11 characters and must fit in 63.
	MaxWorkloadName = 52
	// MaxOperationLength is the Open Service Broker limit on an operation string.
	MaxOperationLength = 10000
)

var (
	specPath   = field.NewPath("spec")
	statusPath = field.NewPath("status")
	metaPath   = field.NewPath("metadata")

	instancePhases = sets.New(broker.PhasePending, broker.PhaseProvisioning, broker.PhaseProvisioned, broker.PhaseDeprovisioning, broker.PhaseFailed)
	stepStates     = sets.New(broker.StepPending, broker.StepRunning, broker.StepDone, broker.StepFailed, broker.StepCompensating, broker.StepCompensated)
)

// ValidateServiceClass validates a service class on create.
func ValidateServiceClass(c *broker.ServiceClass) field.ErrorList {
	errs := apimachineryvalidation.ValidateObjectMeta(&c.ObjectMeta, false, apimachineryvalidation.NameIsDNSLabel, metaPath)
	errs = append(errs, validateBrokerID(c.Spec.ID, specPath.Child("id"))...)
	if strings.TrimSpace(c.Spec.Description) == "" {
		errs = append(errs, field.Required(specPath.Child("description"), "people choose services by it"))
	}
	if c.Spec.Image == "" {
		errs = append(errs, field.Required(specPath.Child("image"), "the workload's container image, e.g. mysql:8.4"))
	}
	plansPath := specPath.Child("plans")
	if len(c.Spec.Plans) == 0 {
		errs = append(errs, field.Required(plansPath, "at least one plan"))
	}
	names, ids := sets.New[string](), sets.New[string](c.Spec.ID)
	for i := range c.Spec.Plans {
		p, path := &c.Spec.Plans[i], plansPath.Index(i)
		errs = append(errs, validatePlan(p, path)...)
		if names.Has(p.Name) {
			errs = append(errs, field.Duplicate(path.Child("name"), p.Name))
		}
		if p.ID != "" && ids.Has(p.ID) {
			errs = append(errs, field.Duplicate(path.Child("id"), p.ID))
		}
		names.Insert(p.Name)
		ids.Insert(p.ID)
	}
	return errs
}

// ValidateServiceClassUpdate validates a spec update of a service class. Ids are
// what platforms remember, so they never change.
func ValidateServiceClassUpdate(c, old *broker.ServiceClass) field.ErrorList {
	errs := apimachineryvalidation.ValidateObjectMetaUpdate(&c.ObjectMeta, &old.ObjectMeta, metaPath)
	errs = append(errs, ValidateServiceClass(c)...)
	errs = append(errs, apimachineryvalidation.ValidateImmutableField(c.Spec.ID, old.Spec.ID, specPath.Child("id"))...)
	oldIDs := map[string]string{}
	for _, p := range old.Spec.Plans {
		oldIDs[p.Name] = p.ID
	}
	for i, p := range c.Spec.Plans {
		if id, ok := oldIDs[p.Name]; ok && id != p.ID {
			errs = append(errs, field.Invalid(specPath.Child("plans").Index(i).Child("id"), p.ID, fmt.Sprintf("field is immutable (was %q)", id)))
		}
	}
	return errs
}

func validatePlan(p *broker.ServicePlan, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, validateBrokerID(p.ID, path.Child("id"))...)
	for _, msg := range utilvalidation.IsDNS1123Label(p.Name) {
		errs = append(errs, field.Invalid(path.Child("name"), p.Name, msg))
	}
	if strings.TrimSpace(p.Description) == "" {
		errs = append(errs, field.Required(path.Child("description"), "people choose plans by it"))
	}
	if p.Replicas < 1 || p.Replicas > MaxReplicas {
		errs = append(errs, field.Invalid(path.Child("replicas"), p.Replicas, fmt.Sprintf("must be between 1 and %d", MaxReplicas)))
	}
	for _, q := range []struct {
		name string
		q    resource.Quantity
	}{{"storage", p.Storage}, {"cpu", p.CPU}, {"memory", p.Memory}} {
		if q.q.Sign() <= 0 {
			errs = append(errs, field.Invalid(path.Child(q.name), q.q.String(), "must be greater than zero"))
		}
	}
	if d := p.MaxProvisioningDuration; d == nil || d.Duration <= 0 {
		errs = append(errs, field.Invalid(path.Child("maxProvisioningDuration"), durationString(d), "must be a positive duration such as 30m"))
	}
	if p.ParametersSchema != nil {
		if _, err := ParseSchema(p.ParametersSchema); err != nil {
			errs = append(errs, field.Invalid(path.Child("parametersSchema"), "<schema>", err.Error()))
		}
	}
	if p.BindingParametersSchema != nil {
		if _, err := ParseSchema(p.BindingParametersSchema); err != nil {
			errs = append(errs, field.Invalid(path.Child("bindingParametersSchema"), "<schema>", err.Error()))
		}
	}
	return errs
}

// ParseSchema reads a plan's parameter schema. It must describe an object and be
// self-contained: a reference would be fetched from elsewhere at validation time.
func ParseSchema(raw *runtime.RawExtension) (*spec.Schema, error) {
	if len(raw.Raw) > MaxSchemaBytes {
		return nil, fmt.Errorf("is %d bytes; at most %d are allowed", len(raw.Raw), MaxSchemaBytes)
	}
	s := &spec.Schema{}
	if err := json.Unmarshal(raw.Raw, s); err != nil {
		return nil, fmt.Errorf("is not a JSON schema: %w", err)
	}
	if !s.Type.Contains("object") || len(s.Type) != 1 {
		return nil, errors.New(`must have "type": "object" (parameters are a JSON object)`)
	}
	if bad := checkSchema(s, "schema"); len(bad) > 0 {
		return nil, errors.New(strings.Join(bad, "; "))
	}
	return s, nil
}

// ValidateServiceInstance validates an order on create, without its class.
func ValidateServiceInstance(in *broker.ServiceInstance) field.ErrorList {
	errs := apimachineryvalidation.ValidateObjectMeta(&in.ObjectMeta, true, apimachineryvalidation.NameIsDNSLabel, metaPath)
	if len(in.Name) > MaxInstanceName {
		errs = append(errs, field.TooLong(metaPath.Child("name"), in.Name, MaxInstanceName))
	}
	errs = append(errs, validateReference(in.Spec.Class, true, specPath.Child("class"))...)
	for _, msg := range utilvalidation.IsDNS1123Label(in.Spec.Plan) {
		errs = append(errs, field.Invalid(specPath.Child("plan"), in.Spec.Plan, msg))
	}
	errs = append(errs, validateReference(in.Spec.Subnet, false, specPath.Child("subnet"))...)
	if d := in.Spec.Deadline; d != nil && d.Duration <= 0 {
		errs = append(errs, field.Invalid(specPath.Child("deadline"), d.Duration.String(), "must be a positive duration such as 15m"))
	}
	if p := in.Spec.Parameters; p != nil {
		if _, err := decodeParameters(p); err != nil {
			errs = append(errs, field.Invalid(specPath.Child("parameters"), "<parameters>", err.Error()))
		}
	}
	return errs
}

// ValidateServiceInstanceUpdate validates a spec update of an order: the plan and
// parameters may change (the registry checks them against the class again).
func ValidateServiceInstanceUpdate(in, old *broker.ServiceInstance) field.ErrorList {
	errs := apimachineryvalidation.ValidateObjectMetaUpdate(&in.ObjectMeta, &old.ObjectMeta, metaPath)
	errs = append(errs, ValidateServiceInstance(in)...)
	errs = append(errs, apimachineryvalidation.ValidateImmutableField(in.Spec.Class, old.Spec.Class, specPath.Child("class"))...)
	errs = append(errs, apimachineryvalidation.ValidateImmutableField(in.Spec.Subnet, old.Spec.Subnet, specPath.Child("subnet"))...)
	return errs
}

// ValidateInstanceAgainstClass checks that the order names a plan of its class
// and that its parameters satisfy the plan's schema. Errors name the exact field
// inside spec.parameters.
func ValidateInstanceAgainstClass(in *broker.ServiceInstance, class *broker.ServiceClass) field.ErrorList {
	plan := FindPlan(class, in.Spec.Plan)
	if plan == nil {
		valid := make([]string, 0, len(class.Spec.Plans))
		for _, p := range class.Spec.Plans {
			valid = append(valid, p.Name)
		}
		return field.ErrorList{field.NotSupported(specPath.Child("plan"), in.Spec.Plan, valid)}
	}
	return ValidateParameters(plan, in.Spec.Parameters, specPath.Child("parameters"))
}

// ValidateParameters checks an order's parameters against its plan's schema.
func ValidateParameters(plan *broker.ServicePlan, params *runtime.RawExtension, path *field.Path) field.ErrorList {
	return validateAgainst(plan.Name, plan.ParametersSchema, params, path)
}

// validateAgainst checks parameters against a schema of the plan; without a
// schema, none are allowed.
func validateAgainst(planName string, schema, params *runtime.RawExtension, path *field.Path) field.ErrorList {
	var data map[string]any
	if params != nil {
		var err error
		if data, err = decodeParameters(params); err != nil {
			return field.ErrorList{field.Invalid(path, "<parameters>", err.Error())}
		}
	}
	if schema == nil {
		if len(data) > 0 {
			return field.ErrorList{field.Forbidden(path, fmt.Sprintf("plan %s takes no parameters here", planName))}
		}
		return nil
	}
	validator, err := schemaValidators.get(schema)
	if err != nil {
		// A class stored before a rule existed may hold a schema it now
		// refuses: the order is refused (422), never served by it.
		return field.ErrorList{field.Invalid(path, "<parameters>", fmt.Sprintf("plan %s has an unusable schema (fix the ServiceClass): %v", planName, err))}
	}
	if data == nil {
		data = map[string]any{}
	}
	res := validator.Validate(data)
	var errs field.ErrorList
	for _, e := range res.Errors {
		errs = append(errs, schemaError(path, e))
	}
	// The validator walks properties in map order; a client sees a stable list.
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].Field < errs[j].Field })
	return errs
}

// schemaError turns one schema violation into a field error at its path.
func schemaError(path *field.Path, err error) *field.Error {
	var v *openapierrors.Validation
	if !errors.As(err, &v) {
		return field.Invalid(path, "<parameters>", err.Error())
	}
	p := path
	name := strings.TrimPrefix(v.Name, ".")
	if name != "" {
		for _, part := range strings.Split(name, ".") {
			p = p.Child(part)
		}
	}
	msg := strings.TrimSpace(strings.TrimPrefix(v.Error(), v.Name))
	msg = strings.TrimPrefix(msg, "in body ")
	switch v.Code() {
	case openapierrors.RequiredFailCode:
		return field.Required(p, "")
	case openapierrors.UnallowedPropertyCode:
		// The library reports the object; the unknown key is the value.
		if key, ok := v.Value.(string); ok {
			p = p.Child(key)
		}
		return field.Forbidden(p, "not a parameter of this plan")
	case openapierrors.EnumFailCode:
		valid := make([]string, 0, len(v.Values))
		for _, x := range v.Values {
			valid = append(valid, fmt.Sprint(x))
		}
		return field.NotSupported(p, v.Value, valid)
	}
	return field.Invalid(p, v.Value, msg)
}

func decodeParameters(raw *runtime.RawExtension) (map[string]any, error) {
	if len(raw.Raw) > MaxParametersBytes {
		return nil, fmt.Errorf("are %d bytes; at most %d are allowed", len(raw.Raw), MaxParametersBytes)
	}
	if len(raw.Raw) == 0 {
		return nil, nil
	}
	var data map[string]any
	if err := json.Unmarshal(raw.Raw, &data); err != nil {
		return nil, fmt.Errorf("must be a JSON object: %w", err)
	}
	return data, nil
}

// FindPlan returns the class's plan called name, or nil.
func FindPlan(class *broker.ServiceClass, name string) *broker.ServicePlan {
	for i := range class.Spec.Plans {
		if class.Spec.Plans[i].Name == name {
			return &class.Spec.Plans[i]
		}
	}
	return nil
}

// ValidateServiceInstanceStatus validates a status update of an order.
func ValidateServiceInstanceStatus(in *broker.ServiceInstance) field.ErrorList {
	st := &in.Status
	errs := validateLifecycle(st.Phase, st.ObservedGeneration, st.Conditions, in.Generation)
	if len(st.Operation) > MaxOperationLength {
		errs = append(errs, field.TooLong(statusPath.Child("operation"), "", MaxOperationLength))
	}
	names := sets.New[string]()
	for i, s := range st.Steps {
		path := statusPath.Child("steps").Index(i)
		if s.Name == "" {
			errs = append(errs, field.Required(path.Child("name"), ""))
		} else if names.Has(s.Name) {
			errs = append(errs, field.Duplicate(path.Child("name"), s.Name))
		}
		names.Insert(s.Name)
		if !stepStates.Has(s.State) {
			errs = append(errs, field.NotSupported(path.Child("state"), s.State, sets.List(stepStates)))
		}
		errs = append(errs, apimachineryvalidation.ValidateNonnegativeField(int64(s.Attempts), path.Child("attempts"))...)
	}
	if st.ConnectionSecret != "" {
		errs = append(errs, validateReference(st.ConnectionSecret, false, statusPath.Child("connectionSecret"))...)
	}
	if w := st.WorkloadName; w != "" {
		// It names a Service (DNS-1035) and a StatefulSet (at most 52).
		for _, msg := range utilvalidation.IsDNS1035Label(w) {
			errs = append(errs, field.Invalid(statusPath.Child("workloadName"), w, msg))
		}
		if len(w) > MaxWorkloadName {
			errs = append(errs, field.TooLong(statusPath.Child("workloadName"), w, MaxWorkloadName))
		}
	}
	return errs
}

// ValidateServiceInstanceStatusUpdate adds to ValidateServiceInstanceStatus
// what an update must keep: the workload name, once picked, names objects in
// the workload cluster and never changes.
func ValidateServiceInstanceStatusUpdate(in, old *broker.ServiceInstance) field.ErrorList {
	var errs field.ErrorList
	if old.Status.WorkloadName != "" && in.Status.WorkloadName != old.Status.WorkloadName {
		errs = append(errs, field.Invalid(statusPath.Child("workloadName"), in.Status.WorkloadName,
			fmt.Sprintf("field is immutable once set (was %q)", old.Status.WorkloadName)))
	}
	return errs
}

// ValidateBindingAgainstInstance checks that a binding's instance can be
// bound (its class is bindable, it is not being deleted) and that its
// parameters satisfy the instance's plan's binding schema.
func ValidateBindingAgainstInstance(b *broker.ServiceBinding, in *broker.ServiceInstance, class *broker.ServiceClass) field.ErrorList {
	instPath := specPath.Child("instance")
	switch {
	case !class.Spec.Bindable:
		return field.ErrorList{field.Invalid(instPath, b.Spec.Instance, fmt.Sprintf("service class %s is not bindable", class.Name))}
	case in.DeletionTimestamp != nil:
		return field.ErrorList{field.Invalid(instPath, b.Spec.Instance, "the instance is being deleted")}
	}
	plan := FindPlan(class, in.Spec.Plan)
	if plan == nil {
		return field.ErrorList{field.Invalid(instPath, b.Spec.Instance, fmt.Sprintf("the instance's plan %s is no longer in service class %s", in.Spec.Plan, class.Name))}
	}
	return validateAgainst(plan.Name, plan.BindingParametersSchema, b.Spec.Parameters, specPath.Child("parameters"))
}

// ValidateServiceBinding validates a binding on create.
func ValidateServiceBinding(b *broker.ServiceBinding) field.ErrorList {
	errs := apimachineryvalidation.ValidateObjectMeta(&b.ObjectMeta, true, apimachineryvalidation.NameIsDNSSubdomain, metaPath)
	for _, msg := range utilvalidation.IsDNS1123Label(b.Spec.Instance) {
		errs = append(errs, field.Invalid(specPath.Child("instance"), b.Spec.Instance, msg))
	}
	if p := b.Spec.Parameters; p != nil {
		if _, err := decodeParameters(p); err != nil {
			errs = append(errs, field.Invalid(specPath.Child("parameters"), "<parameters>", err.Error()))
		}
	}
	return errs
}

// ValidateServiceBindingUpdate validates a spec update of a binding.
func ValidateServiceBindingUpdate(b, old *broker.ServiceBinding) field.ErrorList {
	errs := apimachineryvalidation.ValidateObjectMetaUpdate(&b.ObjectMeta, &old.ObjectMeta, metaPath)
	errs = append(errs, ValidateServiceBinding(b)...)
	errs = append(errs, apimachineryvalidation.ValidateImmutableField(b.Spec.Instance, old.Spec.Instance, specPath.Child("instance"))...)
	if !apiequality.Semantic.DeepEqual(b.Spec.Parameters, old.Spec.Parameters) {
		errs = append(errs, field.Invalid(specPath.Child("parameters"), "<parameters>", "field is immutable: make another binding"))
	}
	return errs
}

// ValidateServiceBindingStatus validates a status update of a binding.
func ValidateServiceBindingStatus(b *broker.ServiceBinding) field.ErrorList {
	st := &b.Status
	errs := validateLifecycle(st.Phase, st.ObservedGeneration, st.Conditions, b.Generation)
	if st.SecretName != "" {
		errs = append(errs, validateReference(st.SecretName, false, statusPath.Child("secretName"))...)
	}
	return errs
}

func validateLifecycle(phase broker.Phase, observed int64, conds []metav1.Condition, generation int64) field.ErrorList {
	var errs field.ErrorList
	if phase != "" && !instancePhases.Has(phase) {
		errs = append(errs, field.NotSupported(statusPath.Child("phase"), phase, sets.List(instancePhases)))
	}
	ogPath := statusPath.Child("observedGeneration")
	errs = append(errs, apimachineryvalidation.ValidateNonnegativeField(observed, ogPath)...)
	if observed > generation {
		errs = append(errs, field.Invalid(ogPath, observed, fmt.Sprintf("must not exceed metadata.generation (%d)", generation)))
	}
	return append(errs, metav1validation.ValidateConditions(conds, statusPath.Child("conditions"))...)
}

// validateBrokerID checks an Open Service Broker id: non-empty, RFC 3986
// unreserved characters only, so it travels in URLs unescaped.
func validateBrokerID(id string, path *field.Path) field.ErrorList {
	if id == "" {
		return field.ErrorList{field.Required(path, "a stable, globally unique id (a GUID is recommended)")}
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-._~", r)) {
			return field.ErrorList{field.Invalid(path, id, "must contain only letters, digits, '-', '.', '_' and '~' (RFC 3986 unreserved characters)")}
		}
	}
	if len(id) > 255 {
		return field.ErrorList{field.TooLong(path, id, 255)}
	}
	return nil
}

func validateReference(name string, required bool, path *field.Path) field.ErrorList {
	if name == "" {
		if required {
			return field.ErrorList{field.Required(path, "")}
		}
		return nil
	}
	var errs field.ErrorList
	for _, msg := range apimachineryvalidation.NameIsDNSSubdomain(name, false) {
		errs = append(errs, field.Invalid(path, name, msg))
	}
	return errs
}

func durationString(d *metav1.Duration) string {
	if d == nil {
		return ""
	}
	return d.Duration.String()
}
