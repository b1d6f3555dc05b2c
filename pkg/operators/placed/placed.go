// Package placed is what the Divider and Bouncer operators share: both keep
// objects that an owner (a VPC, a subnet) creates and that are placed on a
// droplet. mizar-apiserver runs no garbage collector, so the operator removes
// those whose owner is gone (a VPC or subnet re-created under the same name
// never inherits the old one's), and holds any that names a missing owner or
// droplet with a condition saying which.
package placed

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	netinformers "mizar.dev/pkg/generated/informers/externalversions/networking/v1alpha1"
	"mizar.dev/pkg/operators/reconcile"
)

// Kind describes the placed objects (T) of one operator.
type Kind[T metav1.Object] struct {
	Name      string // "divider"
	OwnerKind string // "VPC", in messages
	// OwnerIndex names the informer index of objects by their owner's name.
	OwnerIndex             string
	ByOwner, ByDroplet     cache.IndexFunc
	Objects, Owners        cache.SharedIndexInformer
	Droplets               netinformers.DropletInformer
	Get                    func(name string) (T, error)
	OwnerUID               func(name string) (types.UID, error)
	Owner, Droplet         func(T) string
	Conditions             func(T) []metav1.Condition
	Delete                 func(ctx context.Context, name string, opts metav1.DeleteOptions) error
	UpdateStatusConditions func(ctx context.Context, obj T, conds []metav1.Condition) error
}

// Operator reconciles one kind of placed objects.
type Operator[T metav1.Object] struct {
	k    Kind[T]
	loop *reconcile.Loop
}

// New wires the operator to its informers; call before they start.
func New[T metav1.Object](k Kind[T]) (*Operator[T], error) {
	o := &Operator[T]{k: k}
	o.loop = reconcile.New(k.Name+"-operator", o.Reconcile)
	if err := reconcile.AddIndex(k.Objects, k.OwnerIndex, k.ByOwner); err != nil {
		return nil, err
	}
	// A placed object is checked again when its owner or its droplet changes.
	if err := reconcile.AddIndex(k.Objects, reconcile.ByDroplet, k.ByDroplet); err != nil {
		return nil, err
	}
	if _, err := k.Objects.AddEventHandler(o.loop.Handler()); err != nil {
		return nil, err
	}
	for index, inf := range map[string]cache.SharedIndexInformer{k.OwnerIndex: k.Owners, reconcile.ByDroplet: k.Droplets.Informer()} {
		if _, err := inf.AddEventHandler(o.loop.MapHandler(o.keysBy(index))); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// keysBy maps an owner or droplet to the names of the objects the index finds for it.
func (o *Operator[T]) keysBy(index string) func(obj any) []string {
	return func(obj any) []string {
		m, err := meta.Accessor(obj)
		if err != nil {
			return nil
		}
		var keys []string
		for _, x := range reconcile.ByIndex[T](o.k.Objects, index, m.GetName()) {
			keys = append(keys, x.GetName())
		}
		return keys
	}
}

// Run reconciles until ctx ends.
func (o *Operator[T]) Run(ctx context.Context, workers int) { o.loop.Run(ctx, workers) }

// Reconcile deletes the object if the owner that created it no longer exists,
// and otherwise checks what it names.
func (o *Operator[T]) Reconcile(ctx context.Context, name string) error {
	x, err := o.k.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil || x.GetDeletionTimestamp() != nil {
		return err
	}
	ref := metav1.GetControllerOf(x)
	if ref == nil {
		return o.checkReferences(ctx, x) // made by hand; a person owns it
	}
	uid, err := o.k.OwnerUID(o.k.Owner(x))
	if err == nil && uid == ref.UID {
		return o.checkReferences(ctx, x)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	// Preconditioned on the UID so an object re-created meanwhile survives.
	own := x.GetUID()
	err = o.k.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &own}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting orphaned %s: %w", o.k.Name, err)
	}
	return nil
}

// checkReferences holds an object whose owner or droplet does not exist with a
// condition saying which, and clears it once they do.
func (o *Operator[T]) checkReferences(ctx context.Context, x T) error {
	var missing []string
	if _, err := o.k.OwnerUID(o.k.Owner(x)); apierrors.IsNotFound(err) {
		missing = append(missing, o.k.OwnerKind+" "+o.k.Owner(x))
	}
	if d := o.k.Droplet(x); d != "" {
		if _, err := o.k.Droplets.Lister().Get(d); apierrors.IsNotFound(err) {
			missing = append(missing, "droplet "+d)
		}
	}
	// Nothing is written while all is well and always was (no write per divider
	// or bouncer on the provisioning path); a held one is cleared when it resolves.
	conds := o.k.Conditions(x)
	if len(missing) == 0 && meta.FindStatusCondition(conds, reconcile.ConditionReferences) == nil {
		return nil
	}
	conds = append([]metav1.Condition(nil), conds...)
	if !reconcile.SetReferences(&conds, x.GetGeneration(), missing) {
		return nil
	}
	if err := o.k.UpdateStatusConditions(ctx, x, conds); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("writing the references condition: %w", err)
	}
	return nil
}
