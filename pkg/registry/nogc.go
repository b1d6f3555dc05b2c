package registry

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/rest"
)

// refuseWithoutCollector answers 400 to a delete whose propagation needs a
// garbage collector when the server runs none (standalone: no
// kube-controller-manager): Orphan and Foreground put a finalizer on the
// object that only a collector removes, so it would stay Terminating for ever.
func (c ClientErrors) refuseWithoutCollector(options *metav1.DeleteOptions) error {
	if !c.NoGarbageCollector || options == nil {
		return nil
	}
	policy := ""
	switch {
	case options.PropagationPolicy != nil && *options.PropagationPolicy != metav1.DeletePropagationBackground:
		policy = string(*options.PropagationPolicy)
	case options.OrphanDependents != nil && *options.OrphanDependents:
		policy = "orphanDependents"
	}
	if policy == "" {
		return nil
	}
	return apierrors.NewBadRequest(fmt.Sprintf("propagationPolicy %s needs a garbage collector, and this server runs none (standalone): "+
		"the object would stay terminating for ever; delete with propagationPolicy Background (the default)", policy))
}

func (r *checkedREST) Delete(ctx context.Context, name string, deleteValidation rest.ValidateObjectFunc, options *metav1.DeleteOptions) (runtime.Object, bool, error) {
	if err := r.c.refuseWithoutCollector(options); err != nil {
		return nil, false, err
	}
	return r.REST.Delete(ctx, name, deleteValidation, options)
}

func (r *checkedREST) DeleteCollection(ctx context.Context, deleteValidation rest.ValidateObjectFunc, options *metav1.DeleteOptions,
	listOptions *metainternalversion.ListOptions) (runtime.Object, error) {
	if err := r.c.refuseWithoutCollector(options); err != nil {
		return nil, err
	}
	return r.REST.DeleteCollection(ctx, deleteValidation, options, listOptions)
}
