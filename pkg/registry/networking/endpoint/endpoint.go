// Package endpoint is the registry of endpoints.networking.mizar.dev.
package endpoint

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

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

var kind = lifecycle.Apply(registry.Kind[*networking.Endpoint, networking.EndpointSpec, networking.EndpointStatus]{
	Resource:       networking.Resource("endpoints"),
	Singular:       "endpoint",
	Namespaced:     true,
	New:            func() *networking.Endpoint { return &networking.Endpoint{} },
	NewList:        func() runtime.Object { return &networking.EndpointList{} },
	Spec:           func(o *networking.Endpoint) *networking.EndpointSpec { return &o.Spec },
	Status:         func(o *networking.Endpoint) *networking.EndpointStatus { return &o.Status },
	Validate:       validation.ValidateEndpoint,
	ValidateUpdate: validation.ValidateEndpointUpdate,
	Fields: map[string]func(*networking.Endpoint) string{
		"spec.subnet":  func(o *networking.Endpoint) string { return o.Spec.Subnet },
		"spec.droplet": func(o *networking.Endpoint) string { return o.Spec.Droplet },
		"spec.pod":     func(o *networking.Endpoint) string { return o.Spec.Pod },
	},
	// Node agents watch spec.droplet=<their droplet>, bouncer hosts spec.subnet=<s>.
	IndexedFields: []string{"spec.droplet", "spec.subnet"},
	// Never "ep" or "endpoints": behind kube-apiserver those mean the core kind.
	ShortNames: []string{"mep"},
	Columns: []registry.Column[*networking.Endpoint]{
		{Name: "Subnet", Type: "string", Description: "The subnet the endpoint is attached to.", Value: func(o *networking.Endpoint) any { return o.Spec.Subnet }},
		{Name: "IP", Type: "string", Description: "The endpoint's address.", Value: func(o *networking.Endpoint) any { return o.Spec.IP }},
		{Name: "Droplet", Type: "string", Description: "The droplet hosting the pod.", Value: func(o *networking.Endpoint) any { return o.Spec.Droplet }},
		{Name: "Pod", Type: "string", Description: "The pod owning the interface.", Priority: 1, Value: func(o *networking.Endpoint) any { return o.Spec.Pod }},
		{Name: "Interface", Type: "string", Description: "The interface inside the pod.", Priority: 1, Value: func(o *networking.Endpoint) any { return o.Spec.Interface }},
		{Name: "MAC", Type: "string", Description: "The interface's MAC.", Priority: 1, Value: func(o *networking.Endpoint) any { return o.Spec.MAC }},
	},
}, func(o *networking.Endpoint) *networking.ProvisioningStatus { return &o.Status.ProvisioningStatus })

// NewREST returns the storage of endpoints and endpoints/status. Addresses are
// allocated and checked for uniqueness under the subnet's lock.
func NewREST(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter, locker registry.Locker, subnets *genericregistry.Store) (*registry.REST, *registry.StatusREST, error) {
	k := *kind
	k.Relations = &registry.Relations[*networking.Endpoint]{
		Locker: locker,
		Key:    func(ep *networking.Endpoint) string { return "endpoints/" + ep.Spec.Subnet },
		Check: func(ctx context.Context, endpoints *genericregistry.Store, ep *networking.Endpoint, since string) (field.ErrorList, error) {
			return assignAddress(ctx, subnets, endpoints, ep, since)
		},
	}
	return registry.NewREST(&k, scheme, optsGetter)
}

// assignAddress gives an endpoint without an address the lowest free one of its
// subnet, then checks the address against the subnet and its other endpoints.
func assignAddress(ctx context.Context, subnets, endpoints *genericregistry.Store, ep *networking.Endpoint, since string) (field.ErrorList, error) {
	subnet, err := registry.GetLatest[networking.Subnet](ctx, subnets, "", ep.Spec.Subnet)
	if err != nil {
		return nil, err
	}
	if subnet == nil {
		return validation.ValidateEndpointRelations(ep, nil, nil), nil
	}
	peers, err := registry.ListSince[networking.EndpointList](ctx, endpoints, fields.OneTermEqualSelector("spec.subnet", ep.Spec.Subnet), since)
	if err != nil {
		return nil, err
	}
	if ep.Spec.IP == "" {
		used := map[netip.Addr]bool{}
		if gw, err := netip.ParseAddr(subnet.Spec.Gateway); err == nil {
			used[gw] = true
		}
		for i := range peers.Items {
			if a, err := netip.ParseAddr(peers.Items[i].Spec.IP); err == nil {
				used[a] = true
			}
		}
		addr, err := ipam.FirstFreeHost(netip.MustParsePrefix(subnet.Spec.CIDR), used)
		if errors.Is(err, ipam.ErrExhausted) {
			return field.ErrorList{field.Forbidden(field.NewPath("spec", "ip"), fmt.Sprintf("subnet %s (%s) has no free address", subnet.Name, subnet.Spec.CIDR))}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("allocating an address in subnet %s: %w", subnet.Name, err)
		}
		ep.Spec.IP = addr.String()
	}
	return validation.ValidateEndpointRelations(ep, subnet, peers.Items), nil
}
