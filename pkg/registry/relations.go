package registry

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
)

// GetLatest reads the current state of one object (nil when absent). An empty
// resourceVersion makes the read consistent with etcd.
func GetLatest[T any](ctx context.Context, store *genericregistry.Store, namespace, name string) (*T, error) {
	obj, err := store.Get(genericapirequest.WithNamespace(ctx, namespace), name, &metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, StorageError(err)
	}
	t, ok := any(obj).(*T)
	if !ok {
		return nil, fmt.Errorf("reading %s %q: unexpected type %T", store.DefaultQualifiedResource, name, obj)
	}
	return t, nil
}
