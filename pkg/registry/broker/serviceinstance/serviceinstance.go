// Package serviceinstance is the registry of serviceinstances.broker.mizar.dev:
// the orders. An order is checked against its ServiceClass when it is created
// and whenever its plan or parameters change, so a stored order always names a
// plan that exists and parameters its schema accepts.
package serviceinstance

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"

	"mizar.dev/pkg/apis/broker"
	"mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/apis/broker/validation"
	"mizar.dev/pkg/claim"
	"mizar.dev/pkg/registry"
)

var kind = registry.Kind[*broker.ServiceInstance, broker.ServiceInstanceSpec, broker.ServiceInstanceStatus]{
	Resource:   broker.Resource("serviceinstances"),
	Singular:   "serviceinstance",
	Version:    v1alpha1.SchemeGroupVersion.String(),
	Namespaced: true,
	New:        func() *broker.ServiceInstance { return &broker.ServiceInstance{} },
	NewList:    func() runtime.Object { return &broker.ServiceInstanceList{} },
	Spec:       func(o *broker.ServiceInstance) *broker.ServiceInstanceSpec { return &o.Spec },
	Status:     func(o *broker.ServiceInstance) *broker.ServiceInstanceStatus { return &o.Status },
	// No Readiness: the fulfillment operator, the one writer of an order's
	// phase, writes its Ready condition with the saga's step and cause.
	// The operation id exists from the first write, so whoever placed the order
	// (kubectl or an Open Service Broker platform) can follow it at once.
	InitStatus: func(o *broker.ServiceInstance) {
		o.Status.Phase = broker.PhasePending
		o.Status.Operation = NewOperation("provision")
	},
	Validate:       validation.ValidateServiceInstance,
	ValidateUpdate: validation.ValidateServiceInstanceUpdate,
	ValidateStatus: validation.ValidateServiceInstanceStatus,
	Fields: map[string]func(*broker.ServiceInstance) string{
		"spec.class":   func(o *broker.ServiceInstance) string { return o.Spec.Class },
		"spec.subnet":  func(o *broker.ServiceInstance) string { return o.Spec.Subnet },
		"status.phase": func(o *broker.ServiceInstance) string { return string(o.Status.Phase) },
	},
	ShortNames: []string{"msi"},
	Columns: []registry.Column[*broker.ServiceInstance]{
		{Name: "Class", Type: "string", Description: "The service ordered.", Value: func(o *broker.ServiceInstance) any { return o.Spec.Class }},
		{Name: "Plan", Type: "string", Description: "The plan ordered.", Value: func(o *broker.ServiceInstance) any { return o.Spec.Plan }},
		{Name: "Step", Type: "string", Description: "The saga step in progress (or the last one), as n/total Name.", Value: func(o *broker.ServiceInstance) any { return StepSummary(&o.Status) }},
		{Name: "Phase", Type: "string", Description: "Pending, Provisioning, Provisioned, Deprovisioning or Failed.", Value: func(o *broker.ServiceInstance) any { return string(o.Status.Phase) }},
		{Name: "Subnet", Type: "string", Description: "The mizar subnet the workload runs in.", Priority: 1, Value: func(o *broker.ServiceInstance) any { return o.Spec.Subnet }},
		{Name: "Operation", Type: "string", Description: "The current asynchronous operation.", Priority: 1, Value: func(o *broker.ServiceInstance) any { return o.Status.Operation }},
	},
}

// NewOperation returns a fresh operation id for an action (provision, update, deprovision).
func NewOperation(action string) string {
	return action + "-" + utilrand.String(10)
}

// StepSummary shows where a saga is ("3/6 CreatingStatefulSet"): the step
// running or being undone; else the first one not started; once everything is
// undone, the step that failed (the one undone step that kept its message);
// once everything is done, the last step.
func StepSummary(st *broker.ServiceInstanceStatus) string {
	n := len(st.Steps)
	at := func(i int) string { return fmt.Sprintf("%d/%d %s", i+1, n, st.Steps[i].Name) }
	if n == 0 {
		return ""
	}
	for i, s := range st.Steps {
		if s.State == broker.StepRunning || s.State == broker.StepFailed || s.State == broker.StepCompensating {
			return at(i)
		}
	}
	compensated := -1
	for i, s := range st.Steps {
		if s.State == broker.StepCompensated && (compensated < 0 || s.Message != "") {
			compensated = i
		}
	}
	if compensated >= 0 {
		return at(compensated)
	}
	for i, s := range st.Steps {
		if s.State != broker.StepDone {
			return at(i)
		}
	}
	return at(n - 1)
}

