// Package serviceclass is the registry of serviceclasses.broker.mizar.dev, the
// broker's catalog.
package serviceclass

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"

	"mizar.dev/pkg/apis/broker"
	"mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/apis/broker/validation"
	"mizar.dev/pkg/claim"
	"mizar.dev/pkg/registry"
)

var kind = registry.Kind[*broker.ServiceClass, broker.ServiceClassSpec, broker.ServiceClassStatus]{
	Resource: broker.Resource("serviceclasses"),
	Singular: "serviceclass",
	Version:  v1alpha1.SchemeGroupVersion.String(),
	New:      func() *broker.ServiceClass { return &broker.ServiceClass{} },
	NewList:  func() runtime.Object { return &broker.ServiceClassList{} },
	Spec:     func(o *broker.ServiceClass) *broker.ServiceClassSpec { return &o.Spec },
	Status:   func(o *broker.ServiceClass) *broker.ServiceClassStatus { return &o.Status },
	// A catalog entry is usable once stored (validated, its schemas compiled):
	// Ready from its create, so `kubectl wait --for=condition=Ready` works on it too.
	Readiness: func(o *broker.ServiceClass) (*[]metav1.Condition, string, bool) {
		return &o.Status.Conditions, "", true
	},
	Validate:       validation.ValidateServiceClass,
	ValidateUpdate: validation.ValidateServiceClassUpdate,
	ValidateStatus: func(*broker.ServiceClass) field.ErrorList { return nil },
	Fields:         map[string]func(*broker.ServiceClass) string{"spec.id": func(o *broker.ServiceClass) string { return o.Spec.ID }},
	ShortNames:     []string{"msc"},
	Columns: []registry.Column[*broker.ServiceClass]{
		{Name: "Plans", Type: "string", Description: "The plans the service is offered in.", Value: func(o *broker.ServiceClass) any { return planNames(o) }},
		{Name: "Bindable", Type: "boolean", Description: "Whether credentials can be bound.", Value: func(o *broker.ServiceClass) any { return o.Spec.Bindable }},
		{Name: "Image", Type: "string", Description: "The workload's container image.", Priority: 1, Value: func(o *broker.ServiceClass) any { return o.Spec.Image }},
		{Name: "ID", Type: "string", Description: "The Open Service Broker id.", Priority: 1, Value: func(o *broker.ServiceClass) any { return o.Spec.ID }},
	},
}

func planNames(c *broker.ServiceClass) string {
	s := ""
	for i, p := range c.Spec.Plans {
		if i > 0 {
			s += ","
		}
		s += p.Name
	}
	return s
}

// REST is the storage of service classes. A class or plan that orders use is
// not deleted (422): the fulfillment operator would fail those orders, and a
// platform would be left with instances of an offering that no longer exists.
type REST struct {
	*registry.REST
	// Instances is the orders' store, set once it exists (it reads classes).
	Instances *genericregistry.Store
	// Claims, when set, makes a delete depend on the orders it found
	// (claim.DeleteGuard): an order created after they were listed keeps the class.
	Claims *claim.Store
}

// deleteTries bounds how often a delete lists the orders again because one
// was created after the list; only a class ordered without pause exhausts it.
const deleteTries = 5

// NewREST returns the storage of service classes. A catalog entry has no status
// subresource: its only status is the Ready condition the server sets on create.
func NewREST(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter) (*REST, error) {
	k := kind
	main, _, err := registry.NewREST(&k, scheme, optsGetter)
	if err != nil {
		return nil, err
	}
	r := &REST{REST: main}
	main.Store.BeginCreate = func(ctx context.Context, obj runtime.Object, _ *metav1.CreateOptions) (genericregistry.FinishFunc, error) {
		return noop, r.checkIDsUnique(ctx, obj.(*broker.ServiceClass))
	}
	main.Store.BeginUpdate = func(ctx context.Context, obj, old runtime.Object, _ *metav1.UpdateOptions) (genericregistry.FinishFunc, error) {
		c, prev := obj.(*broker.ServiceClass), old.(*broker.ServiceClass)
		if err := r.checkIDsUnique(ctx, c); err != nil {
			return nil, err
		}
		kept := map[string]bool{}
		for _, p := range c.Spec.Plans {
			kept[p.Name] = true
		}
		for _, p := range prev.Spec.Plans {
			if kept[p.Name] {
				continue
			}
			if users, err := r.users(ctx, c.Name, p.Name); err != nil {
				return nil, err
			} else if len(users) > 0 {
				return nil, apierrors.NewInvalid(broker.Kind("ServiceClass"), c.Name, field.ErrorList{field.Forbidden(field.NewPath("spec", "plans"),
					fmt.Sprintf("plan %s is used by %s: delete them (or move them to another plan) first", p.Name, describe(users)))})
			}
		}
		return noop, nil
	}
	return r, nil
}

func noop(context.Context, bool) {}

