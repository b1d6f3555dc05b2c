// Package vpc is the registry of vpcs.networking.mizar.dev.
package vpc

import (
	"strconv"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/generic"

	"mizar.dev/pkg/apis/networking"
	"mizar.dev/pkg/apis/networking/validation"
	"mizar.dev/pkg/claim"
	"mizar.dev/pkg/registry"
	"mizar.dev/pkg/registry/networking/lifecycle"
)

var kind = lifecycle.Apply(registry.Kind[*networking.Vpc, networking.VpcSpec, networking.VpcStatus]{
	Resource:       networking.Resource("vpcs"),
	Singular:       "vpc",
	New:            func() *networking.Vpc { return &networking.Vpc{} },
	NewList:        func() runtime.Object { return &networking.VpcList{} },
	Spec:           func(o *networking.Vpc) *networking.VpcSpec { return &o.Spec },
	Status:         func(o *networking.Vpc) *networking.VpcStatus { return &o.Status },
	Validate:       validation.ValidateVpc,
	ValidateUpdate: validation.ValidateVpcUpdate,
	Fields: map[string]func(*networking.Vpc) string{
		"spec.vni": func(o *networking.Vpc) string { return strconv.Itoa(int(o.Spec.VNI)) },
	},
	IndexedFields: []string{"spec.vni"},
	ShortNames:    []string{"mvpc"},
	Columns: []registry.Column[*networking.Vpc]{
		{Name: "CIDR", Type: "string", Description: "The VPC's address range.", Value: func(o *networking.Vpc) any { return o.Spec.CIDR }},
		{Name: "VNI", Type: "integer", Description: "The Geneve VNI carrying the VPC's traffic.", Value: func(o *networking.Vpc) any { return int64(o.Spec.VNI) }},
		{Name: "Dividers", Type: "integer", Description: "Dividers routing between the VPC's subnets.", Value: func(o *networking.Vpc) any { return int64(o.Spec.Dividers) }},
	},
}, func(o *networking.Vpc) *networking.ProvisioningStatus { return &o.Status.ProvisioningStatus })

// NewREST returns the storage of vpcs and vpcs/status. VNIs are allocated and
// kept unique through claims (see claims.go).
func NewREST(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter, store *claim.Store) (*registry.REST, *registry.StatusREST, error) {
	k := *kind
	k.Claims = claims(store)
	return registry.NewREST(&k, scheme, optsGetter)
}
