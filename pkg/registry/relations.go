package registry

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
)

// Locker serializes the relational checks that must not interleave (see
// etcd.Locker). Lock returns what the previous holder handed off, and unlock
// hands off next to the following one ("" keeps the previous handoff).
type Locker interface {
	Lock(ctx context.Context, key string) (handoff string, unlock func(next string), err error)
}

// GetLatest reads the current state of one object (nil when absent). An empty
// resourceVersion makes the read consistent with etcd, so an object stored by
// the previous holder of a lock is always seen.
func GetLatest[T any](ctx context.Context, store *genericregistry.Store, namespace, name string) (*T, error) {
	obj, err := store.Get(genericapirequest.WithNamespace(ctx, namespace), name, &metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s %q: %w", store.DefaultQualifiedResource, name, err)
	}
	t, ok := any(obj).(*T)
	if !ok {
		return nil, fmt.Errorf("reading %s %q: unexpected type %T", store.DefaultQualifiedResource, name, obj)
	}
	return t, nil
}

// ListSince lists every object matching selector in all namespaces, at least as
// new as resourceVersion since; with since == "" the list is consistent with etcd.
// A consistent list from the watch cache waits until the cache proves it has
// caught up with etcd's latest revision (up to the cacher's progress-request
// period, 100 ms, when the resource is quiet), whereas "not older than" an object
// the cache has already seen is served at once.
func ListSince[L any](ctx context.Context, store *genericregistry.Store, selector fields.Selector, since string) (*L, error) {
	opts := &metainternalversion.ListOptions{FieldSelector: selector}
	if since != "" {
		opts.ResourceVersion, opts.ResourceVersionMatch = since, metav1.ResourceVersionMatchNotOlderThan
	}
	obj, err := store.List(genericapirequest.WithNamespace(ctx, metav1.NamespaceAll), opts)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", store.DefaultQualifiedResource, err)
	}
	l, ok := any(obj).(*L)
	if !ok {
		return nil, fmt.Errorf("listing %s: unexpected type %T", store.DefaultQualifiedResource, obj)
	}
	return l, nil
}