// checkIDsUnique refuses OSB ids another class has: platforms find services
// and plans by id alone.
func (r *REST) checkIDsUnique(ctx context.Context, c *broker.ServiceClass) error {
	obj, err := r.Store.List(genericapirequest.WithNamespace(ctx, ""), &metainternalversion.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing service classes: %w", err)
	}
	owner := map[string]string{}
	for _, other := range obj.(*broker.ServiceClassList).Items {
		if other.Name == c.Name {
			continue
		}
		owner[other.Spec.ID] = other.Name
		for _, p := range other.Spec.Plans {
			owner[p.ID] = other.Name
		}
	}
	var errs field.ErrorList
	dup := func(path *field.Path, id string) {
		if o, ok := owner[id]; ok && id != "" {
			d := field.Duplicate(path, id)
			d.Detail = "already the id of service class " + o + " (or one of its plans): Open Service Broker ids are globally unique"
			errs = append(errs, d)
		}
	}
	dup(field.NewPath("spec", "id"), c.Spec.ID)
	for i, p := range c.Spec.Plans {
		dup(field.NewPath("spec", "plans").Index(i).Child("id"), p.ID)
	}
	if len(errs) > 0 {
		return apierrors.NewInvalid(broker.Kind("ServiceClass"), c.Name, errs)
	}
	return nil
}

// users lists the orders of a class (of one plan, if given), from etcd.
func (r *REST) users(ctx context.Context, class, plan string) ([]broker.ServiceInstance, error) {
	out, _, err := r.usersAt(ctx, class, plan)
	return out, err
}

// usersAt lists the orders of a class (of one plan, if given), consistently
// with etcd, and the revision of the list.
func (r *REST) usersAt(ctx context.Context, class, plan string) ([]broker.ServiceInstance, int64, error) {
	if r.Instances == nil {
		return nil, 0, nil
	}
	obj, err := r.Instances.List(genericapirequest.WithNamespace(ctx, ""), &metainternalversion.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.class", class)})
	if err != nil {
		return nil, 0, fmt.Errorf("listing the orders of service class %s: %w", class, err)
	}
	list := obj.(*broker.ServiceInstanceList)
	rev, err := strconv.ParseInt(list.ResourceVersion, 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("the resource version of the orders of service class %s: %w", class, err)
	}
	var out []broker.ServiceInstance
	for _, in := range list.Items {
		if plan == "" || in.Spec.Plan == plan {
			out = append(out, in)
		}
	}
	return out, rev, nil
}

func describe(users []broker.ServiceInstance) string {
	names := make([]string, 0, 3)
	for i, in := range users {
		if i == 3 {
			break
		}
		names = append(names, in.Namespace+"/"+in.Name)
	}
	s := fmt.Sprintf("%d ServiceInstance(s) (%s", len(users), strings.Join(names, ", "))
	if len(users) > 3 {
		s += ", ..."
	}
	return s + ")"
}

// Delete refuses to delete a class that orders use. The orders are listed at a
// revision and the class is deleted only if no order was created after it
// (an order's create depends on its class as it read it, so one created after
// the delete is refused): a delete racing an order's create never leaves the
// order without its class.
func (r *REST) Delete(ctx context.Context, name string, deleteValidation rest.ValidateObjectFunc, options *metav1.DeleteOptions) (runtime.Object, bool, error) {
	for range deleteTries {
		users, rev, err := r.usersAt(ctx, name, "")
		if err != nil {
			return nil, false, err
		}
		if len(users) > 0 {
			return nil, false, apierrors.NewInvalid(broker.Kind("ServiceClass"), name, field.ErrorList{field.Forbidden(field.NewPath("metadata", "name"),
				fmt.Sprintf("service class %s is used by %s: delete them first", name, describe(users)))})
		}
		dctx := ctx
		if r.Claims != nil && r.Instances != nil && rev > 0 {
			root := r.Instances.KeyRootFunc(genericapirequest.WithNamespace(ctx, ""))
			dctx = claim.WithDeleteGuard(ctx, claim.DeleteGuard{Prefix: r.Claims.ObjectKey(root) + "/", Rev: rev})
		}
		out, deleted, err := r.REST.Delete(dctx, name, deleteValidation, options)
		var conflict *claim.ConflictError
		if !errors.As(err, &conflict) {
			return out, deleted, err
		}
		// An order was created after the list: look again.
	}
	return nil, false, apierrors.NewConflict(broker.Resource("serviceclasses"), name, errors.New("orders kept being created while it was deleted; retry"))
}

// DeleteCollection deletes the classes no order uses, through Delete.
func (r *REST) DeleteCollection(ctx context.Context, deleteValidation rest.ValidateObjectFunc, options *metav1.DeleteOptions, listOptions *metainternalversion.ListOptions) (runtime.Object, error) {
	obj, err := r.Store.List(ctx, listOptions)
	if err != nil {
		return nil, err
	}
	list := obj.(*broker.ServiceClassList)
	deleted := &broker.ServiceClassList{}
	for _, c := range list.Items {
		out, _, err := r.Delete(ctx, c.Name, deleteValidation, options.DeepCopy())
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if dc, ok := out.(*broker.ServiceClass); ok {
			deleted.Items = append(deleted.Items, *dc)
		}
	}
	return deleted, nil
}
