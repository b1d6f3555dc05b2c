package brokere2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/broker/fulfillment"
)

const orderName = "db"

func order(ns, plan string) *v1.ServiceInstance {
	return &v1.ServiceInstance{ObjectMeta: metav1.ObjectMeta{Name: orderName, Namespace: ns},
		Spec: v1.ServiceInstanceSpec{Class: "mysql", Plan: plan}}
}

func getOrder(ctx context.Context, m *mizar, ns string) (*v1.ServiceInstance, error) {
	return m.Client.BrokerV1alpha1().ServiceInstances(ns).Get(ctx, orderName, metav1.GetOptions{})
}

// waitOrder waits until cond holds for the order (nil once it is gone).
func waitOrder(t *testing.T, m *mizar, ns, what string, cond func(*v1.ServiceInstance) bool) *v1.ServiceInstance {
	t.Helper()
	var last *v1.ServiceInstance
	waitFor(t, time.Minute, "order "+what, func(ctx context.Context) (bool, error) {
		in, err := getOrder(ctx, m, ns)
		if apierrors.IsNotFound(err) {
			return cond(nil), nil
		}
		if err != nil {
			return false, nil // mizar restarting
		}
		last = in
		return cond(in), nil
	})
	return last
}

func provisioned(in *v1.ServiceInstance) bool {
	return in != nil && in.Status.Phase == v1.PhaseProvisioned
}

// readyPods counts the order's pods that are Ready.
func readyPods(ctx context.Context, ns string) (int, error) {
	pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: fulfillment.LabelInstance + "=" + orderName})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range pods.Items {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				n++
			}
		}
	}
	return n, nil
}

// workloadObjects is what the order made: exactly one of each is expected.
type workloadObjects struct {
	secrets, services, statefulSets int
	secret                          *corev1.Secret
}

func objectsOf(t *testing.T, ns string, uid string) workloadObjects {
	t.Helper()
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: fulfillment.LabelInstanceUID + "=" + uid}
	secrets, err := kube.CoreV1().Secrets(ns).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	services, err := kube.CoreV1().Services(ns).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	sets, err := kube.AppsV1().StatefulSets(ns).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	o := workloadObjects{secrets: len(secrets.Items), services: len(services.Items), statefulSets: len(sets.Items)}
	if o.secrets == 1 {
		o.secret = &secrets.Items[0]
	}
	return o
}

func (o workloadObjects) exactlyOne() error {
	if o.secrets != 1 || o.services != 1 || o.statefulSets != 1 {
		return fmt.Errorf("%d Secrets, %d Services, %d StatefulSets; want one of each", o.secrets, o.services, o.statefulSets)
	}
	return nil
}

// waitGone waits until the namespace holds none of the order's objects,
// pods and claims included (every workload object carries the order's name
// in a label; pods and claims are all the order's in a test's namespace).
func waitGone(t *testing.T, ns string) {
	t.Helper()
	waitGoneNamed(t, ns, orderName, true)
}

func waitGoneNamed(t *testing.T, ns, name string, wholeNamespace bool) {
	t.Helper()
	sel := metav1.ListOptions{LabelSelector: fulfillment.LabelInstance + "=" + name}
	all := sel // pods and claims carry the order's labels too
	if wholeNamespace {
		all = metav1.ListOptions{}
	}
	waitFor(t, time.Minute, "the workload of order "+name+" removed", func(ctx context.Context) (bool, error) {
		sets, e1 := kube.AppsV1().StatefulSets(ns).List(ctx, sel)
		svcs, e2 := kube.CoreV1().Services(ns).List(ctx, sel)
		secrets, e3 := kube.CoreV1().Secrets(ns).List(ctx, sel)
		pods, e4 := kube.CoreV1().Pods(ns).List(ctx, all)
		pvcs, e5 := kube.CoreV1().PersistentVolumeClaims(ns).List(ctx, all)
		if e1 != nil || e2 != nil || e3 != nil || e4 != nil || e5 != nil {
			return false, nil
		}
		return len(sets.Items)+len(svcs.Items)+len(secrets.Items)+len(pods.Items)+len(pvcs.Items) == 0, nil
	})
}

