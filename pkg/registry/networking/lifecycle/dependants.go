package lifecycle

import (
	"context"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"

	"mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/registry"
)

// WithOperatorFinalizer makes new objects hold the operators' finalizer from
// their create on. Added later by an operator's update, it left a window in
// which a parent (a VPC, a subnet, a droplet) could be deleted at once, without
// the drain that waits for its dependants, while a child was being created.
func WithOperatorFinalizer(s rest.RESTCreateStrategy) rest.RESTCreateStrategy {
	return operatorFinalizer{s}
}

type operatorFinalizer struct{ rest.RESTCreateStrategy }

func (s operatorFinalizer) PrepareForCreate(ctx context.Context, obj runtime.Object) {
	s.RESTCreateStrategy.PrepareForCreate(ctx, obj)
	if m, err := meta.Accessor(obj); err == nil && !slices.Contains(m.GetFinalizers(), v1alpha1.OperatorFinalizer) {
		m.SetFinalizers(append(m.GetFinalizers(), v1alpha1.OperatorFinalizer))
	}
}

// Dependants are the objects that name a parent in a field (the subnets of a
// VPC: subnets with spec.vpc=<name>).
type Dependants struct {
	Store *genericregistry.Store
	Field string
}

// List reads, consistently (from etcd, not a possibly stale cache), up to
// limit names of the dependants of parent and whether there are more.
func (d Dependants) List(ctx context.Context, parent string, limit int) ([]string, bool, error) {
	ctx = genericapirequest.WithNamespace(ctx, metav1.NamespaceAll)
	list, err := d.Store.List(ctx, &metainternalversion.ListOptions{FieldSelector: fields.OneTermEqualSelector(d.Field, parent)})
	if err != nil {
		return nil, false, registry.StorageError(err)
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return nil, false, err
	}
	var names []string
	for _, it := range items {
		if len(names) == limit {
			return names, true, nil
		}
		if m, err := meta.Accessor(it); err == nil {
			n := m.GetName()
			if m.GetNamespace() != "" {
				n = m.GetNamespace() + "/" + n
			}
			names = append(names, n)
		}
	}
	return names, false, nil
}

// GuardFinalizer refuses (422) an update of store that removes the operators'
// finalizer from an object not being deleted (the operators would only add it
// again, and meanwhile a delete would skip the drain) or from one whose
// dependants remain: that finalizer is what keeps them from being orphaned.
// To force a delete, delete the dependants first.
func GuardFinalizer(store *genericregistry.Store, gk schema.GroupKind, deps ...Dependants) {
	begin := store.BeginUpdate
	store.BeginUpdate = func(ctx context.Context, obj, old runtime.Object, opts *metav1.UpdateOptions) (genericregistry.FinishFunc, error) {
		if err := checkFinalizerRemoval(ctx, obj, old, gk, deps); err != nil {
			return nil, err
		}
		if begin == nil {
			return func(context.Context, bool) {}, nil
		}
		return begin(ctx, obj, old, opts)
	}
}

func checkFinalizerRemoval(ctx context.Context, obj, old runtime.Object, gk schema.GroupKind, deps []Dependants) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	om, err := meta.Accessor(old)
	if err != nil {
		return err
	}
	if !slices.Contains(om.GetFinalizers(), v1alpha1.OperatorFinalizer) || slices.Contains(m.GetFinalizers(), v1alpha1.OperatorFinalizer) {
		return nil
	}
	path := field.NewPath("metadata", "finalizers")
	if om.GetDeletionTimestamp() == nil {
		return apierrors.NewInvalid(gk, m.GetName(), field.ErrorList{field.Forbidden(path,
			v1alpha1.OperatorFinalizer+" may be removed only from an object being deleted, once nothing depends on it")})
	}
	for _, d := range deps {
		names, more, err := d.List(ctx, m.GetName(), 3)
		if err != nil {
			return err
		}
		if len(names) > 0 {
			list := strings.Join(names, ", ")
			if more {
				list += ", ..."
			}
			return apierrors.NewInvalid(gk, m.GetName(), field.ErrorList{field.Forbidden(path, fmt.Sprintf(
				"%s stays while %s with %s=%s remain (%s): delete them first; removing it would orphan them",
				v1alpha1.OperatorFinalizer, d.Store.DefaultQualifiedResource.Resource, d.Field, m.GetName(), list))})
		}
	}
	return nil
}
