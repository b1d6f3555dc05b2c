// Package rest assembles the storage of every broker.mizar.dev resource into the
// API group the server installs.
package rest

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"

	"mizar.dev/pkg/apis/broker"
	"mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/claim"
	"mizar.dev/pkg/registry/broker/servicebinding"
	"mizar.dev/pkg/registry/broker/serviceclass"
	"mizar.dev/pkg/registry/broker/serviceinstance"
)

// StorageProvider builds the broker.mizar.dev API group.
type StorageProvider struct {
	Scheme *runtime.Scheme
	Codecs serializer.CodecFactory
	// Claims writes an order's create together with the condition that its
	// class is unchanged, and a class's delete with the condition that no order
	// was created since its orders were listed.
	Claims *claim.Store
}

// NewAPIGroupInfo returns the group with storage for every resource and /status.
func (p StorageProvider) NewAPIGroupInfo(optsGetter generic.RESTOptionsGetter) (*genericapiserver.APIGroupInfo, error) {
	info := genericapiserver.NewDefaultAPIGroupInfo(broker.GroupName, p.Scheme, metav1.ParameterCodec, p.Codecs)
	classes, err := serviceclass.NewREST(p.Scheme, optsGetter)
	if err != nil {
		return nil, fmt.Errorf("serviceclasses: %w", err)
	}
	classes.Claims = p.Claims
	instances, instanceStatus, err := serviceinstance.NewREST(p.Scheme, optsGetter, classes.Store, p.Claims)
	if err != nil {
		return nil, fmt.Errorf("serviceinstances: %w", err)
	}
	classes.Instances = instances.Store
	bindings, bindingStatus, err := servicebinding.NewREST(p.Scheme, optsGetter, instances.Store, classes.Store)
	if err != nil {
		return nil, fmt.Errorf("servicebindings: %w", err)
	}
	info.VersionedResourcesStorageMap[v1alpha1.SchemeGroupVersion.Version] = map[string]rest.Storage{
		"serviceclasses":          classes,
		"serviceinstances":        instances,
		"serviceinstances/status": instanceStatus,
		"servicebindings":         bindings,
		"servicebindings/status":  bindingStatus,
	}
	return &info, nil
}