// TestOrderBecomesAStatefulSetWhosePodsAreReady: an order yields the Secret,
// the headless Service and the StatefulSet; the StatefulSet controller, the
// scheduler and kwok bring its pods up one by one, and the order turns
// Provisioned only once all three are Ready. Deprovisioning removes it all.
func TestOrderBecomesAStatefulSetWhosePodsAreReady(t *testing.T) {
	ns := servedNamespace(t, 3, "20Gi")
	m := startMizar(t, t.TempDir())
	applyClass(t, m)
	ctx := context.Background()
	created, err := m.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, "ha"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Every status the order passes through, checked against the pods it describes.
	w, err := m.Client.BrokerV1alpha1().ServiceInstances(ns).Watch(ctx, metav1.ListOptions{
		ResourceVersion: created.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waiting := map[string]bool{}
	deadline := time.After(time.Minute)
	var final *v1.ServiceInstance
	for final == nil {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the order's watch ended")
			}
			in, ok := ev.Object.(*v1.ServiceInstance)
			if !ok {
				continue
			}
			if d := fulfillment.Describe(in); strings.Contains(d, "waiting for") {
				waiting[d] = true
			}
			ready, err := readyPods(ctx, ns)
			if err != nil {
				t.Fatal(err)
			}
			if in.Status.Phase == v1.PhaseProvisioned {
				if ready != 3 {
					t.Fatalf("the order is Provisioned with %d of 3 pods Ready", ready)
				}
				final = in
			}
			if in.Status.Phase == v1.PhaseFailed {
				t.Fatalf("the order failed: %+v", in.Status.Conditions)
			}
		case <-deadline:
			t.Fatalf("the order never became Provisioned; it said %v", waiting)
		}
	}
	// kwok keeps each pod unready for a while: the order said so before it was done.
	sawPartial := false
	for d := range waiting {
		if strings.Contains(d, "/3 replicas ready") && !strings.Contains(d, "3/3") {
			sawPartial = true
		}
	}
	if !sawPartial {
		t.Errorf("the order never said it was waiting for replicas; it said %v", waiting)
	}
	if c := meta.FindStatusCondition(final.Status.Conditions, fulfillment.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Ready condition of the provisioned order: %+v", c)
	}
	objs := objectsOf(t, ns, string(final.UID))
	if err := objs.exactlyOne(); err != nil {
		t.Fatal(err)
	}
	sts, err := kube.AppsV1().StatefulSets(ns).Get(ctx, final.Status.WorkloadName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sts.Status.ReadyReplicas != 3 || *sts.Spec.Replicas != 3 {
		t.Errorf("StatefulSet: %d/%d ready", sts.Status.ReadyReplicas, *sts.Spec.Replicas)
	}
	if got := sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage]; got.Cmp(resource.MustParse("20Gi")) != 0 {
		t.Errorf("claims ask for %v, the ha plan says 20Gi", got.String())
	}
	pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" || p.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s: node %q, phase %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		}
	}

	// Deprovision removes everything it made, down to the pods and claims.
	if err := m.Client.BrokerV1alpha1().ServiceInstances(ns).Delete(ctx, orderName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOrder(t, m, ns, "gone after deprovision", func(in *v1.ServiceInstance) bool { return in == nil })
	waitGone(t, ns)
}

// TestKillDuringTheSagaResumesWithoutDuplicates kills mizar-apiserver with
// SIGKILL in the middle of an order, starts it again on the same data, and
// checks the saga finishes with one of each object and the first credentials.
func TestKillDuringTheSagaResumesWithoutDuplicates(t *testing.T) {
	t.Run("right after the Secret step", func(t *testing.T) {
		ns := servedNamespace(t, 1, "5Gi")
		dir := t.TempDir()
		m := startMizar(t, dir)
		applyClass(t, m)
		ctx := context.Background()
		// The Service create that follows the Secret is held at the proxy; the
		// process dies with it in flight, so it never reaches the cluster.
		arrived, release := proxy.Hold("POST", "/namespaces/"+ns+"/services")
		defer release()
		if _, err := m.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, "small"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-arrived:
		case <-time.After(time.Minute):
			t.Fatal("the Service was never created")
		}
		before, err := getOrder(ctx, m, ns)
		if err != nil {
			t.Fatal(err)
		}
		m.Kill()
		if got := stepStates(before); !strings.Contains(got, fulfillment.StepSecret+"=Done") {
			t.Fatalf("killed at steps %s, want the Secret step done", got)
		}
		objs := objectsOf(t, ns, string(before.UID))
		if objs.secrets != 1 || objs.services != 0 || objs.statefulSets != 0 {
			t.Fatalf("at the kill: %+v, want only the Secret", objs)
		}
		t.Logf("killed with steps %s", stepStates(before))
		resume(t, dir, ns, objs.secret)
	})

	t.Run("while waiting for replicas", func(t *testing.T) {
		ns := servedNamespace(t, 3, "20Gi")
		dir := t.TempDir()
		m := startMizar(t, dir)
		applyClass(t, m)
		ctx := context.Background()
		if _, err := m.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, "ha"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		in := waitOrder(t, m, ns, "waiting for replicas", func(in *v1.ServiceInstance) bool {
			return in != nil && strings.Contains(fulfillment.Describe(in), "WaitingForReplicas")
		})
		m.Kill()
		ready, err := readyPods(ctx, ns)
		if err != nil {
			t.Fatal(err)
		}
		if ready == 3 {
			t.Logf("all pods became ready before the kill landed; the restart still has to notice")
		}
		objs := objectsOf(t, ns, string(in.UID))
		if err := objs.exactlyOne(); err != nil {
			t.Fatalf("at the kill: %v", err)
		}
		t.Logf("killed with steps %s, %d/3 pods ready", stepStates(in), ready)
		resume(t, dir, ns, objs.secret)
	})
}

