package registry

import (
	"fmt"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/client-go/tools/cache"
)

// fieldSet is every field a selector may name for obj.
func (k *Kind[T, S, St]) fieldSet(obj T) fields.Set {
	set := generic.ObjectMetaFieldsSet(objectMeta(obj), k.Namespaced)
	for name, value := range k.Fields {
		set[name] = value(obj)
	}
	return set
}

// getAttrs is the store's AttrFunc.
func (k *Kind[T, S, St]) getAttrs(obj runtime.Object) (labels.Set, fields.Set, error) {
	t, ok := obj.(T)
	if !ok {
		return nil, nil, fmt.Errorf("not a %s: %T", k.Singular, obj)
	}
	return labels.Set(objectMeta(obj).GetLabels()), k.fieldSet(t), nil
}

// predicate matches objects against selectors; IndexFields lets the watch cache
// answer selectors on indexed fields without scanning.
func (k *Kind[T, S, St]) predicate(label labels.Selector, field fields.Selector) storage.SelectionPredicate {
	return storage.SelectionPredicate{
		Label:       label,
		Field:       field,
		GetAttrs:    k.getAttrs,
		IndexFields: k.IndexedFields,
	}
}

// fieldValue reads one field of obj, or "" for other types. The watch cache
// calls it on every change and twice per watch event, so it reads just the
// one field instead of building the selector set.
func (k *Kind[T, S, St]) fieldValue(name string) func(runtime.Object) string {
	value := k.Fields[name]
	return func(obj runtime.Object) string {
		if t, ok := obj.(T); ok {
			return value(t)
		}
		return ""
	}
}

// indexers are the watch cache's list indexes and its single watch trigger.
func (k *Kind[T, S, St]) indexers() (storage.IndexerFuncs, *cache.Indexers) {
	if len(k.IndexedFields) == 0 {
		return nil, nil
	}
	idx := cache.Indexers{}
	for _, f := range k.IndexedFields {
		value := k.fieldValue(f)
		idx[storage.FieldIndex(f)] = func(obj interface{}) ([]string, error) {
			o, ok := obj.(runtime.Object)
			if !ok {
				return nil, fmt.Errorf("not a runtime object: %T", obj)
			}
			return []string{value(o)}, nil
		}
	}
	// The cacher supports a single trigger; the first indexed field is the one
	// per-node watchers select on.
	trigger := storage.IndexerFuncs{k.IndexedFields[0]: k.fieldValue(k.IndexedFields[0])}
	return trigger, &idx
}
