// Package subnet is the registry of subnets.networking.mizar.dev.
package subnet

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"

	"mizar.dev/pkg/apis/networking"
	"mizar.dev/pkg/apis/networking/validation"
	"mizar.dev/pkg/claim"
	"mizar.dev/pkg/registry"
	"mizar.dev/pkg/registry/networking/lifecycle"
)

var kind = lifecycle.Apply(registry.Kind[*networking.Subnet, networking.SubnetSpec, networking.SubnetStatus]{
	Resource:       networking.Resource("subnets"),
	Singular:       "subnet",
	New:            func() *networking.Subnet { return &networking.Subnet{} },
	NewList:        func() runtime.Object { return &networking.SubnetList{} },
	Spec:           func(o *networking.Subnet) *networking.SubnetSpec { return &o.Spec },
	Status:         func(o *networking.Subnet) *networking.SubnetStatus { return &o.Status },
	Validate:       validation.ValidateSubnet,
	ValidateUpdate: validation.ValidateSubnetUpdate,
	Fields:         map[string]func(*networking.Subnet) string{"spec.vpc": func(o *networking.Subnet) string { return o.Spec.VPC }},
	IndexedFields:  []string{"spec.vpc"},
	ShortNames:     []string{"msn"},
	Columns: []registry.Column[*networking.Subnet]{
		{Name: "VPC", Type: "string", Description: "The VPC the subnet belongs to.", Value: func(o *networking.Subnet) any { return o.Spec.VPC }},
		{Name: "CIDR", Type: "string", Description: "The subnet's address range.", Value: func(o *networking.Subnet) any { return o.Spec.CIDR }},
		{Name: "Gateway", Type: "string", Description: "The pods' default gateway.", Priority: 1, Value: func(o *networking.Subnet) any { return o.Spec.Gateway }},
		{Name: "Bouncers", Type: "integer", Description: "Bouncers serving the subnet.", Value: func(o *networking.Subnet) any { return int64(o.Spec.Bouncers) }},
	},
}, func(o *networking.Subnet) *networking.ProvisioningStatus { return &o.Status.ProvisioningStatus })

// NewREST returns the storage of subnets and subnets/status. A new subnet
// claims its range in its VPC (see claims.go), so two overlapping subnets
// created at once cannot both be stored.
func NewREST(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter, store *claim.Store, vpcs *genericregistry.Store) (*registry.REST, *registry.StatusREST, error) {
	k := *kind
	k.Claims = claims(store, vpcs)
	validate := k.ValidateStatus
	k.ValidateStatus = func(o *networking.Subnet) field.ErrorList {
		return append(validate(o), validation.ValidateSubnetDepartures(o.Status.Departures)...)
	}
	return registry.NewREST(&k, scheme, optsGetter)
}
