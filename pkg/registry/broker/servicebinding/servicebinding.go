// Package servicebinding is the registry of servicebindings.broker.mizar.dev.
package servicebinding

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"

	"mizar.dev/pkg/apis/broker"
	"mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/apis/broker/validation"
	"mizar.dev/pkg/registry"
)

var kind = registry.Kind[*broker.ServiceBinding, broker.ServiceBindingSpec, broker.ServiceBindingStatus]{
	Resource:   broker.Resource("servicebindings"),
	Singular:   "servicebinding",
	Version:    v1alpha1.SchemeGroupVersion.String(),
	Namespaced: true,
	New:        func() *broker.ServiceBinding { return &broker.ServiceBinding{} },
	NewList:    func() runtime.Object { return &broker.ServiceBindingList{} },
	Spec:       func(o *broker.ServiceBinding) *broker.ServiceBindingSpec { return &o.Spec },
	Status:     func(o *broker.ServiceBinding) *broker.ServiceBindingStatus { return &o.Status },
	// No Readiness: the fulfillment operator writes a binding's Ready with its phase.
	InitStatus:     func(o *broker.ServiceBinding) { o.Status.Phase = broker.PhasePending },
	Validate:       validation.ValidateServiceBinding,
	ValidateUpdate: validation.ValidateServiceBindingUpdate,
	ValidateStatus: validation.ValidateServiceBindingStatus,
	Fields: map[string]func(*broker.ServiceBinding) string{
		"spec.instance": func(o *broker.ServiceBinding) string { return o.Spec.Instance },
		"status.phase":  func(o *broker.ServiceBinding) string { return string(o.Status.Phase) },
	},
	// The operator finds an instance's bindings by it.
	IndexedFields: []string{"spec.instance"},
	ShortNames:    []string{"msb"},
	Columns: []registry.Column[*broker.ServiceBinding]{
		{Name: "Instance", Type: "string", Description: "The instance bound.", Value: func(o *broker.ServiceBinding) any { return o.Spec.Instance }},
		{Name: "Secret", Type: "string", Description: "The Secret holding the credentials.", Value: func(o *broker.ServiceBinding) any { return o.Status.SecretName }},
		{Name: "Phase", Type: "string", Description: "Pending, Provisioned, Deprovisioning or Failed.", Value: func(o *broker.ServiceBinding) any { return string(o.Status.Phase) }},
	},
}

// NewREST returns the storage of service bindings and their /status. A
// binding is checked on create against its instance (which must exist and not
// be being deleted) and the instance's class (bindable; the parameters
// satisfy the plan's bindingParametersSchema): 422 otherwise.
func NewREST(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter, instances, classes *genericregistry.Store) (*registry.REST, *registry.StatusREST, error) {
	k := kind
	main, status, err := registry.NewREST(&k, scheme, optsGetter)
	if err != nil {
		return nil, nil, err
	}
	main.Store.BeginCreate = func(ctx context.Context, obj runtime.Object, _ *metav1.CreateOptions) (genericregistry.FinishFunc, error) {
		b := obj.(*broker.ServiceBinding)
		invalid := func(errs field.ErrorList) error {
			return apierrors.NewInvalid(broker.Kind("ServiceBinding"), b.Name, errs)
		}
		if errs := validation.ValidateServiceBinding(b); len(errs) > 0 {
			return nil, invalid(errs)
		}
		// From etcd, not the watch cache: an instance deleted a moment ago must not be bound.
		o, err := instances.Get(ctx, b.Spec.Instance, &metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, invalid(field.ErrorList{field.NotFound(field.NewPath("spec", "instance"), b.Spec.Instance)})
		}
		if err != nil {
			return nil, fmt.Errorf("reading service instance %q: %w", b.Spec.Instance, err)
		}
		in := o.(*broker.ServiceInstance)
		c, err := classes.Get(genericapirequest.WithNamespace(ctx, ""), in.Spec.Class, &metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, invalid(field.ErrorList{field.Invalid(field.NewPath("spec", "instance"), b.Spec.Instance, fmt.Sprintf("its service class %s does not exist", in.Spec.Class))})
		}
		if err != nil {
			return nil, fmt.Errorf("reading service class %q: %w", in.Spec.Class, err)
		}
		if errs := validation.ValidateBindingAgainstInstance(b, in, c.(*broker.ServiceClass)); len(errs) > 0 {
			return nil, invalid(errs)
		}
		return func(context.Context, bool) {}, nil
	}
	return main, status, nil
}
