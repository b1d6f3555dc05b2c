// Package divider is the Divider operator: it removes dividers whose VPC is gone
// (mizar-apiserver runs no garbage collector), so a VPC re-created under the same
// name never inherits the dividers of the old one.
package divider

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
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
	droplets listers.DropletLister
}

// New wires the operator to shared informers; call before the factory starts.
func New(client versioned.Interface, f informers.SharedInformerFactory) (*DividerOperator, error) {
	n := f.Networking().V1alpha1()
	o := &DividerOperator{client: client, dividers: n.Dividers().Lister(), vpcs: n.Vpcs().Lister(), droplets: n.Droplets().Lister()}
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
	// A divider placed on a droplet that comes or goes has its references checked again.
	if err := reconcile.AddIndex(dividers, reconcile.ByDroplet, reconcile.DividerByDroplet); err != nil {
		return nil, err
	}
	if _, err := n.Droplets().Informer().AddEventHandler(o.loop.MapHandler(func(obj any) []string {
		var keys []string
		for _, x := range reconcile.ByIndex[*v1alpha1.Divider](dividers, reconcile.ByDroplet, obj.(*v1alpha1.Droplet).Name) {
			keys = append(keys, x.Name)
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
		return o.checkReferences(ctx, d) // made by hand; a person owns it
	}
	vpc, err := o.vpcs.Get(d.Spec.VPC)
	if err == nil && vpc.UID == ref.UID {
		return o.checkReferences(ctx, d)
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

// checkReferences holds a divider whose VPC or droplet does not exist with a
// condition saying which, and clears it once they do.
func (o *DividerOperator) checkReferences(ctx context.Context, x *v1alpha1.Divider) error {
	var missing []string
	if _, err := o.vpcs.Get(x.Spec.VPC); apierrors.IsNotFound(err) {
		missing = append(missing, "VPC "+x.Spec.VPC)
	}
	if x.Spec.Droplet != "" {
		if _, err := o.droplets.Get(x.Spec.Droplet); apierrors.IsNotFound(err) {
			missing = append(missing, "droplet "+x.Spec.Droplet)
		}
	}
	// Nothing is written while all is well and always was (no write per divider
	// or bouncer on the provisioning path); a held one is cleared when it resolves.
	if len(missing) == 0 && meta.FindStatusCondition(x.Status.Conditions, reconcile.ConditionReferences) == nil {
		return nil
	}
	updated := x.DeepCopy()
	if !reconcile.SetReferences(&updated.Status.Conditions, x.Generation, missing) {
		return nil
	}
	if _, err := o.client.NetworkingV1alpha1().Dividers().UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("writing the references condition: %w", err)
	}
	return nil
}
