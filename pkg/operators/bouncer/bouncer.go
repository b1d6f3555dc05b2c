// Package bouncer is the Bouncer operator: it removes bouncers whose subnet is gone
// (mizar-apiserver runs no garbage collector), so a subnet re-created under the same
// name never inherits the bouncers of the old one.
package bouncer

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

// BouncerOperator deletes orphaned bouncers.
type BouncerOperator struct {
	client   versioned.Interface
	bouncers listers.BouncerLister
	subnets  listers.SubnetLister
	loop     *reconcile.Loop
	droplets listers.DropletLister
}

// New wires the operator to shared informers; call before the factory starts.
func New(client versioned.Interface, f informers.SharedInformerFactory) (*BouncerOperator, error) {
	n := f.Networking().V1alpha1()
	o := &BouncerOperator{client: client, bouncers: n.Bouncers().Lister(), subnets: n.Subnets().Lister(), droplets: n.Droplets().Lister()}
	o.loop = reconcile.New("bouncer-operator", o.Reconcile)
	bouncers := n.Bouncers().Informer()
	if err := reconcile.AddIndex(bouncers, reconcile.BySubnet, reconcile.BouncerBySubnet); err != nil {
		return nil, err
	}
	if _, err := bouncers.AddEventHandler(o.loop.Handler()); err != nil {
		return nil, err
	}
	if _, err := n.Subnets().Informer().AddEventHandler(o.loop.MapHandler(func(obj any) []string {
		var keys []string
		for _, d := range reconcile.ByIndex[*v1alpha1.Bouncer](bouncers, reconcile.BySubnet, obj.(*v1alpha1.Subnet).Name) {
			keys = append(keys, d.Name)
		}
		return keys
	})); err != nil {
		return nil, err
	}
	// A bouncer placed on a droplet that comes or goes has its references checked again.
	if err := reconcile.AddIndex(bouncers, reconcile.ByDroplet, reconcile.BouncerByDroplet); err != nil {
		return nil, err
	}
	if _, err := n.Droplets().Informer().AddEventHandler(o.loop.MapHandler(func(obj any) []string {
		var keys []string
		for _, x := range reconcile.ByIndex[*v1alpha1.Bouncer](bouncers, reconcile.ByDroplet, obj.(*v1alpha1.Droplet).Name) {
			keys = append(keys, x.Name)
		}
		return keys
	})); err != nil {
		return nil, err
	}
	return o, nil
}

// Run reconciles until ctx ends.
func (o *BouncerOperator) Run(ctx context.Context, workers int) { o.loop.Run(ctx, workers) }

// Reconcile deletes the bouncer if the subnet that created it no longer exists.
func (o *BouncerOperator) Reconcile(ctx context.Context, name string) error {
	d, err := o.bouncers.Get(name)
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
	subnet, err := o.subnets.Get(d.Spec.Subnet)
	if err == nil && subnet.UID == ref.UID {
		return o.checkReferences(ctx, d)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	// Preconditioned on the UID so a bouncer re-created meanwhile survives.
	uid := d.UID
	err = o.client.NetworkingV1alpha1().Bouncers().Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting orphaned bouncer: %w", err)
	}
	return nil
}

// checkReferences holds a bouncer whose subnet or droplet does not exist with a
// condition saying which, and clears it once they do.
func (o *BouncerOperator) checkReferences(ctx context.Context, x *v1alpha1.Bouncer) error {
	var missing []string
	if _, err := o.subnets.Get(x.Spec.Subnet); apierrors.IsNotFound(err) {
		missing = append(missing, "subnet "+x.Spec.Subnet)
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
	if _, err := o.client.NetworkingV1alpha1().Bouncers().UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("writing the references condition: %w", err)
	}
	return nil
}
