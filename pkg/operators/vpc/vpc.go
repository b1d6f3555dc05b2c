// Package vpc is the VPC operator: it creates a VPC's dividers, moves the VPC
// from Init to Provisioned once all of them are Provisioned, and on deletion
// waits for the VPC's subnets before it drains the dividers.
package vpc

import (
	"context"
	"fmt"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
	informers "mizar.dev/pkg/generated/informers/externalversions"
	listers "mizar.dev/pkg/generated/listers/networking/v1alpha1"
	"mizar.dev/pkg/operators/owner"
	"mizar.dev/pkg/operators/reconcile"
)

// Condition types and reasons the VPC operator writes.
const (
	ConditionDividersReady = "DividersReady"
	ConditionDeleting      = "Deleting"
	ReasonProvisioned      = "AllDividersProvisioned"
	ReasonWaiting          = "DividersNotProvisioned"
	ReasonSubnetsRemain    = "SubnetsRemain"
	ReasonDraining         = "DrainingDividers"
)

// VPCOperator is the one writer of a VPC's phase.
type VPCOperator struct {
	client   versioned.Interface
	vpcs     listers.VpcLister
	dividers cache.SharedIndexInformer
	subnets  cache.SharedIndexInformer
	loop     *reconcile.Loop
	kind     owner.Kind[*v1alpha1.Vpc, *v1alpha1.Divider]
}

// New wires the operator to shared informers; call before the factory starts.
func New(client versioned.Interface, f informers.SharedInformerFactory) (*VPCOperator, error) {
	n := f.Networking().V1alpha1()
	o := &VPCOperator{
		client:   client,
		vpcs:     n.Vpcs().Lister(),
		dividers: n.Dividers().Informer(),
		subnets:  n.Subnets().Informer(),
	}
	o.loop = reconcile.New("vpc-operator", o.Reconcile)
	o.kind = owner.Kind[*v1alpha1.Vpc, *v1alpha1.Divider]{
		Client:    client.NetworkingV1alpha1().Vpcs(),
		DeepCopy:  (*v1alpha1.Vpc).DeepCopy,
		Status:    func(v *v1alpha1.Vpc) *v1alpha1.ProvisioningStatus { return &v.Status.ProvisioningStatus },
		Child:     "divider",
		ChildName: DividerName,
		CreateChild: func(ctx context.Context, vpc *v1alpha1.Vpc, name string) error {
			_, err := client.NetworkingV1alpha1().Dividers().Create(ctx, &v1alpha1.Divider{
				ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: []metav1.OwnerReference{
					*metav1.NewControllerRef(vpc, v1alpha1.SchemeGroupVersion.WithKind("Vpc"))}},
				Spec: v1alpha1.DividerSpec{VPC: vpc.Name},
			}, metav1.CreateOptions{})
			return err
		},
		DeleteChild: func(ctx context.Context, name string) error {
			return client.NetworkingV1alpha1().Dividers().Delete(ctx, name, metav1.DeleteOptions{})
		},
		ChildState: func(d *v1alpha1.Divider) (v1alpha1.Phase, []metav1.Condition, string) {
			return d.Status.Phase, d.Status.Conditions, d.Spec.Droplet
		},
	}
	if err := reconcile.AddIndex(o.dividers, reconcile.ByVPC, reconcile.DividerByVPC); err != nil {
		return nil, err
	}
	if err := reconcile.AddIndex(o.subnets, reconcile.ByVPC, reconcile.SubnetByVPC); err != nil {
		return nil, err
	}
	if _, err := n.Vpcs().Informer().AddEventHandler(o.loop.Handler()); err != nil {
		return nil, err
	}
	if _, err := o.dividers.AddEventHandler(o.loop.MapHandler(func(obj any) []string {
		return []string{obj.(*v1alpha1.Divider).Spec.VPC}
	})); err != nil {
		return nil, err
	}
	if _, err := o.subnets.AddEventHandler(o.loop.MapHandler(func(obj any) []string {
		return []string{obj.(*v1alpha1.Subnet).Spec.VPC}
	})); err != nil {
		return nil, err
	}
	return o, nil
}

