// Package droplet is the registry of droplets.networking.mizar.dev.
package droplet

import (
	"context"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/generic"

	"mizar.dev/pkg/apis/networking"
	"mizar.dev/pkg/apis/networking/validation"
	"mizar.dev/pkg/claim"
	"mizar.dev/pkg/registry"
	"mizar.dev/pkg/registry/networking/lifecycle"
)

var kind = lifecycle.Apply(registry.Kind[*networking.Droplet, networking.DropletSpec, networking.DropletStatus]{
	Resource:       networking.Resource("droplets"),
	Singular:       "droplet",
	New:            func() *networking.Droplet { return &networking.Droplet{} },
	NewList:        func() runtime.Object { return &networking.DropletList{} },
	Spec:           func(o *networking.Droplet) *networking.DropletSpec { return &o.Spec },
	Status:         func(o *networking.Droplet) *networking.DropletStatus { return &o.Status },
	Validate:       validation.ValidateDroplet,
	ValidateUpdate: validation.ValidateDropletUpdate,
	Fields:         map[string]func(*networking.Droplet) string{"spec.node": func(o *networking.Droplet) string { return o.Spec.Node }},
	IndexedFields:  []string{"spec.node"},
	ShortNames:     []string{"mdrop"},
	Columns: []registry.Column[*networking.Droplet]{
		{Name: "Node", Type: "string", Description: "The Kubernetes node.", Value: func(o *networking.Droplet) any { return o.Spec.Node }},
		{Name: "IP", Type: "string", Description: "The underlay address.", Value: func(o *networking.Droplet) any { return o.Spec.IP }},
		{Name: "Interface", Type: "string", Description: "The underlay interface.", Value: func(o *networking.Droplet) any { return o.Spec.Interface }},
		{Name: "MAC", Type: "string", Description: "The underlay interface's MAC.", Priority: 1, Value: func(o *networking.Droplet) any { return o.Spec.MAC }},
	},
}, func(o *networking.Droplet) *networking.ProvisioningStatus { return &o.Status.ProvisioningStatus })

// NewREST returns the storage of droplets and droplets/status.
func NewREST(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter, store *claim.Store) (*registry.REST, *registry.StatusREST, error) {
	k := *kind
	k.ValidateStatus = withWatermarks(k.ValidateStatus)
	k.Claims = &registry.Claims[*networking.Droplet]{
		Store:    store,
		Keys:     keys,
		Prefixes: []string{addressPrefix},
		Reserve: func(ctx context.Context, r *registry.Reserver[*networking.Droplet], d *networking.Droplet) (field.ErrorList, error) {
			return r.ClaimKeys(ctx, keys(d)...)
		},
	}
	return registry.NewREST(&k, scheme, optsGetter)
}

// Two droplets never share an underlay address: each claims droplet-ip/<ip>.
const addressPrefix = "droplet-ip/"

func keys(d *networking.Droplet) []registry.Key {
	return []registry.Key{{Key: addressPrefix + d.Spec.IP, Path: field.NewPath("spec", "ip"), Value: d.Spec.IP}}
}

// withWatermarks adds the agent's watermark to the status checks: one that is
// not a resourceVersion would compare as nothing the operator waits for.
func withWatermarks(validate func(*networking.Droplet) field.ErrorList) func(*networking.Droplet) field.ErrorList {
	return func(o *networking.Droplet) field.ErrorList {
		return append(validate(o), validation.ValidateWatermark(o.Status.AppliedResourceVersion, field.NewPath("status", "appliedResourceVersion"))...)
	}
}