// REST is the storage of orders. An order's create depends on its class as it
// read it: etcd writes the order only if the class is unchanged since, so a
// class deleted (or changed) meanwhile cannot gain an order, and the create is
// checked again against the class as it is then.
type REST struct {
	*registry.REST
	classes *genericregistry.Store
	claims  *claim.Store
}

// classTries bounds how often a create is checked again because its class
// changed under it; classes change rarely, so only one rewritten without pause
// exhausts it (409).
const classTries = 10

// Create stores a new order if its class is still as the check read it.
func (r *REST) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	return r.dependOnClass(ctx, objectName(obj), func(ctx context.Context) (runtime.Object, error) {
		return r.REST.Create(ctx, obj.DeepCopyObject(), createValidation, options)
	})
}

// Update changes an order; one that creates it (server-side apply) depends on
// its class as Create does.
func (r *REST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc,
	updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	if !forceAllowCreate {
		return r.REST.Update(ctx, name, objInfo, createValidation, updateValidation, forceAllowCreate, options)
	}
	var created bool
	out, err := r.dependOnClass(ctx, name, func(ctx context.Context) (runtime.Object, error) {
		out, c, err := r.REST.Update(ctx, name, objInfo, createValidation, updateValidation, forceAllowCreate, options)
		created = c
		return out, err
	})
	return out, created, err
}

func objectName(obj runtime.Object) string {
	if in, ok := obj.(*broker.ServiceInstance); ok {
		return in.Name
	}
	return ""
}

// dependOnClass runs create with a claim.Pending in its context, which
// BeginCreate makes depend on the class it checked, until etcd writes it or
// the class check answers.
func (r *REST) dependOnClass(ctx context.Context, name string, create func(context.Context) (runtime.Object, error)) (runtime.Object, error) {
	for try := 0; ; try++ {
		p := &claim.Pending{Owner: claim.Owner{Resource: kind.Resource.Resource, Namespace: genericapirequest.NamespaceValue(ctx), Name: name}}
		out, err := create(claim.WithPending(context.WithValue(ctx, latestClassKey{}, try > 0), p))
		var conflict *claim.ConflictError
		if !errors.As(err, &conflict) || len(conflict.Changed) == 0 {
			return out, err
		}
		if try+1 >= classTries {
			return nil, apierrors.NewConflict(kind.Resource, name, fmt.Errorf("its service class kept changing; retry: %w", err))
		}
	}
}

// latestClassKey, true in a create's context, makes its class be read from
// etcd: an earlier try found the cached one out of date.
type latestClassKey struct{}

// NewREST returns the storage of service instances and their /status. classes is
// the catalog's store, read to check plans and parameters; claims writes an
// order together with the condition that its class is unchanged.
func NewREST(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter, classes *genericregistry.Store, claims *claim.Store) (*REST, *registry.StatusREST, error) {
	k := kind
	main, status, err := registry.NewREST(&k, scheme, optsGetter)
	if err != nil {
		return nil, nil, err
	}
	r := &REST{REST: main, classes: classes, claims: claims}
	// Hooks on the main store only: /status writes never change plan or parameters.
	main.Store.BeginCreate = func(ctx context.Context, obj runtime.Object, _ *metav1.CreateOptions) (genericregistry.FinishFunc, error) {
		in := obj.(*broker.ServiceInstance)
		// Static errors first, all at once, before the class is read.
		if errs := validation.ValidateServiceInstance(in); len(errs) > 0 {
			return nil, apierrors.NewInvalid(broker.Kind("ServiceInstance"), in.Name, errs)
		}
		class, err := checkClass(ctx, classes, in)
		if err != nil {
			return nil, err
		}
		return noop, r.dependOn(ctx, in.Name, class)
	}
	main.Store.BeginUpdate = func(ctx context.Context, obj, old runtime.Object, _ *metav1.UpdateOptions) (genericregistry.FinishFunc, error) {
		in, prev := obj.(*broker.ServiceInstance), old.(*broker.ServiceInstance)
		if in.Spec.Plan == prev.Spec.Plan && apiequality.Semantic.DeepEqual(in.Spec.Parameters, prev.Spec.Parameters) {
			return noop, nil
		}
		if errs := validation.ValidateServiceInstanceUpdate(in, prev); len(errs) > 0 {
			return nil, apierrors.NewInvalid(broker.Kind("ServiceInstance"), in.Name, errs)
		}
		class, err := checkClass(ctx, classes, in)
		if err != nil {
			return nil, err
		}
		// Volume claim templates of a StatefulSet cannot change: a plan with
		// other storage would fail in the workload cluster, after the fact.
		if from, to := validation.FindPlan(class, prev.Spec.Plan), validation.FindPlan(class, in.Spec.Plan); from != nil && to != nil && from.Storage.Cmp(to.Storage) != 0 {
			return nil, apierrors.NewInvalid(broker.Kind("ServiceInstance"), in.Name, field.ErrorList{field.Invalid(field.NewPath("spec", "plan"), in.Spec.Plan,
				fmt.Sprintf("plan %q has %s of storage, plan %q %s: an instance's storage cannot change", to.Name, to.Storage.String(), from.Name, from.Storage.String()))})
		}
		return noop, nil
	}
	main.Store.UpdateStrategy = updateStrategy{main.Store.UpdateStrategy}
	// The workload name, once picked, names objects in the workload cluster.
	statusStore := status.GenericStore()
	statusStore.UpdateStrategy = statusUpdateStrategy{statusStore.UpdateStrategy}
	return r, status, nil
}

