package fulfillment

import (
	"context"
	"fmt"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	brokerv1 "mizar.dev/pkg/apis/broker/v1alpha1"
)

// instanceIndex finds the bindings of an instance (namespace/name).
const instanceIndex = "spec.instance"

func bindingInstanceKey(obj any) ([]string, error) {
	if b, ok := obj.(*brokerv1.ServiceBinding); ok {
		return []string{b.Namespace + "/" + b.Spec.Instance}, nil
	}
	return nil, nil
}

// instanceChanged wakes the bindings of an order.
func (c *Controller) instanceChanged(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	in, ok := obj.(*brokerv1.ServiceInstance)
	if !ok {
		return
	}
	bs, err := c.bindingIndex.ByIndex(instanceIndex, in.Namespace+"/"+in.Name)
	if err != nil {
		return
	}
	for _, b := range bs {
		if key, err := cache.ObjectToName(b); err == nil {
			c.bindingQueue.Add(key)
		}
	}
}

// reconcileBinding points a binding at its instance's credentials once the
// instance is Provisioned. The credentials Secret is the instance's: a binding
// adds no workload object, so it has nothing to undo.
func (c *Controller) reconcileBinding(ctx context.Context, namespace, name string) error {
	b, err := c.orders.ServiceBindings(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the binding: %w", err)
	}
	want := b.Status.DeepCopy()
	want.ObservedGeneration = b.Generation
	cond := metav1.Condition{Type: ConditionReady, ObservedGeneration: b.Generation}
	in, err := c.instances.ServiceInstances(namespace).Get(b.Spec.Instance)
	switch {
	case apierrors.IsNotFound(err):
		want.Phase, want.SecretName = brokerv1.PhasePending, ""
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "InstanceNotFound", fmt.Sprintf("service instance %s does not exist", b.Spec.Instance)
	case err != nil:
		return fmt.Errorf("reading instance %s: %w", b.Spec.Instance, err)
	case in.Status.Phase == brokerv1.PhaseProvisioned && in.DeletionTimestamp == nil:
		want.Phase, want.SecretName = brokerv1.PhaseProvisioned, in.Status.ConnectionSecret
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, "Bound", fmt.Sprintf("credentials are in Secret %s (keys host, port, username, password, database)", in.Status.ConnectionSecret)
	default:
		want.Phase, want.SecretName = brokerv1.PhasePending, ""
		cond.Status, cond.Reason = metav1.ConditionFalse, "InstanceNotReady"
		cond.Message = fmt.Sprintf("waiting for service instance %s (%s)", in.Name, phaseOr(string(in.Status.Phase), string(brokerv1.PhasePending)))
	}
	meta.SetStatusCondition(&want.Conditions, cond)
	if apiequality.Semantic.DeepEqual(want, &b.Status) {
		return nil
	}
	b.Status = *want
	if _, err := c.orders.ServiceBindings(namespace).UpdateStatus(ctx, b, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("writing the binding's status: %w", err)
	}
	return nil
}

// deleteBindings deletes every binding of an order being deleted. It asks
// the server, not the cache: a binding the cache has not seen yet must go too.
func (c *Controller) deleteBindings(ctx context.Context, in *brokerv1.ServiceInstance) error {
	bindings := c.orders.ServiceBindings(in.Namespace)
	list, err := bindings.List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.instance", in.Name).String()})
	if err != nil {
		return fmt.Errorf("listing the bindings of %s: %w", in.Name, err)
	}
	for _, b := range list.Items {
		if err := bindings.Delete(ctx, b.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting binding %s of %s: %w", b.Name, in.Name, err)
		}
		klog.InfoS("Deleted the binding of a deprovisioned instance", "binding", klog.KObj(&b), "instance", in.Name)
	}
	return nil
}
