package registry

import (
	"context"
	"errors"
	"fmt"
	"net/http"

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
	repair     func(ctx context.Context) (int, error)
	// withClaims, for kinds with claims, runs a create with the claims written
	// in its transaction (Kind.createWithClaims).
	withClaims func(context.Context, func(context.Context) (runtime.Object, error)) (runtime.Object, error)
}

// Create stores a new object, with its claims when its kind has any.
func (r *REST) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	if r.withClaims == nil {
		return r.Store.Create(ctx, obj, createValidation, options)
	}
	return r.withClaims(ctx, func(ctx context.Context) (runtime.Object, error) {
		// Each try starts from the object as it came: a try fills in allocated values.
		return r.Store.Create(ctx, obj.DeepCopyObject(), createValidation, options)
	})
}

// Update changes an object; an update that may create it (server-side apply)
// runs as a create with claims when its kind has any.
func (r *REST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc,
	updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	objInfo = patchErrors{objInfo}
	if r.withClaims == nil || !forceAllowCreate {
		return r.Store.Update(ctx, name, objInfo, createValidation, updateValidation, forceAllowCreate, options)
	}
	var created bool
	out, err := r.withClaims(ctx, func(ctx context.Context) (runtime.Object, error) {
		out, c, err := r.Store.Update(ctx, name, objInfo, createValidation, updateValidation, forceAllowCreate, options)
		created = c
		return out, err
	})
	return out, created, err
}

// Repair drops the kind's orphaned claims (see Kind.Claims) and says how many;
// kinds without claims have nothing to repair.
func (r *REST) Repair(ctx context.Context) (int, error) {
	if r.repair == nil {
		return 0, nil
	}
	return r.repair(ctx)
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

// GenericStore is the store /status writes through, for hooks a kind adds
// after NewREST (it is a copy of the main store's).
func (r *StatusREST) GenericStore() *genericregistry.Store { return r.store }
func (r *StatusREST) Destroy()                             {} // the main store owns the shared storage

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
	if k.Claims != nil {
		store.BeginCreate = k.beginCreate(gvks[0].GroupKind(), store)
		store.BeginUpdate = k.beginUpdate(store)
	}
	trigger, indexers := k.indexers()
	if k.Claims != nil {
		// Wrapped as it is built: CompleteWithOptions starts goroutines that
		// read store.Storage, so it must not change afterwards.
		optsGetter = claimingOptionsGetter[T]{RESTOptionsGetter: optsGetter, claims: k.Claims}
	}
	opts := &generic.StoreOptions{RESTOptions: optsGetter, AttrFunc: k.getAttrs, TriggerFunc: trigger, Indexers: indexers}
	if err := store.CompleteWithOptions(opts); err != nil {
		return nil, nil, fmt.Errorf("building %s storage: %w", k.Resource, err)
	}

	rest := &REST{Store: store, shortNames: k.ShortNames}
	if k.Claims != nil {
		rest.withClaims = k.createWithClaims(gvks[0].GroupKind())
		rest.repair = func(ctx context.Context) (int, error) { return k.repair(ctx, store) }
	}

	status := s.statusStrategy()
	statusStore := *store
	statusStore.CreateStrategy = nil
	statusStore.DeleteStrategy = nil
	statusStore.UpdateStrategy = status
	statusStore.ResetFieldsStrategy = status
	return rest, &StatusREST{store: &statusStore}, nil
}

func (s *strategy[T, S, St]) statusStrategy() *statusStrategy[T, S, St] {
	return &statusStrategy[T, S, St]{strategy: s}
}

// patchErrors answers 422 for a patch that cannot be made into an object.
// Server-side apply reports a duplicated list-map key (two plans of one
// name) as a plain error, which the handler would answer with a 500; the
// other patch types already answer 400 or 422.
type patchErrors struct{ rest.UpdatedObjectInfo }

func (p patchErrors) UpdatedObject(ctx context.Context, old runtime.Object) (runtime.Object, error) {
	obj, err := p.UpdatedObjectInfo.UpdatedObject(ctx, old)
	var status apierrors.APIStatus
	if err != nil && !errors.As(err, &status) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return nil, apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "patch", schema.GroupResource{}, "", err.Error(), 0, false)
	}
	return obj, err
}
