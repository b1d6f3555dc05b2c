package vpc

import (
	"context"
	"errors"
	"strconv"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"mizar.dev/pkg/apis/networking"
	"mizar.dev/pkg/apis/networking/validation"
	"mizar.dev/pkg/claim"
	"mizar.dev/pkg/registry"
)

// vnis is every VNI a VPC can get; each is claimed under vni/<n>.
var vnis = claim.Range{
	Prefix: "vni/",
	Lo:     1,
	Hi:     validation.MaxVNI,
	Format: func(v uint32) string { return strconv.FormatUint(uint64(v), 10) },
	Parse: func(s string) (uint32, bool) {
		v, err := strconv.ParseUint(s, 10, 32)
		return uint32(v), err == nil
	},
}

func claims(store *claim.Store) *registry.Claims[*networking.Vpc] {
	return &registry.Claims[*networking.Vpc]{
		Store:    store,
		Keys:     keys,
		Prefixes: []string{vnis.Prefix},
		Reserve:  reserveVNI,
	}
}

func keys(vpc *networking.Vpc) []registry.Key {
	return []registry.Key{{
		Key:   vnis.Prefix + vnis.Format(uint32(vpc.Spec.VNI)),
		Path:  field.NewPath("spec", "vni"),
		Value: vpc.Spec.VNI,
	}}
}

// reserveVNI gives a VPC that asked for none the lowest free VNI, and claims a
// requested one (a duplicate is a 422).
func reserveVNI(ctx context.Context, r *registry.Reserver[*networking.Vpc], vpc *networking.Vpc) (field.ErrorList, error) {
	if vpc.Spec.VNI != 0 {
		return r.ClaimKeys(ctx, keys(vpc)...)
	}
	// No extra keys: a VNI another create got is simply skipped.
	v, err := r.Allocate(ctx, vnis, nil, nil, nil)
	if errors.Is(err, claim.ErrExhausted) {
		return field.ErrorList{field.Forbidden(field.NewPath("spec", "vni"), "every VNI is in use")}, nil
	}
	if err != nil {
		return nil, err
	}
	vpc.Spec.VNI = int32(v)
	return nil, nil
}
