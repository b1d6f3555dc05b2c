package registry

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage/names"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// REST is the storage of a resource.
type REST struct {
	*genericregistry.Store
	shortNames []string
}

var (
	_ rest.ShortNamesProvider = &REST{}
	_ rest.CategoriesProvider = &REST{}
)

func (r *REST) ShortNames() []string { return r.shortNames }
func (r *REST) Categories() []string { return []string{Category} }

// StatusREST is the storage of a resource's /status subresource.
type StatusREST struct {
	store *genericregistry.Store
}

var _ rest.Patcher = &StatusREST{}

func (r *StatusREST) New() runtime.Object { return r.store.New() }
func (r *StatusREST) Destroy()            {} // the main store owns the shared storage

func (r *StatusREST) Get(ctx context.Context, name string, options *metav1.GetOptions) (runtime.Object, error) {
	return r.store.Get(ctx, name, options)
}

// Update writes status only; status never creates an object.
func (r *StatusREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, _ bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return r.store.Update(ctx, name, objInfo, createValidation, updateValidation, false, options)
}

func (r *StatusREST) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return r.store.GetResetFields()
}

// NewREST builds the stores of a Kind on the server's storage.
func NewREST[T runtime.Object, S, St any](k *Kind[T, S, St], scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter) (*REST, *StatusREST, error) {
	s := &strategy[T, S, St]{ObjectTyper: scheme, NameGenerator: names.SimpleNameGenerator, kind: k}
	store := &genericregistry.Store{
		NewFunc:                   func() runtime.Object { return k.New() },
		NewListFunc:               k.NewList,
		PredicateFunc:             k.predicate,
		DefaultQualifiedResource:  k.Resource,
		SingularQualifiedResource: schema.GroupResource{Group: k.Resource.Group, Resource: k.Singular},
		CreateStrategy:            s,
		UpdateStrategy:            s,
		DeleteStrategy:            s,
		ResetFieldsStrategy:       s,
		TableConvertor:            tableConvertor[T, S, St]{kind: k},
	}
	gvks, _, err := scheme.ObjectKinds(k.New())
	if err != nil {
		return nil, nil, fmt.Errorf("%s is not in the scheme: %w", k.Resource, err)
	}
	if k.Relations != nil {
		store.BeginCreate = k.beginCreate(gvks[0].GroupKind(), store)
	}
	trigger, indexers := k.indexers()
	opts := &generic.StoreOptions{RESTOptions: optsGetter, AttrFunc: k.getAttrs, TriggerFunc: trigger, Indexers: indexers}
	if err := store.CompleteWithOptions(opts); err != nil {
		return nil, nil, fmt.Errorf("building %s storage: %w", k.Resource, err)
	}

	status := s.statusStrategy()
	statusStore := *store
	statusStore.CreateStrategy = nil
	statusStore.DeleteStrategy = nil
	statusStore.UpdateStrategy = status
	statusStore.ResetFieldsStrategy = status
	return &REST{Store: store, shortNames: k.ShortNames}, &StatusREST{store: &statusStore}, nil
}

func (s *strategy[T, S, St]) statusStrategy() *statusStrategy[T, S, St] {
	return &statusStrategy[T, S, St]{strategy: s}
}

// beginCreate runs the relational checks of a create. The store calls it before
// the strategy's own validation, so static validation runs here first: only a
// well-formed object may take a lock, and a bad one gets every static error at once.
func (k *Kind[T, S, St]) beginCreate(gk schema.GroupKind, self *genericregistry.Store) genericregistry.BeginCreateFunc {
	r := k.Relations
	return func(ctx context.Context, obj runtime.Object, _ *metav1.CreateOptions) (genericregistry.FinishFunc, error) {
		t := must[T](obj)
		if errs := k.Validate(t); len(errs) > 0 {
			return nil, apierrors.NewInvalid(gk, objectMeta(obj).GetName(), errs)
		}
		since, unlock, err := r.Locker.Lock(ctx, r.Key(t))
		if err != nil {
			return nil, fmt.Errorf("serializing the create of %s %q: %w", k.Singular, objectMeta(obj).GetName(), err)
		}
		errs, err := r.Check(ctx, self, t, since)
		if err == nil && len(errs) > 0 {
			err = apierrors.NewInvalid(gk, objectMeta(obj).GetName(), errs)
		}
		if err != nil {
			unlock("")
			return nil, err
		}
		// Held until the object is stored (or the create fails further on); a
		// stored object's resourceVersion is handed to the next holder.
		return func(ctx context.Context, stored bool) {
			var next string
			if stored {
				// A consistent Get is served by etcd, not the cache. A dry run stored
				// nothing and finds nothing: the previous handoff stays.
				if o, err := self.Get(ctx, objectMeta(obj).GetName(), &metav1.GetOptions{}); err == nil {
					next = objectMeta(o).GetResourceVersion()
				}
			}
			unlock(next)
		}, nil
	}
}
