// Package vpc is the registry of vpcs.networking.mizar.dev.
package vpc

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"

	"mizar.dev/pkg/apis/networking"
	"mizar.dev/pkg/apis/networking/validation"
	"mizar.dev/pkg/ipam"
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
// checked for uniqueness under a cluster-wide lock.
func NewREST(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter, locker registry.Locker) (*registry.REST, *registry.StatusREST, error) {
	k := *kind
	k.Relations = &registry.Relations[*networking.Vpc]{
		Locker: locker,
		Key:    func(*networking.Vpc) string { return "vpcs" },
		Check:  assignVNI,
	}
	return registry.NewREST(&k, scheme, optsGetter)
}

// assignVNI allocates the lowest free VNI to a VPC that asked for one, and checks
// that a requested VNI is not taken.
func assignVNI(ctx context.Context, vpcStore *genericregistry.Store, vpc *networking.Vpc, since string) (field.ErrorList, error) {
	vpcs, err := registry.ListSince[networking.VpcList](ctx, vpcStore, fields.Everything(), since)
	if err != nil {
		return nil, err
	}
	if vpc.Spec.VNI == 0 {
		used := make(map[int32]bool, len(vpcs.Items))
		for i := range vpcs.Items {
			used[vpcs.Items[i].Spec.VNI] = true
		}
		vni, err := ipam.FirstFreeVNI(used, validation.MaxVNI)
		if errors.Is(err, ipam.ErrExhausted) {
			return field.ErrorList{field.Forbidden(field.NewPath("spec", "vni"), "every VNI is in use")}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("allocating a VNI: %w", err)
		}
		vpc.Spec.VNI = vni
	}
	return validation.ValidateVpcRelations(vpc, vpcs.Items), nil
}
