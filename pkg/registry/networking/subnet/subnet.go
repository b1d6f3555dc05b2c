// Package subnet is the registry of subnets.networking.mizar.dev.
package subnet

import (
	"context"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"

	"mizar.dev/pkg/apis/networking"
	"mizar.dev/pkg/apis/networking/validation"
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

// NewREST returns the storage of subnets and subnets/status. A new subnet is
// checked against its VPC and siblings under the VPC's lock, so two overlapping
// subnets created at once cannot both be stored.
func NewREST(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter, locker registry.Locker, vpcs *genericregistry.Store) (*registry.REST, *registry.StatusREST, error) {
	k := *kind
	k.Relations = &registry.Relations[*networking.Subnet]{
		Locker: locker,
		Key:    func(s *networking.Subnet) string { return "subnets/" + s.Spec.VPC },
		Check: func(ctx context.Context, subnets *genericregistry.Store, s *networking.Subnet, since string) (field.ErrorList, error) {
			return checkPlacement(ctx, vpcs, subnets, s, since)
		},
	}
	return registry.NewREST(&k, scheme, optsGetter)
}

// checkPlacement checks that a new subnet fits inside its VPC beside its siblings.
func checkPlacement(ctx context.Context, vpcs, subnets *genericregistry.Store, s *networking.Subnet, since string) (field.ErrorList, error) {
	vpc, err := registry.GetLatest[networking.Vpc](ctx, vpcs, "", s.Spec.VPC)
	if err != nil {
		return nil, err
	}
	siblings, err := registry.ListSince[networking.SubnetList](ctx, subnets, fields.OneTermEqualSelector("spec.vpc", s.Spec.VPC), since)
	if err != nil {
		return nil, err
	}
	return validation.ValidateSubnetRelations(s, vpc, siblings.Items), nil
}
