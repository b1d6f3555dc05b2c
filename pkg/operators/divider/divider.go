// Package divider is the Divider operator: it removes dividers whose VPC is gone
// and holds any that names a missing VPC or droplet with a condition (package placed).
package divider

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
	informers "mizar.dev/pkg/generated/informers/externalversions"
	"mizar.dev/pkg/operators/placed"
	"mizar.dev/pkg/operators/reconcile"
)

// DividerOperator deletes orphaned dividers and reports missing references.
type DividerOperator = placed.Operator[*v1alpha1.Divider]

// New wires the operator to shared informers; call before the factory starts.
func New(client versioned.Interface, f informers.SharedInformerFactory) (*DividerOperator, error) {
	n := f.Networking().V1alpha1()
	dividers, vpcs := client.NetworkingV1alpha1().Dividers(), n.Vpcs().Lister()
	return placed.New(placed.Kind[*v1alpha1.Divider]{
		Name:       "divider",
		OwnerKind:  "VPC",
		OwnerIndex: reconcile.ByVPC,
		ByOwner:    reconcile.DividerByVPC,
		ByDroplet:  reconcile.DividerByDroplet,
		Objects:    n.Dividers().Informer(),
		Owners:     n.Vpcs().Informer(),
		Droplets:   n.Droplets(),
		Get:        n.Dividers().Lister().Get,
		OwnerUID: func(name string) (types.UID, error) {
			v, err := vpcs.Get(name)
			if err != nil {
				return "", err
			}
			return v.UID, nil
		},
		Owner:      func(d *v1alpha1.Divider) string { return d.Spec.VPC },
		Droplet:    func(d *v1alpha1.Divider) string { return d.Spec.Droplet },
		Conditions: func(d *v1alpha1.Divider) []metav1.Condition { return d.Status.Conditions },
		Delete:     dividers.Delete,
		UpdateStatusConditions: func(ctx context.Context, d *v1alpha1.Divider, conds []metav1.Condition) error {
			d = d.DeepCopy()
			d.Status.Conditions = conds
			_, err := dividers.UpdateStatus(ctx, d, metav1.UpdateOptions{})
			return err
		},
	})
}
