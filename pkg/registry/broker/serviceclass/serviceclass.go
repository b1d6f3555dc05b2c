// Package serviceclass is the registry of serviceclasses.broker.mizar.dev, the
// broker's catalog.
package serviceclass

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/generic"

	"mizar.dev/pkg/apis/broker"
	"mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/apis/broker/validation"
	"mizar.dev/pkg/registry"
)

var kind = registry.Kind[*broker.ServiceClass, broker.ServiceClassSpec, broker.ServiceClassStatus]{
	Resource: broker.Resource("serviceclasses"),
	Singular: "serviceclass",
	Version:  v1alpha1.SchemeGroupVersion.String(),
	New:      func() *broker.ServiceClass { return &broker.ServiceClass{} },
	NewList:  func() runtime.Object { return &broker.ServiceClassList{} },
	Spec:     func(o *broker.ServiceClass) *broker.ServiceClassSpec { return &o.Spec },
	Status:   func(o *broker.ServiceClass) *broker.ServiceClassStatus { return &o.Status },
	// A catalog entry is usable once stored (validated, its schemas compiled):
	// Ready from its create, so `kubectl wait --for=condition=Ready` works on it too.
	Readiness: func(o *broker.ServiceClass) (*[]metav1.Condition, string, bool) {
		return &o.Status.Conditions, "", true
	},
	Validate:       validation.ValidateServiceClass,
	ValidateUpdate: validation.ValidateServiceClassUpdate,
	ValidateStatus: func(*broker.ServiceClass) field.ErrorList { return nil },
	Fields:         map[string]func(*broker.ServiceClass) string{"spec.id": func(o *broker.ServiceClass) string { return o.Spec.ID }},
	ShortNames:     []string{"msc"},
	Columns: []registry.Column[*broker.ServiceClass]{
		{Name: "Plans", Type: "string", Description: "The plans the service is offered in.", Value: func(o *broker.ServiceClass) any { return planNames(o) }},
		{Name: "Bindable", Type: "boolean", Description: "Whether credentials can be bound.", Value: func(o *broker.ServiceClass) any { return o.Spec.Bindable }},
		{Name: "Image", Type: "string", Description: "The workload's container image.", Priority: 1, Value: func(o *broker.ServiceClass) any { return o.Spec.Image }},
		{Name: "ID", Type: "string", Description: "The Open Service Broker id.", Priority: 1, Value: func(o *broker.ServiceClass) any { return o.Spec.ID }},
	},
}

func planNames(c *broker.ServiceClass) string {
	s := ""
	for i, p := range c.Spec.Plans {
		if i > 0 {
			s += ","
		}
		s += p.Name
	}
	return s
}

// NewREST returns the storage of service classes. A catalog entry has no status
// subresource: its only status is the Ready condition the server sets on create.
func NewREST(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter) (*registry.REST, error) {
	k := kind
	main, _, err := registry.NewREST(&k, scheme, optsGetter)
	return main, err
}