// dependOn makes the create in ctx (its claim.Pending) be written only if
// class is still at the revision read. A class being deleted gains no order.
func (r *REST) dependOn(ctx context.Context, name string, class *broker.ServiceClass) error {
	if class.DeletionTimestamp != nil {
		return apierrors.NewInvalid(broker.Kind("ServiceInstance"), name, field.ErrorList{
			field.Forbidden(field.NewPath("spec", "class"), fmt.Sprintf("service class %s is being deleted", class.Name))})
	}
	p := claim.PendingFrom(ctx)
	if p == nil || r.claims == nil {
		return nil
	}
	key, err := r.classes.KeyFunc(genericapirequest.WithNamespace(ctx, ""), class.Name)
	if err != nil {
		return fmt.Errorf("the key of service class %q: %w", class.Name, err)
	}
	rev, err := strconv.ParseInt(class.ResourceVersion, 10, 64)
	if err != nil {
		return fmt.Errorf("the resource version of service class %q: %w", class.Name, err)
	}
	p.Unchanged = append(p.Unchanged, claim.Revision{Key: r.claims.ObjectKey(key), ModRevision: rev})
	return nil
}

func noop(context.Context, bool) {}

type statusUpdateStrategy struct{ rest.RESTUpdateStrategy }

func (s statusUpdateStrategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	errs := s.RESTUpdateStrategy.ValidateUpdate(ctx, obj, old)
	return append(errs, validation.ValidateServiceInstanceStatusUpdate(obj.(*broker.ServiceInstance), old.(*broker.ServiceInstance))...)
}

// updateStrategy gives a change of plan or parameters a new operation, so
// whoever changed the order (kubectl or an OSB platform) can follow the
// update; the fulfillment operator sees the new generation and runs it.
// (BeginUpdate runs before the strategy copies the old status back.)
type updateStrategy struct{ rest.RESTUpdateStrategy }

func (s updateStrategy) PrepareForUpdate(ctx context.Context, obj, old runtime.Object) {
	s.RESTUpdateStrategy.PrepareForUpdate(ctx, obj, old)
	in, prev := obj.(*broker.ServiceInstance), old.(*broker.ServiceInstance)
	if in.Spec.Plan != prev.Spec.Plan || !apiequality.Semantic.DeepEqual(in.Spec.Parameters, prev.Spec.Parameters) {
		in.Status.Operation = NewOperation("update")
	}
}

// checkClass reads the order's class and checks plan and parameters against it.
func checkClass(ctx context.Context, classes *genericregistry.Store, in *broker.ServiceInstance) (*broker.ServiceClass, error) {
	ctx = genericapirequest.WithNamespace(ctx, "")
	// The watch cache answers without a round trip to etcd; only a class it
	// does not know yet (created a moment ago) costs a quorum read.
	latest, _ := ctx.Value(latestClassKey{}).(bool)
	opts := &metav1.GetOptions{ResourceVersion: "0"}
	if latest {
		opts.ResourceVersion = ""
	}
	obj, err := classes.Get(ctx, in.Spec.Class, opts)
	if apierrors.IsNotFound(err) && !latest {
		obj, err = classes.Get(ctx, in.Spec.Class, &metav1.GetOptions{})
	}
	if apierrors.IsNotFound(err) {
		return nil, apierrors.NewInvalid(broker.Kind("ServiceInstance"), in.Name, field.ErrorList{
			field.NotFound(field.NewPath("spec", "class"), in.Spec.Class),
		})
	}
	if err != nil {
		return nil, fmt.Errorf("reading service class %q: %w", in.Spec.Class, err)
	}
	class, ok := obj.(*broker.ServiceClass)
	if !ok {
		return nil, fmt.Errorf("reading service class %q: unexpected type %T", in.Spec.Class, obj)
	}
	if errs := validation.ValidateInstanceAgainstClass(in, class); len(errs) > 0 {
		return nil, apierrors.NewInvalid(broker.Kind("ServiceInstance"), in.Name, errs)
	}
	return class, nil
}
