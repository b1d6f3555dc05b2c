package broker

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"

	v1 "mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/broker/fulfillment"
)

// TestOSBUpdateChangesTheStatefulSet: an OSB update to a plan of the same
// storage answers 202 with an update operation, the saga updates the
// StatefulSet and waits for the new replicas, and last_operation follows it
// to succeeded. The spec's rules for updates hold on the way.
func TestOSBUpdateChangesTheStatefulSet(t *testing.T) {
	f := newOSB(t)
	ctx := testContext(t)
	// A bigger plan with ha's storage: five replicas, more CPU.
	c := f.class.DeepCopy()
	plus := c.Spec.Plans[1]
	plus.Name, plus.ID = "ha-plus", plus.ID+"-plus"
	plus.Replicas, plus.CPU = 5, resource.MustParse("4")
	c.Spec.Plans = append(c.Spec.Plans, plus)
	if _, err := shared.Client.BrokerV1alpha1().ServiceClasses().Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		r := f.do("GET", "/v2/catalog", nil, nil)
		return r.code == 200 && strings.Contains(jsonString(r.body), plus.ID), nil
	})
	if err != nil {
		t.Fatal("the catalog never offered the new plan")
	}

	id := "upd-" + utilrand.String(6)
	path := "/v2/service_instances/" + id
	f.expect(f.do("PUT", path+"?accepts_incomplete=true", f.provisionBody(f.haID, nil), nil), 202, "provision")
	f.expect(f.do("PATCH", path+"?accepts_incomplete=true", map[string]any{"service_id": f.serviceID, "plan_id": plus.ID}, nil), 422, "update while provisioning")
	waitStep(t, f, path, "waiting for 0/3 replicas ready")
	markReady(t, f.kube, f.ns, id, 3)
	waitState(t, f, path, "succeeded")

	patch := func(plan string, params map[string]any) map[string]any {
		b := map[string]any{"service_id": f.serviceID, "plan_id": plan}
		if params != nil {
			b["parameters"] = params
		}
		return b
	}
	f.expect(f.do("PATCH", path, patch(plus.ID, nil), nil), 422, "update without accepts_incomplete")
	refused := f.expect(f.do("PATCH", path+"?accepts_incomplete=true", patch(f.smallID, nil), nil), 422, "plan with other storage")
	if d, _ := refused.body["description"].(string); !strings.Contains(d, "storage cannot change") {
		t.Errorf("422 description %q does not say why", d)
	}
	f.expect(f.do("PATCH", path+"?accepts_incomplete=true", patch(plus.ID, map[string]any{"maxConnections": 1}), nil), 400, "invalid parameters")
	if in, err := shared.Client.BrokerV1alpha1().ServiceInstances(f.ns).Get(ctx, id, metav1.GetOptions{}); err != nil || in.Spec.Plan != "ha" || in.Spec.Parameters != nil {
		t.Fatalf("a refused update changed the order: %v %+v", err, in.Spec)
	}
	f.expect(f.do("PATCH", path+"?accepts_incomplete=true", patch(f.haID, nil), nil), 200, "update that changes nothing")

	first := f.expect(f.do("PATCH", path+"?accepts_incomplete=true", patch(plus.ID, nil), nil), 202, "plan update")
	op, _ := first.body["operation"].(string)
	if !strings.HasPrefix(op, "update-") {
		t.Fatalf("update operation %q", op)
	}
	again := f.expect(f.do("PATCH", path+"?accepts_incomplete=true", patch(plus.ID, nil), nil), 202, "same update while it runs")
	if again.body["operation"] != op {
		t.Errorf("repeated update answered operation %v, want %s", again.body["operation"], op)
	}
	f.expect(f.do("PATCH", path+"?accepts_incomplete=true", patch(plus.ID, map[string]any{"maxConnections": 100}), nil), 422, "another update while one runs")
	f.expect(f.do("PUT", path+"?accepts_incomplete=true", f.provisionBody(f.haID, nil), nil), 409, "provision with the old plan")

	waitStep(t, f, path+"?operation="+op, "waiting for 3/5 replicas ready")
	sts, err := f.kube.AppsV1().StatefulSets(f.ns).Get(ctx, workloadOf(t, f.ns, id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cpu := sts.Spec.Template.Spec.Containers[0].Resources.Requests.Cpu(); *sts.Spec.Replicas != 5 || cpu.Cmp(resource.MustParse("4")) != 0 {
		t.Errorf("updated StatefulSet: %d replicas, %v CPU; want 5 and 4", *sts.Spec.Replicas, cpu)
	}
	markReady(t, f.kube, f.ns, id, 5)
	done := waitState(t, f, path+"?operation="+op, "succeeded")
	if d, _ := done.body["description"].(string); !strings.HasPrefix(d, "updated") {
		t.Errorf("description after the update %q", d)
	}
	f.expect(f.do("PATCH", path+"?accepts_incomplete=true", patch(plus.ID, nil), nil), 200, "the same update once done")
	f.expect(f.do("DELETE", path+"?accepts_incomplete=true&service_id="+f.serviceID+"&plan_id="+plus.ID, nil, nil), 202, "deprovision")
	workloadGoneEventually(t, f, id)
}

func waitStep(t *testing.T, f *osbFixture, path, want string) {
	t.Helper()
	var lo reply
	err := wait.PollUntilContextTimeout(testContext(t), 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		lo = f.do("GET", lastOp(path), nil, nil)
		d, _ := lo.body["description"].(string)
		return lo.body["state"] == "in progress" && strings.Contains(d, want), nil
	})
	if err != nil {
		t.Fatalf("last_operation never said %q: %v", want, lo.body)
	}
}

