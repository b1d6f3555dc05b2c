// Package servicebinding is the registry of servicebindings.broker.mizar.dev.
package servicebinding

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/generic"

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

// NewREST returns the storage of service bindings and their /status.
func NewREST(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter) (*registry.REST, *registry.StatusREST, error) {
	k := kind
	return registry.NewREST(&k, scheme, optsGetter)
}
