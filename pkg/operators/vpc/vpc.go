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
	"k8s.io/client-go/tools/cache"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
	informers "mizar.dev/pkg/generated/informers/externalversions"
	listers "mizar.dev/pkg/generated/listers/networking/v1alpha1"
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
	if !reconcile.HasFinalizer(vpc) {
		vpc = vpc.DeepCopy()
		vpc.Finalizers = append(vpc.Finalizers, reconcile.Finalizer)
		if vpc, err = o.client.NetworkingV1alpha1().Vpcs().Update(ctx, vpc, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("adding the finalizer: %w", err)
		}
	}

	want := vpc.Spec.Dividers
	if want < 1 {
		want = 1
	}
	have := map[string]*v1alpha1.Divider{}
	for _, d := range dividers {
		have[d.Name] = d
	}
	for i := range want {
		n := DividerName(vpc.Name, i)
		if have[n] != nil {
			continue
		}
		d := &v1alpha1.Divider{
			ObjectMeta: metav1.ObjectMeta{Name: n, OwnerReferences: []metav1.OwnerReference{owner(vpc)}},
			Spec:       v1alpha1.DividerSpec{VPC: vpc.Name},
		}
		if _, err := o.client.NetworkingV1alpha1().Dividers().Create(ctx, d, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating divider %s: %w", n, err)
		}
	}
	// Scale in: dividers beyond the count go.
	for n := range have {
		if !isWanted(vpc.Name, n, want) {
			if err := o.client.NetworkingV1alpha1().Dividers().Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting surplus divider %s: %w", n, err)
			}
		}
	}

	var ready int32
	var waiting []string
	for i := range want {
		d := have[DividerName(vpc.Name, i)]
		switch {
		case d == nil:
			waiting = append(waiting, DividerName(vpc.Name, i)+": just created")
		case d.Status.Phase == v1alpha1.PhaseProvisioned:
			ready++
		default:
			waiting = append(waiting, d.Name+": "+whyNot(d))
		}
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
		sort.Strings(waiting)
		reconcile.SetCondition(&st.Conditions, vpc.Generation, ConditionDividersReady, false, ReasonWaiting,
			fmt.Sprintf("%d of %d dividers are Provisioned; waiting for %s", ready, want, strings.Join(waiting, "; ")))
	}
	st.ObservedGeneration = vpc.Generation
	return o.writeStatus(ctx, vpc, st)
}

// drain runs the delete workflow: subnets first, then the dividers, then the VPC.
func (o *VPCOperator) drain(ctx context.Context, vpc *v1alpha1.Vpc, dividers []*v1alpha1.Divider) error {
	if !reconcile.HasFinalizer(vpc) {
		return nil
	}
	st := vpc.Status.DeepCopy()
	st.Phase = v1alpha1.PhaseTerminating
	if subnets := reconcile.ByIndex[*v1alpha1.Subnet](o.subnets, reconcile.ByVPC, vpc.Name); len(subnets) > 0 {
		names := make([]string, 0, len(subnets))
		for _, s := range subnets {
			names = append(names, s.Name)
		}
		sort.Strings(names)
		reconcile.SetCondition(&st.Conditions, vpc.Generation, ConditionDeleting, true, ReasonSubnetsRemain,
			fmt.Sprintf("waiting for %d subnet(s) of the VPC to be deleted: %s", len(names), strings.Join(names, ", ")))
		return o.writeStatus(ctx, vpc, st)
	}
	if len(dividers) > 0 {
		for _, d := range dividers {
			if d.DeletionTimestamp != nil {
				continue
			}
			if err := o.client.NetworkingV1alpha1().Dividers().Delete(ctx, d.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("draining divider %s: %w", d.Name, err)
			}
		}
		reconcile.SetCondition(&st.Conditions, vpc.Generation, ConditionDeleting, true, ReasonDraining,
			fmt.Sprintf("waiting for %d divider(s) to go", len(dividers)))
		return o.writeStatus(ctx, vpc, st)
	}
	vpc = vpc.DeepCopy()
	vpc.Finalizers = reconcile.WithoutFinalizer(vpc)
	if _, err := o.client.NetworkingV1alpha1().Vpcs().Update(ctx, vpc, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing the finalizer: %w", err)
	}
	return nil
}

func (o *VPCOperator) writeStatus(ctx context.Context, vpc *v1alpha1.Vpc, st *v1alpha1.VpcStatus) error {
	if reconcile.SameProvisioning(&vpc.Status.ProvisioningStatus, &st.ProvisioningStatus) {
		return nil
	}
	vpc = vpc.DeepCopy()
	vpc.Status = *st
	if _, err := o.client.NetworkingV1alpha1().Vpcs().UpdateStatus(ctx, vpc, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("writing status: %w", err)
	}
	return nil
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

func isWanted(vpc, divider string, want int32) bool {
	for i := range want {
		if DividerName(vpc, i) == divider {
			return true
		}
	}
	return false
}

func whyNot(d *v1alpha1.Divider) string {
	for _, c := range d.Status.Conditions {
		if c.Status == metav1.ConditionFalse {
			return c.Reason + ": " + c.Message
		}
	}
	if d.Spec.Droplet == "" {
		return "not placed yet"
	}
	return "not yet Provisioned by the agent of droplet " + d.Spec.Droplet
}

func owner(vpc *v1alpha1.Vpc) metav1.OwnerReference {
	return *metav1.NewControllerRef(vpc, v1alpha1.SchemeGroupVersion.WithKind("Vpc"))
}