func waitState(t *testing.T, f *osbFixture, path, state string) reply {
	t.Helper()
	var lo reply
	err := wait.PollUntilContextTimeout(testContext(t), 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		lo = f.do("GET", lastOp(path), nil, nil)
		return lo.body["state"] == state, nil
	})
	if err != nil {
		t.Fatalf("last_operation never %s: %v", state, lo.body)
	}
	return lo
}

// lastOp turns an instance path (with an optional ?operation=) into its last_operation path.
func lastOp(path string) string {
	p, q, ok := strings.Cut(path, "?")
	if ok {
		return p + "/last_operation?" + q
	}
	return p + "/last_operation"
}

func workloadGoneEventually(t *testing.T, f *osbFixture, id string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(testContext(t), 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := shared.Client.BrokerV1alpha1().ServiceInstances(f.ns).Get(ctx, id, metav1.GetOptions{})
		return err != nil, nil
	})
	if err != nil {
		t.Fatal("the deprovisioned order never went away")
	}
	workloadGone(t, f.kube, f.ns, id)
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestUpdateWhileProvisioningReachesTheStatefulSet: a plan changed (kubectl's
// way) after the StatefulSet was made but before the order is Provisioned is
// not lost: the saga goes back to the StatefulSet and waits for the new count.
func TestUpdateWhileProvisioningReachesTheStatefulSet(t *testing.T) {
	ctx := testContext(t)
	c := createClass(t)
	plus := c.Spec.Plans[1]
	plus.Name, plus.ID, plus.Replicas = "ha-plus", plus.ID+"-plus", 5
	c.Spec.Plans = append(c.Spec.Plans, plus)
	if _, err := shared.Client.BrokerV1alpha1().ServiceClasses().Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	kube, _ := workload()
	startOperator(t, kube)
	ns := "team-" + utilrand.String(6)
	instances := shared.Client.BrokerV1alpha1().ServiceInstances(ns)
	if _, err := instances.Create(ctx, order(ns, "db", c.Name, "ha", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in := waitOrder(t, ns, "db", "waited for 3 replicas", func(in *v1.ServiceInstance) bool {
		return in != nil && stepOf(in, fulfillment.StepReplicas).Message == "waiting for 0/3 replicas ready"
	})
	in.Spec.Plan = "ha-plus"
	if _, err := instances.Update(ctx, in, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOrder(t, ns, "db", "waited for 5 replicas", func(in *v1.ServiceInstance) bool {
		return in != nil && stepOf(in, fulfillment.StepReplicas).Message == "waiting for 0/5 replicas ready"
	})
	sts, err := kube.AppsV1().StatefulSets(ns).Get(ctx, workloadOf(t, ns, "db"), metav1.GetOptions{})
	if err != nil || *sts.Spec.Replicas != 5 {
		t.Fatalf("StatefulSet after the plan change: %v %v", err, sts)
	}
	markReady(t, kube, ns, "db", 5)
	waitOrder(t, ns, "db", "Provisioned on the new plan", func(in *v1.ServiceInstance) bool {
		return in != nil && in.Status.Phase == v1.PhaseProvisioned && in.Status.ObservedGeneration == in.Generation
	})
}
