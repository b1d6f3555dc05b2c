package endpoint

import (
	"context"
	"encoding/binary"
	"errors"
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

// An endpoint claims its address under ip/<subnet>/<ip> and its MAC under
// mac/<subnet>/<mac>.
const (
	addressPrefix = "ip/"
	macPrefix     = "mac/"
)

var (
	ipPath  = field.NewPath("spec", "ip")
	macPath = field.NewPath("spec", "mac")
)

func claims(store *claim.Store, subnets *genericregistry.Store) *registry.Claims[*networking.Endpoint] {
	return &registry.Claims[*networking.Endpoint]{
		Store:    store,
		Keys:     keys,
		Prefixes: []string{addressPrefix, macPrefix},
		Reserve: func(ctx context.Context, r *registry.Reserver[*networking.Endpoint], ep *networking.Endpoint) (field.ErrorList, error) {
			return reserveAddress(ctx, r, subnets, ep)
		},
	}
}

func keys(ep *networking.Endpoint) []registry.Key {
	var out []registry.Key
	if ep.Spec.IP != "" {
		out = append(out, registry.Key{Key: addressPrefix + ep.Spec.Subnet + "/" + ep.Spec.IP, Path: ipPath, Value: ep.Spec.IP})
	}
	return append(out, macKeys(ep)...)
}

func macKeys(ep *networking.Endpoint) []registry.Key {
	if ep.Spec.MAC == "" {
		return nil
	}
	return []registry.Key{{Key: macPrefix + ep.Spec.Subnet + "/" + strings.ToLower(ep.Spec.MAC), Path: macPath, Value: ep.Spec.MAC}}
}

// addresses is the host range of a subnet: offsets 1..size-2 from its network
// address, less the gateway.
func addresses(s *networking.Subnet) claim.Range {
	p := netip.MustParsePrefix(s.Spec.CIDR).Masked()
	base := binary.BigEndian.Uint32(p.Addr().AsSlice())
	size := uint32(1) << (32 - p.Bits())
	r := claim.Range{
		Prefix: addressPrefix + s.Name + "/",
		Space:  s.Spec.CIDR,
		Lo:     1,
		Hi:     size - 2,
		Format: func(v uint32) string { return netip.AddrFrom4(be4(base + v)).String() },
		Parse: func(str string) (uint32, bool) {
			a, err := netip.ParseAddr(str)
			if err != nil || !a.Is4() || !p.Contains(a) {
				return 0, false
			}
			return binary.BigEndian.Uint32(a.AsSlice()) - base, true
		},
	}
	if gw, ok := r.Parse(s.Spec.Gateway); ok {
		r.Reserved = []uint32{gw}
	}
	return r
}

func be4(v uint32) (b [4]byte) {
	binary.BigEndian.PutUint32(b[:], v)
	return b
}

// reserveAddress gives an endpoint without an address the lowest free one of its
// subnet, checks a requested one, and claims the address and the MAC.
func reserveAddress(ctx context.Context, r *registry.Reserver[*networking.Endpoint], subnets *genericregistry.Store, ep *networking.Endpoint) (field.ErrorList, error) {
	// Read from etcd, not the watch cache: right after a start the cache may
	// still be filling, and one read costs less than waiting for it.
	subnet, err := registry.GetLatest[networking.Subnet](ctx, subnets, "", ep.Spec.Subnet)
	if err != nil {
		return nil, err
	}
	if errs := validation.ValidateEndpointSubnet(ep, subnet); len(errs) > 0 {
		return errs, nil
	}
	if ep.Spec.IP != "" {
		if errs := validation.ValidateEndpointAddress(ep, subnet); len(errs) > 0 {
			return errs, nil
		}
		return r.ClaimKeys(ctx, keys(ep)...)
	}
	pool := addresses(subnet)
	v, err := r.Allocate(ctx, pool, macKeys(ep), func(h claim.Holder) *field.Error {
		e := field.Duplicate(macPath, ep.Spec.MAC)
		e.Detail = fmt.Sprintf("already used in subnet %s by %s", ep.Spec.Subnet, h.Owner)
		return e
	}, func() error {
		return apierrors.NewConflict(networking.Resource("endpoints"), ep.Name, errors.New("its MAC was claimed concurrently; retry"))
	})
	if errors.Is(err, claim.ErrExhausted) {
		return field.ErrorList{field.Forbidden(ipPath, fmt.Sprintf("subnet %s (%s) has no free address", subnet.Name, subnet.Spec.CIDR))}, nil
	}
	if err != nil {
		return nil, err
	}
	ep.Spec.IP = pool.Format(v)
	return nil, nil
}
