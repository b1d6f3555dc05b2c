// Package endpoint is the registry of endpoints.networking.mizar.dev.
package endpoint

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"

	"mizar.dev/pkg/apis/networking"
	"mizar.dev/pkg/apis/networking/validation"
	"mizar.dev/pkg/claim"
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
// allocated and kept unique through claims (see claims.go). With
// operatorFinalizer (the server runs the Endpoint operator) a new endpoint is
// stored already holding the operator's finalizer.
func NewREST(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter, store *claim.Store, subnets, droplets *genericregistry.Store,
	operatorFinalizer bool) (*registry.REST, *registry.StatusREST, error) {
	k := *kind
	k.Claims = claims(store, subnets, droplets)
	main, status, err := registry.NewREST(&k, scheme, optsGetter)
	if err != nil {
		return nil, nil, err
	}
	if operatorFinalizer {
		// The operator would otherwise add it with an update of its own, and
		// agents acknowledge only versions holding it (AwaitsAcknowledgement):
		// the create itself becomes the version they acknowledge, one write and
		// one round of acknowledgements fewer on every pod ADD. The operator
		// still adds it to an endpoint created without it (by a server not
		// running it).
		main.CreateStrategy = lifecycle.WithOperatorFinalizer(main.CreateStrategy)
	}
	main.UpdateStrategy = recordMoves{main.UpdateStrategy}
	return main, status, nil
}
