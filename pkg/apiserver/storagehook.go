package apiserver

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"
	"k8s.io/client-go/tools/cache"
)

// StorageWrapper wraps the storage of one resource (above the watch cache). It
// is the seam fault-injection tests use to make etcd fail after committing.
type StorageWrapper func(resource schema.GroupResource, s storage.Interface) storage.Interface

type wrappingOptionsGetter struct {
	generic.RESTOptionsGetter
	wrap StorageWrapper
}

func (g wrappingOptionsGetter) GetRESTOptions(resource schema.GroupResource, example runtime.Object) (generic.RESTOptions, error) {
	opts, err := g.RESTOptionsGetter.GetRESTOptions(resource, example)
	if err != nil {
		return opts, err
	}
	decorate := opts.Decorator
	opts.Decorator = func(config *storagebackend.ConfigForResource, resourcePrefix string, keyFunc func(runtime.Object) (string, error),
		newFunc, newListFunc func() runtime.Object, getAttrs storage.AttrFunc, trigger storage.IndexerFuncs, indexers *cache.Indexers,
	) (storage.Interface, factory.DestroyFunc, error) {
		s, destroy, err := decorate(config, resourcePrefix, keyFunc, newFunc, newListFunc, getAttrs, trigger, indexers)
		if err != nil {
			return s, destroy, err
		}
		return g.wrap(resource, s), destroy, nil
	}
	return opts, nil
}
