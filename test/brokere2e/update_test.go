package brokere2e

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "mizar.dev/pkg/apis/broker/v1alpha1"
)

// TestPlanUpdateRollsTheStatefulSet: a provisioned order moved to a bigger
// plan (same storage) gets a new operation; the saga updates the StatefulSet,
// the controller rolls and scales it on kwok's nodes, and the order is
// Provisioned again only once all five replicas run the new template.
func TestPlanUpdateRollsTheStatefulSet(t *testing.T) {
	ns := servedNamespace(t, 5, "20Gi")
	m := startMizar(t, t.TempDir())
	applyClass(t, m)
	ctx := context.Background()
	class, err := m.Client.BrokerV1alpha1().ServiceClasses().Get(ctx, "mysql", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	plus := class.Spec.Plans[1]
	plus.Name, plus.ID = "ha-plus", plus.ID+"-plus"
	plus.Replicas, plus.CPU = 5, resource.MustParse("4")
	class.Spec.Plans = append(class.Spec.Plans, plus)
	if _, err := m.Client.BrokerV1alpha1().ServiceClasses().Update(ctx, class, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, "ha"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in := waitOrder(t, m, ns, "Provisioned", provisioned)

	in.Spec.Plan = "ha-plus"
	updated, err := m.Client.BrokerV1alpha1().ServiceInstances(ns).Update(ctx, in, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(updated.Status.Operation, "update-") {
		t.Errorf("operation after the plan change %q", updated.Status.Operation)
	}
	waitOrder(t, m, ns, "updating", func(in *v1.ServiceInstance) bool {
		return in != nil && in.Status.ObservedGeneration == updated.Generation && in.Status.Phase == v1.PhaseProvisioning
	})
	final := waitOrder(t, m, ns, "Provisioned on the new plan", func(in *v1.ServiceInstance) bool {
		return provisioned(in) && in.Status.ObservedGeneration == updated.Generation
	})
	ready, err := readyPods(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	sts, err := kube.AppsV1().StatefulSets(ns).Get(ctx, final.Status.WorkloadName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cpu := sts.Spec.Template.Spec.Containers[0].Resources.Requests.Cpu()
	if ready != 5 || *sts.Spec.Replicas != 5 || cpu.Cmp(resource.MustParse("4")) != 0 || sts.Status.CurrentRevision != sts.Status.UpdateRevision {
		t.Errorf("after the update: %d pods ready, %d replicas, %v CPU, revision %s -> %s", ready, *sts.Spec.Replicas, cpu, sts.Status.CurrentRevision, sts.Status.UpdateRevision)
	}
	if err := objectsOf(t, ns, string(final.UID)).exactlyOne(); err != nil {
		t.Error(err)
	}

	// A plan with other storage is refused up front; the order stays as it is.
	final.Spec.Plan = "small"
	if _, err := m.Client.BrokerV1alpha1().ServiceInstances(ns).Update(ctx, final, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "storage cannot change") {
		t.Errorf("a plan change to other storage: %v", err)
	}

	if err := m.Client.BrokerV1alpha1().ServiceInstances(ns).Delete(ctx, orderName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOrder(t, m, ns, "gone after deprovision", func(in *v1.ServiceInstance) bool { return in == nil })
	waitGone(t, ns)
}
