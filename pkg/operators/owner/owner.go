// Package owner is what the VPC and Subnet operators share: both keep an
// object (a VPC, a subnet) that creates placed children (dividers, bouncers)
// named by index, is Provisioned once all of them are, and on deletion waits
// for what depends on it (subnets, endpoints), then drains its children, then
// lets go of its finalizer. Package placed is the children's side.
package owner

import (
	"context"
	"fmt"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/operators/reconcile"
)

// Client is the owner kind's typed client (VpcInterface, SubnetInterface).
type Client[O any] interface {
	Update(ctx context.Context, obj O, opts metav1.UpdateOptions) (O, error)
	UpdateStatus(ctx context.Context, obj O, opts metav1.UpdateOptions) (O, error)
}

// Kind describes one owner kind (O) and its children (C).
type Kind[O metav1.Object, C metav1.Object] struct {
	Client   Client[O]
	DeepCopy func(O) O
	// Status points into an owner's status.
	Status func(O) *v1alpha1.ProvisioningStatus

	// Child is the children's kind in messages ("divider").
	Child string
	// ChildName is the name of an owner's i-th child.
	ChildName func(owner string, i int32) string
	// CreateChild creates the named child of owner; AlreadyExists is fine.
	CreateChild func(ctx context.Context, owner O, name string) error
	DeleteChild func(ctx context.Context, name string) error
	// ChildState reads a child's phase, conditions and droplet.
	ChildState func(C) (v1alpha1.Phase, []metav1.Condition, string)
}

// EnsureFinalizer adds mizar's finalizer unless obj has it, and returns the
// stored object.
func (k Kind[O, C]) EnsureFinalizer(ctx context.Context, obj O) (O, error) {
	if reconcile.HasFinalizer(obj) {
		return obj, nil
	}
	obj = k.DeepCopy(obj)
	obj.SetFinalizers(append(obj.GetFinalizers(), reconcile.Finalizer))
	out, err := k.Client.Update(ctx, obj, metav1.UpdateOptions{})
	if err != nil {
		return obj, fmt.Errorf("adding the finalizer: %w", err)
	}
	return out, nil
}

// WriteStatus writes st unless it equals obj's status but for timestamps.
func (k Kind[O, C]) WriteStatus(ctx context.Context, obj O, st *v1alpha1.ProvisioningStatus) error {
	if reconcile.SameProvisioning(k.Status(obj), st) {
		return nil
	}
	obj = k.DeepCopy(obj)
	*k.Status(obj) = *st
	if _, err := k.Client.UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("writing status: %w", err)
	}
	return nil
}

// Scale creates the owner's missing children up to want, deletes those beyond
// it, and reports how many of the wanted ones are Provisioned and, sorted, why
// each other one is not.
func (k Kind[O, C]) Scale(ctx context.Context, obj O, want int32, have []C) (ready int32, waiting []string, err error) {
	byName := map[string]C{}
	for _, c := range have {
		byName[c.GetName()] = c
	}
	wanted := map[string]bool{}
	for i := range want {
		n := k.ChildName(obj.GetName(), i)
		wanted[n] = true
		c, ok := byName[n]
		if !ok {
			if err := k.CreateChild(ctx, obj, n); err != nil && !apierrors.IsAlreadyExists(err) {
				return 0, nil, fmt.Errorf("creating %s %s: %w", k.Child, n, err)
			}
			waiting = append(waiting, n+": just created")
			continue
		}
		if phase, conds, droplet := k.ChildState(c); phase == v1alpha1.PhaseProvisioned {
			ready++
		} else {
			waiting = append(waiting, n+": "+whyNot(conds, droplet))
		}
	}
	for n := range byName {
		if !wanted[n] {
			if err := k.DeleteChild(ctx, n); err != nil && !apierrors.IsNotFound(err) {
				return 0, nil, fmt.Errorf("deleting surplus %s %s: %w", k.Child, n, err)
			}
		}
	}
	sort.Strings(waiting)
	return ready, waiting, nil
}

// Drain is the delete workflow of an owner being deleted: while dependants
// remain (remainReason and remainMessage say which) it waits; then it deletes
// its children and waits for them to go (drainingReason); then it removes the
// finalizer. The status says which step it is at (phase Terminating,
// condition conditionType).
func (k Kind[O, C]) Drain(ctx context.Context, obj O, children []C, conditionType, remainReason, remainMessage, drainingReason string) error {
	if !reconcile.HasFinalizer(obj) {
		return nil
	}
	st := k.Status(obj).DeepCopy()
	st.Phase = v1alpha1.PhaseTerminating
	if remainMessage != "" {
		reconcile.SetCondition(&st.Conditions, obj.GetGeneration(), conditionType, true, remainReason, remainMessage)
		return k.WriteStatus(ctx, obj, st)
	}
	if len(children) > 0 {
		for _, c := range children {
			if c.GetDeletionTimestamp() != nil {
				continue
			}
			if err := k.DeleteChild(ctx, c.GetName()); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("draining %s %s: %w", k.Child, c.GetName(), err)
			}
		}
		reconcile.SetCondition(&st.Conditions, obj.GetGeneration(), conditionType, true, drainingReason,
			fmt.Sprintf("waiting for %d %s(s) to go", len(children), k.Child))
		return k.WriteStatus(ctx, obj, st)
	}
	obj = k.DeepCopy(obj)
	obj.SetFinalizers(reconcile.WithoutFinalizer(obj))
	if _, err := k.Client.Update(ctx, obj, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing the finalizer: %w", err)
	}
	return nil
}

// whyNot says why a child is not Provisioned: its first false condition, else
// where it stands.
func whyNot(conds []metav1.Condition, droplet string) string {
	for _, c := range conds {
		if c.Status == metav1.ConditionFalse {
			return c.Reason + ": " + c.Message
		}
	}
	if droplet == "" {
		return "not placed yet"
	}
	return "not yet Provisioned by the agent of droplet " + droplet
}
