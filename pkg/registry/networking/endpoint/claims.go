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

func claims(store *claim.Store, subnets, droplets *genericregistry.Store) *registry.Claims[*networking.Endpoint] {
	return &registry.Claims[*networking.Endpoint]{
		Store:    store,
		Keys:     keys,
		Prefixes: []string{addressPrefix, macPrefix},
		Reserve: func(ctx context.Context, r *registry.Reserver[*networking.Endpoint], ep *networking.Endpoint) (field.ErrorList, error) {
			subnet, errs, err := dependOnParents(ctx, r, subnets, droplets, ep)
			if err != nil || len(errs) > 0 {
				return errs, err
			}
			return reserveAddress(ctx, r, subnet, ep)
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

// dependOnParents checks the endpoint's subnet and droplet, and makes the
// create depend on both as read (Reserver.DependOn): a subnet or droplet
// deleted, or marked for deletion, after this check refuses the create in etcd,
// and its next try answers that it is being deleted. A droplet not registered
// (yet) may be named, but then it must still be absent when the endpoint is
// written. It returns the subnet.
func dependOnParents(ctx context.Context, r *registry.Reserver[*networking.Endpoint], subnets, droplets *genericregistry.Store,
	ep *networking.Endpoint) (*networking.Subnet, field.ErrorList, error) {
	// Read from etcd, not the watch cache: right after a start the cache may
	// still be filling, and one read costs less than waiting for it.
	subnet, err := registry.GetLatest[networking.Subnet](ctx, subnets, "", ep.Spec.Subnet)
	if err != nil {
		return nil, nil, err
	}
	if errs := validation.ValidateEndpointSubnet(ep, subnet); len(errs) > 0 {
		return nil, errs, nil
	}
	if err := r.DependOn(ctx, subnets, "", subnet.Name, subnet); err != nil {
		return nil, nil, err
	}
	if ep.Spec.Droplet == "" {
		return subnet, nil, nil
	}
	droplet, err := registry.GetLatest[networking.Droplet](ctx, droplets, "", ep.Spec.Droplet)
	if err != nil {
		return nil, nil, err
	}
	if droplet == nil && r.SeenBefore(ctx, droplets, "", ep.Spec.Droplet) {
		// It was there when an earlier try of this create began.
		return nil, field.ErrorList{field.Forbidden(field.NewPath("spec", "droplet"), fmt.Sprintf("droplet %s was deleted", ep.Spec.Droplet))}, nil
	}
	if droplet == nil {
		return subnet, nil, r.DependOn(ctx, droplets, "", ep.Spec.Droplet, nil)
	}
	if droplet.DeletionTimestamp != nil {
		return nil, field.ErrorList{field.Forbidden(field.NewPath("spec", "droplet"), fmt.Sprintf("droplet %s is being deleted", droplet.Name))}, nil
	}
	return subnet, nil, r.DependOn(ctx, droplets, "", droplet.Name, droplet)
}

// reserveAddress gives an endpoint without an address the lowest free one of its
// subnet, checks a requested one, and claims the address and the MAC.
func reserveAddress(ctx context.Context, r *registry.Reserver[*networking.Endpoint], subnet *networking.Subnet, ep *networking.Endpoint) (field.ErrorList, error) {
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
