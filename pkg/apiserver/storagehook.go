package apiserver

import (
	"context"
	"fmt"
	"reflect"
	"sync"

	"go.etcd.io/etcd/client/v3/kubernetes"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"

	"mizar.dev/pkg/claim"
	"mizar.dev/pkg/registry"
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
	registry.DecorateAfter(&opts, func(_ *storagebackend.ConfigForResource, _ string, _, _ func() runtime.Object, s storage.Interface, destroy factory.DestroyFunc) (storage.Interface, factory.DestroyFunc, error) {
		return g.wrap(resource, s), destroy, nil
	})
	return opts, nil
}

// claimWritingOptionsGetter gives every resource's storage a second store for
// creates, and for applies that carry claims (claim.PendingFrom):
// k8s.io/apiserver's own etcd3 store (its codec, transformer and metrics) on an
// etcd client whose creates write the claims in the object's transaction
// (claim.Store.Client). Reads, watches and every other write keep the storage
// the options build: the watch cache over the factory's store, with its
// compactor and monitors. Giving the
// factory's store itself that client is not possible: the factory builds its
// client in unexported code (newETCD3Client), and StorageWithCacher builds the
// watch cache only over a store the factory makes.
type claimWritingOptionsGetter struct {
	generic.RESTOptionsGetter
	client *kubernetes.Client
}

func (g claimWritingOptionsGetter) GetRESTOptions(resource schema.GroupResource, example runtime.Object) (generic.RESTOptions, error) {
	opts, err := g.RESTOptionsGetter.GetRESTOptions(resource, example)
	if err != nil {
		return opts, err
	}
	registry.DecorateAfter(&opts, func(config *storagebackend.ConfigForResource, resourcePrefix string, newFunc, newListFunc func() runtime.Object,
		s storage.Interface, destroy factory.DestroyFunc) (storage.Interface, factory.DestroyFunc, error) {
		transformer := config.Transformer
		if transformer == nil {
			transformer = identity.NewEncryptCheckTransformer()
		}
		versioner := storage.APIObjectVersioner{}
		decoder := &writtenDecoder{Decoder: etcd3.NewDefaultDecoder(config.Codec, versioner), versioner: versioner}
		writer, err := etcd3.New(g.client, nil, config.Codec, newFunc, newListFunc, config.Prefix, resourcePrefix, config.GroupResource,
			transformer, config.LeaseManagerConfig, decoder, versioner)
		if err != nil {
			destroy()
			return nil, nil, fmt.Errorf("building the claim-writing store of %s: %w", resource, err)
		}
		var once sync.Once
		return &claimWritingStorage{Interface: s, writer: writer, decoder: decoder, newFunc: newFunc}, func() {
			// Called once per store and subresource.
			once.Do(func() {
				destroy()
				writer.Close()
			})
		}, nil
	})
	return opts, nil
}

// claimWritingStorage sends every create to writer: creates that carry claims
// so that etcd writes those with the object, and the others too, so that none
// decodes the object it has just encoded (writtenDecoder). The watch cache's
// own Create would only have handed them to the store under it.
type claimWritingStorage struct {
	storage.Interface
	writer  storage.Interface
	decoder *writtenDecoder
	newFunc func() runtime.Object
}

func (s *claimWritingStorage) Create(ctx context.Context, key string, obj, out runtime.Object, ttl uint64) error {
	if out != nil {
		s.decoder.written.Store(out, obj)
		defer s.decoder.written.Delete(out)
	}
	return s.writer.Create(ctx, key, obj, out, ttl)
}

// Delete of a delete guarded by what it listed (claim.DeleteGuard) goes to
// writer, whose client checks the guard in the delete's transaction.
func (s *claimWritingStorage) Delete(ctx context.Context, key string, out runtime.Object, preconditions *storage.Preconditions,
	validateDeletion storage.ValidateObjectFunc, cachedExistingObject runtime.Object, opts storage.DeleteOptions) error {
	if !claim.HasDeleteGuard(ctx) {
		return s.Interface.Delete(ctx, key, out, preconditions, validateDeletion, cachedExistingObject, opts)
	}
	return s.writer.Delete(ctx, key, out, preconditions, validateDeletion, cachedExistingObject, opts)
}

// GuaranteedUpdate of an apply that may create the object goes to writer,
// starting (as the watch cache's own GuaranteedUpdate does) from the cached
// object when there is one.
func (s *claimWritingStorage) GuaranteedUpdate(ctx context.Context, key string, destination runtime.Object, ignoreNotFound bool,
	preconditions *storage.Preconditions, tryUpdate storage.UpdateFunc, cachedExistingObject runtime.Object) error {
	if claim.PendingFrom(ctx) == nil {
		return s.Interface.GuaranteedUpdate(ctx, key, destination, ignoreNotFound, preconditions, tryUpdate, cachedExistingObject)
	}
	if cachedExistingObject == nil {
		cur := s.newFunc()
		if err := s.Interface.Get(ctx, key, storage.GetOptions{ResourceVersion: "0"}, cur); err == nil {
			// A copy: the update writes its resource version into it.
			cachedExistingObject = cur.DeepCopyObject()
		}
	}
	return s.writer.GuaranteedUpdate(ctx, key, destination, ignoreNotFound, preconditions, tryUpdate, cachedExistingObject)
}

// writtenDecoder answers a create with a copy of the object it wrote instead
// of decoding the bytes just encoded from it (a JSON decode and a conversion
// per create, about 4% of the server's CPU on Droplet creates). The copy
// differs from the decoded object only where the encoding loses nothing a
// client can see: timestamps below the second, nil against empty lists and
// maps, all of which encode alike. Every other read decodes.
type writtenDecoder struct {
	etcd3.Decoder
	versioner storage.Versioner
	// written maps the out object of a create in flight to the object it writes.
	written sync.Map
}

func (d *writtenDecoder) Decode(value []byte, objPtr runtime.Object, rev int64) error {
	if obj, ok := d.written.Load(objPtr); ok {
		src, dst := reflect.ValueOf(obj.(runtime.Object).DeepCopyObject()), reflect.ValueOf(objPtr)
		if src.Type() == dst.Type() && dst.Kind() == reflect.Pointer {
			dst.Elem().Set(src.Elem())
			if err := d.versioner.UpdateObject(objPtr, uint64(rev)); err != nil {
				return fmt.Errorf("setting the resource version of a created object: %w", err)
			}
			return nil
		}
	}
	return d.Decoder.Decode(value, objPtr, rev)
}
