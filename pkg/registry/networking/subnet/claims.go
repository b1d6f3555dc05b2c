package subnet

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"

	"mizar.dev/pkg/apis/networking"
	"mizar.dev/pkg/apis/networking/validation"
	"mizar.dev/pkg/claim"
	"mizar.dev/pkg/registry"
)

// A subnet claims its range under cidr/<vpc>/<cidr>. Overlap is not a property
// of one key, so a new subnet reads its VPC's claims, checks them, and writes its
// own only if no claim of that VPC was written since it read them.
const rangesPrefix = "cidr/"

func vpcPrefix(vpc string) string { return rangesPrefix + vpc + "/" }

func claims(store *claim.Store, vpcs *genericregistry.Store) *registry.Claims[*networking.Subnet] {
	return &registry.Claims[*networking.Subnet]{
		Store:    store,
		Keys:     keys,
		Prefixes: []string{rangesPrefix},
		Reserve: func(ctx context.Context, r *registry.Reserver[*networking.Subnet], s *networking.Subnet) (field.ErrorList, error) {
			return reserveRange(ctx, r, vpcs, s)
		},
	}
}

func keys(s *networking.Subnet) []registry.Key {
	return []registry.Key{{Key: vpcPrefix(s.Spec.VPC) + s.Spec.CIDR, Path: field.NewPath("spec", "cidr"), Value: s.Spec.CIDR}}
}

// reserveRange checks that a new subnet lies inside its VPC and overlaps none of
// the VPC's other subnets, and claims its range.
func reserveRange(ctx context.Context, r *registry.Reserver[*networking.Subnet], vpcs *genericregistry.Store, s *networking.Subnet) (field.ErrorList, error) {
	vpc, err := registry.GetLatest[networking.Vpc](ctx, vpcs, "", s.Spec.VPC)
	if err != nil {
		return nil, err
	}
	if errs := validation.ValidateSubnetRelations(s, vpc); len(errs) > 0 {
		return errs, nil
	}
	// Written only if the VPC is still as read: not deleted, not being deleted.
	if err := r.DependOn(ctx, vpcs, "", vpc.Name, vpc); err != nil {
		return nil, err
	}
	prefix := netip.MustParsePrefix(s.Spec.CIDR)
	own := keys(s)
	changing := func() error {
		return apierrors.NewConflict(networking.Resource("subnets"), s.Name, fmt.Errorf("the subnets of VPC %s kept changing; retry", s.Spec.VPC))
	}
	for attempt := 0; attempt < 5; attempt++ {
		holders, rev, err := r.Claims.List(ctx, vpcPrefix(s.Spec.VPC))
		if err != nil {
			return nil, registry.StorageError(err)
		}
		var overlapping []claim.Holder
		for _, h := range holders {
			other, err := netip.ParsePrefix(strings.TrimPrefix(h.Key, vpcPrefix(s.Spec.VPC)))
			if err == nil && other.Overlaps(prefix) && h.UID != r.Owner.UID {
				overlapping = append(overlapping, h)
			}
		}
		if len(overlapping) > 0 {
			errs, err := r.Resolve(ctx, overlapping, func(h claim.Holder) *field.Error {
				return field.Invalid(field.NewPath("spec", "cidr"), s.Spec.CIDR, fmt.Sprintf("overlaps subnet %s (%s) of VPC %s",
					h.Name, strings.TrimPrefix(h.Key, vpcPrefix(s.Spec.VPC)), s.Spec.VPC))
			})
			if err != nil {
				return nil, err
			}
			if len(errs) > 0 {
				return errs, nil
			}
			continue // orphans were dropped: read again
		}
		// Written with the subnet only if no subnet of the VPC was claimed since
		// the list; otherwise the create is tried again and checked against it.
		return nil, r.ClaimUnchanged(vpcPrefix(s.Spec.VPC), rev, changing, own...)
	}
	return nil, changing()
}
