// Package divider is the registry of dividers.networking.mizar.dev.
package divider

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/generic"

	"mizar.dev/pkg/apis/networking"
	"mizar.dev/pkg/apis/networking/validation"
	"mizar.dev/pkg/registry"
	"mizar.dev/pkg/registry/networking/lifecycle"
)

var kind = lifecycle.Apply(registry.Kind[*networking.Divider, networking.DividerSpec, networking.DividerStatus]{
	Resource:       networking.Resource("dividers"),
	Singular:       "divider",
	New:            func() *networking.Divider { return &networking.Divider{} },
	NewList:        func() runtime.Object { return &networking.DividerList{} },
	Spec:           func(o *networking.Divider) *networking.DividerSpec { return &o.Spec },
	Status:         func(o *networking.Divider) *networking.DividerStatus { return &o.Status },
	Validate:       validation.ValidateDivider,
	ValidateUpdate: validation.ValidateDividerUpdate,
	Fields: map[string]func(*networking.Divider) string{
		"spec.vpc":     func(o *networking.Divider) string { return o.Spec.VPC },
		"spec.droplet": func(o *networking.Divider) string { return o.Spec.Droplet },
	},
	// Node agents watch spec.droplet=<their droplet>: it routes watch events.
	IndexedFields: []string{"spec.droplet", "spec.vpc"},
	ShortNames:    []string{"mdiv"},
	Columns: []registry.Column[*networking.Divider]{
		{Name: "VPC", Type: "string", Description: "The VPC the divider serves.", Value: func(o *networking.Divider) any { return o.Spec.VPC }},
		{Name: "Droplet", Type: "string", Description: "The droplet the divider runs on.", Value: func(o *networking.Divider) any { return o.Spec.Droplet }},
	},
}, func(o *networking.Divider) *networking.ProvisioningStatus { return &o.Status.ProvisioningStatus })

// NewREST returns the storage of dividers and dividers/status.
func NewREST(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter) (*registry.REST, *registry.StatusREST, error) {
	k := *kind
	k.ValidateStatus = withWatermarks(k.ValidateStatus)
	return registry.NewREST(&k, scheme, optsGetter)
}

// withWatermarks adds the agent's watermark to the status checks: one that is
// not a resourceVersion would compare as nothing the operator waits for.
func withWatermarks(validate func(*networking.Divider) field.ErrorList) func(*networking.Divider) field.ErrorList {
	return func(o *networking.Divider) field.ErrorList {
		return append(validate(o), validation.ValidateSubnetWatermarks(o.Status.AppliedResourceVersions)...)
	}
}
