// Package bouncer is the registry of bouncers.networking.mizar.dev.
package bouncer

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/generic"

	"mizar.dev/pkg/apis/networking"
	"mizar.dev/pkg/apis/networking/validation"
	"mizar.dev/pkg/registry"
	"mizar.dev/pkg/registry/networking/lifecycle"
)

var kind = lifecycle.Apply(registry.Kind[*networking.Bouncer, networking.BouncerSpec, networking.BouncerStatus]{
	Resource:       networking.Resource("bouncers"),
	Singular:       "bouncer",
	New:            func() *networking.Bouncer { return &networking.Bouncer{} },
	NewList:        func() runtime.Object { return &networking.BouncerList{} },
	Spec:           func(o *networking.Bouncer) *networking.BouncerSpec { return &o.Spec },
	Status:         func(o *networking.Bouncer) *networking.BouncerStatus { return &o.Status },
	Validate:       validation.ValidateBouncer,
	ValidateUpdate: validation.ValidateBouncerUpdate,
	Fields: map[string]func(*networking.Bouncer) string{
		"spec.subnet":  func(o *networking.Bouncer) string { return o.Spec.Subnet },
		"spec.droplet": func(o *networking.Bouncer) string { return o.Spec.Droplet },
	},
	// Node agents watch spec.droplet=<their droplet>: it routes watch events.
	IndexedFields: []string{"spec.droplet", "spec.subnet"},
	ShortNames:    []string{"mbnc"},
	Columns: []registry.Column[*networking.Bouncer]{
		{Name: "Subnet", Type: "string", Description: "The subnet the bouncer serves.", Value: func(o *networking.Bouncer) any { return o.Spec.Subnet }},
		{Name: "Droplet", Type: "string", Description: "The droplet the bouncer runs on.", Value: func(o *networking.Bouncer) any { return o.Spec.Droplet }},
	},
}, func(o *networking.Bouncer) *networking.ProvisioningStatus { return &o.Status.ProvisioningStatus })

// NewREST returns the storage of bouncers and bouncers/status.
func NewREST(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter) (*registry.REST, *registry.StatusREST, error) {
	k := *kind
	k.ValidateStatus = withWatermarks(k.ValidateStatus)
	return registry.NewREST(&k, scheme, optsGetter)
}

// withWatermarks adds the agent's watermark to the status checks: one that is
// not a resourceVersion would compare as nothing the operator waits for.
func withWatermarks(validate func(*networking.Bouncer) field.ErrorList) func(*networking.Bouncer) field.ErrorList {
	return func(o *networking.Bouncer) field.ErrorList {
		return append(validate(o), validation.ValidateWatermark(o.Status.AppliedResourceVersion, field.NewPath("status", "appliedResourceVersion"))...)
	}
}