// Run reconciles until ctx ends.
func (o *VPCOperator) Run(ctx context.Context, workers int) { o.loop.Run(ctx, workers) }

// DividerName is the name of a VPC's i-th divider.
func DividerName(vpc string, i int32) string { return fmt.Sprintf("%s-d-%d", vpc, i) }

// Reconcile brings one VPC towards its spec.
func (o *VPCOperator) Reconcile(ctx context.Context, name string) error {
	vpc, err := o.vpcs.Get(name)
	if apierrors.IsNotFound(err) {
		return nil // its dividers are collected by the divider operator
	}
	if err != nil {
		return err
	}
	dividers := o.ownDividers(vpc)
	if vpc.DeletionTimestamp != nil {
		return o.drain(ctx, vpc, dividers)
	}
	if vpc, err = o.kind.EnsureFinalizer(ctx, vpc); err != nil {
		return err
	}
	want := max(vpc.Spec.Dividers, 1)
	ready, waiting, err := o.kind.Scale(ctx, vpc, want, dividers)
	if err != nil {
		return err
	}
	st := vpc.Status.DeepCopy()
	if ready == want {
		st.Phase = v1alpha1.PhaseProvisioned
		reconcile.SetCondition(&st.Conditions, vpc.Generation, ConditionDividersReady, true, ReasonProvisioned,
			fmt.Sprintf("%d of %d dividers are Provisioned", ready, want))
	} else {
		// A VPC already serving stays Provisioned while a divider is replaced: its
		// other dividers still route. Only the first provisioning waits.
		if st.Phase == "" {
			st.Phase = v1alpha1.PhaseInit
		}
		reconcile.SetCondition(&st.Conditions, vpc.Generation, ConditionDividersReady, false, ReasonWaiting,
			fmt.Sprintf("%d of %d dividers are Provisioned; waiting for %s", ready, want, strings.Join(waiting, "; ")))
	}
	st.ObservedGeneration = vpc.Generation
	return o.kind.WriteStatus(ctx, vpc, &st.ProvisioningStatus)
}

// drain runs the delete workflow: subnets first, then the dividers, then the VPC.
func (o *VPCOperator) drain(ctx context.Context, vpc *v1alpha1.Vpc, dividers []*v1alpha1.Divider) error {
	remain := ""
	if subnets := reconcile.ByIndex[*v1alpha1.Subnet](o.subnets, reconcile.ByVPC, vpc.Name); len(subnets) > 0 {
		names := make([]string, 0, len(subnets))
		for _, s := range subnets {
			names = append(names, s.Name)
		}
		sort.Strings(names)
		remain = fmt.Sprintf("waiting for %d subnet(s) of the VPC to be deleted: %s", len(names), strings.Join(names, ", "))
	} else {
		// The informer may not have delivered a subnet created just before the
		// VPC was marked: ask etcd (a list without resourceVersion is consistent).
		list, err := o.client.NetworkingV1alpha1().Subnets().List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.vpc", vpc.Name).String(), Limit: 1})
		if err != nil {
			return fmt.Errorf("listing the subnets of deleting VPC %s: %w", vpc.Name, err)
		}
		if len(list.Items) > 0 {
			remain = fmt.Sprintf("waiting for the subnets of the VPC to be deleted, e.g. %s", list.Items[0].Name)
		}
	}
	return o.kind.Drain(ctx, vpc, dividers, ConditionDeleting, ReasonSubnetsRemain, remain, ReasonDraining)
}

// ownDividers are the dividers of this VPC incarnation (a divider left by a
// deleted VPC of the same name is not one of them).
func (o *VPCOperator) ownDividers(vpc *v1alpha1.Vpc) []*v1alpha1.Divider {
	var out []*v1alpha1.Divider
	for _, d := range reconcile.ByIndex[*v1alpha1.Divider](o.dividers, reconcile.ByVPC, vpc.Name) {
		if reconcile.OwnedBy(d, vpc.UID) {
			out = append(out, d)
		}
	}
	return out
}