// resume restarts mizar-apiserver on dir and checks the order finishes with
// exactly one of each object and the credentials it had before.
func resume(t *testing.T, dir, ns string, secret *corev1.Secret) {
	t.Helper()
	m := startMizar(t, dir)
	final := waitOrder(t, m, ns, "Provisioned after the restart", provisioned)
	objs := objectsOf(t, ns, string(final.UID))
	if err := objs.exactlyOne(); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	if objs.secret.UID != secret.UID || string(objs.secret.Data["password"]) != string(secret.Data["password"]) ||
		string(objs.secret.Data["mysql-root-password"]) != string(secret.Data["mysql-root-password"]) {
		t.Errorf("the credentials changed across the restart")
	}
	for _, s := range final.Status.Steps {
		if s.State != v1.StepDone {
			t.Errorf("step %s is %s after provisioning", s.Name, s.State)
		}
	}
	if err := m.Client.BrokerV1alpha1().ServiceInstances(ns).Delete(context.Background(), orderName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOrder(t, m, ns, "gone after deprovision", func(in *v1.ServiceInstance) bool { return in == nil })
	waitGone(t, ns)
}

func stepStates(in *v1.ServiceInstance) string {
	var s []string
	for _, st := range in.Status.Steps {
		s = append(s, st.Name+"="+string(st.State))
	}
	return strings.Join(s, ",")
}

// TestRefusedStatefulSetFailsAndCompensates: the workload cluster's quota
// refuses the StatefulSet, so the order fails at that step, says why and what
// compensation removed, and the Secret and Service it made are gone.
func TestRefusedStatefulSetFailsAndCompensates(t *testing.T) {
	ns := servedNamespace(t, 0, "")
	ctx := context.Background()
	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "no-statefulsets", Namespace: ns},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/statefulsets.apps": resource.MustParse("0")}},
	}
	if _, err := kube.CoreV1().ResourceQuotas(ns).Create(ctx, quota, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Until the quota controller has counted, admission refuses for another reason.
	waitFor(t, time.Minute, "the quota counted", func(ctx context.Context) (bool, error) {
		q, err := kube.CoreV1().ResourceQuotas(ns).Get(ctx, quota.Name, metav1.GetOptions{})
		return err == nil && len(q.Status.Hard) > 0, nil
	})
	m := startMizar(t, t.TempDir())
	applyClass(t, m)
	if _, err := m.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, "small"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in := waitOrder(t, m, ns, "failed", func(in *v1.ServiceInstance) bool {
		if in == nil {
			return false
		}
		c := meta.FindStatusCondition(in.Status.Conditions, fulfillment.ConditionReady)
		return c != nil && c.Reason == "Failed"
	})
	if in.Status.Phase != v1.PhaseFailed {
		t.Errorf("phase %s, want Failed", in.Status.Phase)
	}
	msg := meta.FindStatusCondition(in.Status.Conditions, fulfillment.ConditionReady).Message
	for _, want := range []string{"(" + fulfillment.StepStatefulSet + ") failed", "exceeded quota", "CreatingService, CreatingSecret made"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Ready condition %q does not say %q", msg, want)
		}
	}
	objs := objectsOf(t, ns, string(in.UID))
	if objs.secrets+objs.services+objs.statefulSets != 0 {
		t.Errorf("left behind after compensation: %+v", objs)
	}
	// Deprovisioning the failed order has nothing left to do, and finishes.
	if err := m.Client.BrokerV1alpha1().ServiceInstances(ns).Delete(ctx, orderName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOrder(t, m, ns, "gone after deprovision", func(in *v1.ServiceInstance) bool { return in == nil })
}
