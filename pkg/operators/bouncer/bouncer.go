// Package bouncer is the Bouncer operator: it removes bouncers whose subnet is
// gone and holds any that names a missing subnet or droplet with a condition
// (package placed).
package bouncer

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

// BouncerOperator deletes orphaned bouncers and reports missing references.
type BouncerOperator = placed.Operator[*v1alpha1.Bouncer]

// New wires the operator to shared informers; call before the factory starts.
func New(client versioned.Interface, f informers.SharedInformerFactory) (*BouncerOperator, error) {
	n := f.Networking().V1alpha1()
	bouncers, subnets := client.NetworkingV1alpha1().Bouncers(), n.Subnets().Lister()
	return placed.New(placed.Kind[*v1alpha1.Bouncer]{
		Name:       "bouncer",
		OwnerKind:  "subnet",
		OwnerIndex: reconcile.BySubnet,
		ByOwner:    reconcile.BouncerBySubnet,
		ByDroplet:  reconcile.BouncerByDroplet,
		Objects:    n.Bouncers().Informer(),
		Owners:     n.Subnets().Informer(),
		Droplets:   n.Droplets(),
		Get:        n.Bouncers().Lister().Get,
		OwnerUID: func(name string) (types.UID, error) {
			s, err := subnets.Get(name)
			if err != nil {
				return "", err
			}
			return s.UID, nil
		},
		Owner:      func(b *v1alpha1.Bouncer) string { return b.Spec.Subnet },
		Droplet:    func(b *v1alpha1.Bouncer) string { return b.Spec.Droplet },
		Conditions: func(b *v1alpha1.Bouncer) []metav1.Condition { return b.Status.Conditions },
		Delete:     bouncers.Delete,
		UpdateStatusConditions: func(ctx context.Context, b *v1alpha1.Bouncer, conds []metav1.Condition) error {
			b = b.DeepCopy()
			b.Status.Conditions = conds
			_, err := bouncers.UpdateStatus(ctx, b, metav1.UpdateOptions{})
			return err
		},
	})
}
