// Package rest assembles the storage of every networking.mizar.dev resource into
// the API group the server installs.
package rest

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"

	"mizar.dev/pkg/apis/networking"
	"mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/claim"
	"mizar.dev/pkg/registry"
	"mizar.dev/pkg/registry/networking/bouncer"
	"mizar.dev/pkg/registry/networking/divider"
	"mizar.dev/pkg/registry/networking/droplet"
	"mizar.dev/pkg/registry/networking/endpoint"
	"mizar.dev/pkg/registry/networking/lifecycle"
	"mizar.dev/pkg/registry/networking/subnet"
	"mizar.dev/pkg/registry/networking/vpc"
)

// StorageProvider builds the networking.mizar.dev API group.
type StorageProvider struct {
	Scheme *runtime.Scheme
	Codecs serializer.CodecFactory
	// Claims keeps the values no two objects may share.
	Claims *claim.Store
	// Operators says this server runs the operators: objects they follow are
	// created holding their finalizer.
	Operators bool
	// NoGarbageCollector: no garbage collector runs (standalone); deletes
	// with Orphan or Foreground propagation are refused.
	NoGarbageCollector bool
}

// NewAPIGroupInfo returns the group with storage for every resource and /status,
// and the stores whose orphaned claims registry.RepairLoop looks for.
func (p StorageProvider) NewAPIGroupInfo(optsGetter generic.RESTOptionsGetter) (*genericapiserver.APIGroupInfo, []registry.Repairer, error) {
	info := genericapiserver.NewDefaultAPIGroupInfo(networking.GroupName, p.Scheme, metav1.ParameterCodec, p.Codecs)
	storage := map[string]rest.Storage{}
	var repairers []registry.Repairer
	checks := registry.ClientErrors{Encoder: p.Codecs.LegacyCodec(v1alpha1.SchemeGroupVersion), NoGarbageCollector: p.NoGarbageCollector}
	add := func(resource string, main *registry.REST, status *registry.StatusREST) {
		storage[resource] = checks.Wrap(main)
		storage[resource+"/status"] = checks.WrapStatus(status)
		repairers = append(repairers, main)
	}

	vpcs, vpcStatus, err := vpc.NewREST(p.Scheme, optsGetter, p.Claims)
	if err != nil {
		return nil, nil, fmt.Errorf("vpcs: %w", err)
	}
	add("vpcs", vpcs, vpcStatus)
	subnets, subnetStatus, err := subnet.NewREST(p.Scheme, optsGetter, p.Claims, vpcs.Store)
	if err != nil {
		return nil, nil, fmt.Errorf("subnets: %w", err)
	}
	add("subnets", subnets, subnetStatus)
	droplets, dropletStatus, err := droplet.NewREST(p.Scheme, optsGetter, p.Claims)
	if err != nil {
		return nil, nil, fmt.Errorf("droplets: %w", err)
	}
	add("droplets", droplets, dropletStatus)
	endpoints, endpointStatus, err := endpoint.NewREST(p.Scheme, optsGetter, p.Claims, subnets.Store, droplets.Store, p.Operators)
	if err != nil {
		return nil, nil, fmt.Errorf("endpoints: %w", err)
	}
	add("endpoints", endpoints, endpointStatus)
	p.guardParents([]parent{
		{vpcs, vpcStatus, "Vpc", lifecycle.Dependants{Store: subnets.Store, Field: "spec.vpc"}},
		{subnets, subnetStatus, "Subnet", lifecycle.Dependants{Store: endpoints.Store, Field: "spec.subnet"}},
		{droplets, dropletStatus, "Droplet", lifecycle.Dependants{Store: endpoints.Store, Field: "spec.droplet"}},
	})
	for resource, newREST := range map[string]func(*runtime.Scheme, generic.RESTOptionsGetter) (*registry.REST, *registry.StatusREST, error){
		"dividers": divider.NewREST,
		"bouncers": bouncer.NewREST,
	} {
		main, status, err := newREST(p.Scheme, optsGetter)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", resource, err)
		}
		add(resource, main, status)
	}
	info.VersionedResourcesStorageMap[v1alpha1.SchemeGroupVersion.Version] = storage
	return &info, repairers, nil
}

// parent is a kind whose objects others depend on (name in a field).
type parent struct {
	main       *registry.REST
	status     *registry.StatusREST
	kind       string
	dependants lifecycle.Dependants
}

// guardParents makes a parent and a child's create one decision: the child's
// create is written only if its parent is unchanged since it was checked
// (Reserver.DependOn), the parent holds the operators' finalizer from its
// create on (with operators), so its delete marks it and waits for the
// operator's drain, and nothing removes that finalizer while dependants remain
// (lifecycle.GuardFinalizer, through /status too).
func (p StorageProvider) guardParents(parents []parent) {
	for _, pa := range parents {
		if p.Operators {
			pa.main.CreateStrategy = lifecycle.WithOperatorFinalizer(pa.main.CreateStrategy)
		}
		gk := networking.Kind(pa.kind)
		lifecycle.GuardFinalizer(pa.main.Store, gk, pa.dependants)
		lifecycle.GuardFinalizer(pa.status.GenericStore(), gk, pa.dependants)
	}
}
