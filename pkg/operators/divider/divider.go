// Package divider is the Divider operator: it removes dividers whose VPC is gone
// (mizar-apiserver runs no garbage collector), so a VPC re-created under the same
// name never inherits the dividers of the old one.
package divider

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
	informers "mizar.dev/pkg/generated/informers/externalversions"
	listers "mizar.dev/pkg/generated/listers/networking/v1alpha1"
	"mizar.dev/pkg/operators/reconcile"
)

// DividerOperator deletes orphaned dividers.
type DividerOperator struct {
	client   versioned.Interface
	dividers listers.DividerLister
	vpcs     listers.VpcLister
	loop     *reconcile.Loop
}

// New wires the operator to shared informers; call before the factory starts.
func New(client versioned.Interface, f informers.SharedInformerFactory) (*DividerOperator, error) {
	n := f.Networking().V1alpha1()
	o := &DividerOperator{client: client, dividers: n.Dividers().Lister(), vpcs: n.Vpcs().Lister()}
	o.loop = reconcile.New("divider-operator", o.Reconcile)
	dividers := n.Dividers().Informer()
	if err := reconcile.AddIndex(dividers, reconcile.ByVPC, reconcile.DividerByVPC); err != nil {
		return nil, err
	}
	if _, err := dividers.AddEventHandler(o.loop.Handler()); err != nil {
		return nil, err
	}
	if _, err := n.Vpcs().Informer().AddEventHandler(o.loop.MapHandler(func(obj any) []string {
		var keys []string
		for _, d := range reconcile.ByIndex[*v1alpha1.Divider](dividers, reconcile.ByVPC, obj.(*v1alpha1.Vpc).Name) {
			keys = append(keys, d.Name)
		}
		return keys
	})); err != nil {
		return nil, err
	}
	return o, nil
}

// Run reconciles until ctx ends.
func (o *DividerOperator) Run(ctx context.Context, workers int) { o.loop.Run(ctx, workers) }

// Reconcile deletes the divider if the VPC that created it no longer exists.
func (o *DividerOperator) Reconcile(ctx context.Context, name string) error {
	d, err := o.dividers.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil || d.DeletionTimestamp != nil {
		return err
	}
	ref := metav1.GetControllerOf(d)
	if ref == nil {
		return nil // made by hand; a person owns it
	}
	vpc, err := o.vpcs.Get(d.Spec.VPC)
	if err == nil && vpc.UID == ref.UID {
		return nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	// Preconditioned on the UID so a divider re-created meanwhile survives.
	uid := d.UID
	err = o.client.NetworkingV1alpha1().Dividers().Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting orphaned divider: %w", err)
	}
	return nil
}
