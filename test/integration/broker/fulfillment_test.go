package broker

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	v1 "mizar.dev/pkg/apis/broker/v1alpha1"
	networkingv1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/broker/fulfillment"
	"mizar.dev/pkg/broker/saga"
)

// The workload cluster here is client-go's fake clientset: no kubelet runs in
// this test, so replicas become ready when the test says so. The orders, the
// classes and the subnets live in the real mizar-apiserver.

// creates counts creates per resource/name in the workload cluster.
type creates struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *creates) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

func workload() (*kubefake.Clientset, *creates) {
	kube := kubefake.NewClientset()
	cr := &creates{n: map[string]int{}}
	kube.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj := a.(k8stesting.CreateAction).GetObject().(metav1.Object)
		cr.mu.Lock()
		cr.n[a.GetResource().Resource+"/"+obj.GetName()]++
		cr.mu.Unlock()
		return false, nil, nil
	})
	return kube, cr
}

// startOperator runs the fulfillment operator until the returned stop is called
// (or the test ends).
func startOperator(t testing.TB, kube *kubefake.Clientset) (stop func()) {
	t.Helper()
	c, err := fulfillment.New(shared.Client, kube)
	if err != nil {
		t.Fatal(err)
	}
	c.Backoff = saga.Backoff{Initial: 20 * time.Millisecond, Factor: 2, Max: 200 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(ctx, 2); err != nil {
			t.Errorf("operator: %v", err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// waitOrder waits until cond holds for the order, and returns it.
func waitOrder(t *testing.T, ns, name, what string, cond func(*v1.ServiceInstance) bool) *v1.ServiceInstance {
	t.Helper()
	var last *v1.ServiceInstance
	err := wait.PollUntilContextTimeout(testContext(t), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		in, err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			last = nil
			return cond(nil), nil
		}
		if err != nil {
			return false, err
		}
		last = in
		return cond(in), nil
	})
	if err != nil {
		t.Fatalf("order %s/%s never %s: %v; last seen %+v", ns, name, what, err, last)
	}
	return last
}

func stepOf(in *v1.ServiceInstance, name string) v1.Step {
	for _, s := range in.Status.Steps {
		if s.Name == name {
			return s
		}
	}
	return v1.Step{}
}

func markReady(t *testing.T, kube *kubefake.Clientset, ns, name string, ready int32) {
	t.Helper()
	w := workloadOf(t, ns, name)
	var sts *appsv1.StatefulSet
	err := wait.PollUntilContextTimeout(testContext(t), 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		sts, err = kube.AppsV1().StatefulSets(ns).Get(ctx, w, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("StatefulSet %s/%s of order %s never made", ns, w, name)
	}
	sts.Status.ReadyReplicas, sts.Status.Replicas = ready, ready
	if _, err := kube.AppsV1().StatefulSets(ns).UpdateStatus(testContext(t), sts, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// workloadOf is the name of an order's StatefulSet and Service (its Secret
// adds "-credentials"), as the order's status keeps it.
func workloadOf(t *testing.T, ns, name string) string {
	t.Helper()
	in := waitOrder(t, ns, name, "named its workload", func(in *v1.ServiceInstance) bool { return in != nil && in.Status.WorkloadName != "" })
	if msgs := validation.IsDNS1035Label(in.Status.WorkloadName); len(msgs) > 0 {
		t.Fatalf("workload name %q of order %s: %v", in.Status.WorkloadName, name, msgs)
	}
	return in.Status.WorkloadName
}

// workloadGone checks that nothing made for the order named name is left:
// every workload object carries the order's name in a label.
func workloadGone(t *testing.T, kube *kubefake.Clientset, ns, name string) {
	t.Helper()
	ctx := testContext(t)
	sel := metav1.ListOptions{LabelSelector: fulfillment.LabelInstance + "=" + name}
	sets, err1 := kube.AppsV1().StatefulSets(ns).List(ctx, sel)
	svcs, err2 := kube.CoreV1().Services(ns).List(ctx, sel)
	secrets, err3 := kube.CoreV1().Secrets(ns).List(ctx, sel)
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatal(err1, err2, err3)
	}
	if n := len(sets.Items) + len(svcs.Items) + len(secrets.Items); n > 0 {
		t.Errorf("order %s/%s left %d StatefulSets, %d Services, %d Secrets behind", ns, name, len(sets.Items), len(svcs.Items), len(secrets.Items))
	}
}

func TestOrderBecomesProvisionedOnlyWhenReplicasAreReady(t *testing.T) {
	ctx := testContext(t)
	c := createClass(t)
	kube, cr := workload()
	startOperator(t, kube)
	ns := "team-" + utilrand.String(6)

	if _, err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, "db", c.Name, "ha", `{"database":"shop"}`), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in := waitOrder(t, ns, "db", "waited for its replicas", func(in *v1.ServiceInstance) bool {
		return in != nil && stepOf(in, fulfillment.StepReplicas).Message == "waiting for 0/3 replicas ready"
	})
	if in.Status.Phase != v1.PhaseProvisioning {
		t.Errorf("phase %s while replicas are not ready", in.Status.Phase)
	}
	if r := meta.FindStatusCondition(in.Status.Conditions, fulfillment.ConditionReady); r == nil || r.Message != "step 5 of 5 (WaitingForReplicas): waiting for 0/3 replicas ready" {
		t.Errorf("Ready condition %+v", r)
	}
	if !strings.Contains(strings.Join(in.Finalizers, ","), fulfillment.Finalizer) {
		t.Errorf("finalizers %v", in.Finalizers)
	}

	w := workloadOf(t, ns, "db")
	sts, err := kube.AppsV1().StatefulSets(ns).Get(ctx, w, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctr := sts.Spec.Template.Spec.Containers[0]
	claim := sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage]
	if *sts.Spec.Replicas != 3 || ctr.Image != c.Spec.Image || claim.String() != "20Gi" || ctr.ReadinessProbe == nil ||
		ctr.Resources.Limits.Cpu().String() != "2" || sts.Spec.ServiceName != w ||
		sts.Labels[fulfillment.LabelInstanceUID] != string(in.UID) {
		t.Errorf("StatefulSet spec %+v", sts.Spec)
	}
	svc, err := kube.CoreV1().Services(ns).Get(ctx, w, metav1.GetOptions{})
	if err != nil || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("headless Service: %v %+v", err, svc)
	}
	secret, err := kube.CoreV1().Secrets(ns).Get(ctx, w+"-credentials", metav1.GetOptions{})
	if err != nil || secret.StringData["database"] != "shop" || len(secret.StringData["password"]) < 16 || secret.StringData["port"] != "3306" {
		t.Errorf("credentials Secret: %v %+v", err, secret)
	}

	// A binding made early waits for the instance, woken by the watch.
	if _, err := shared.Client.BrokerV1alpha1().ServiceBindings(ns).Create(ctx, &v1.ServiceBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "app"}, Spec: v1.ServiceBindingSpec{Instance: "db"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitBinding(t, ns, "app", "InstanceNotReady")

	markReady(t, kube, ns, "db", 2)
	waitOrder(t, ns, "db", "saw 2/3", func(in *v1.ServiceInstance) bool {
		return stepOf(in, fulfillment.StepReplicas).Message == "waiting for 2/3 replicas ready"
	})
	markReady(t, kube, ns, "db", 3)
	in = waitOrder(t, ns, "db", "became Provisioned", func(in *v1.ServiceInstance) bool { return in.Status.Phase == v1.PhaseProvisioned })
	if in.Status.ConnectionSecret != w+"-credentials" {
		t.Errorf("connection secret %q", in.Status.ConnectionSecret)
	}
	for _, key := range []string{"statefulsets/" + w, "services/" + w, "secrets/" + w + "-credentials"} {
		if n := cr.get(key); n != 1 {
			t.Errorf("%s created %d times", key, n)
		}
	}
	if b := waitBinding(t, ns, "app", "Bound"); b.Status.SecretName != w+"-credentials" || b.Status.Phase != v1.PhaseProvisioned {
		t.Errorf("binding status %+v", b.Status)
	}

	// Deprovision removes everything, then the order.
	if err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOrder(t, ns, "db", "went away", func(in *v1.ServiceInstance) bool { return in == nil })
	workloadGone(t, kube, ns, "db")
}

func TestOrderWaitsForItsSubnetWokenByTheWatch(t *testing.T) {
	ctx := testContext(t)
	c := createClass(t)
	kube, _ := workload()
	startOperator(t, kube)
	ns, suffix := "team-"+utilrand.String(6), utilrand.String(6)
	vpc := &networkingv1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: "vpc-" + suffix}, Spec: networkingv1.VpcSpec{CIDR: "10.0.0.0/16"}}
	if _, err := shared.Client.NetworkingV1alpha1().Vpcs().Create(ctx, vpc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	subnet := &networkingv1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: "sn-" + suffix}, Spec: networkingv1.SubnetSpec{VPC: vpc.Name, CIDR: "10.0.1.0/24"}}
	subnet, err := shared.Client.NetworkingV1alpha1().Subnets().Create(ctx, subnet, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = shared.Client.NetworkingV1alpha1().Subnets().Delete(context.Background(), subnet.Name, metav1.DeleteOptions{})
		_ = shared.Client.NetworkingV1alpha1().Vpcs().Delete(context.Background(), vpc.Name, metav1.DeleteOptions{})
	})
	o := order(ns, "db", c.Name, "small", "")
	o.Spec.Subnet = subnet.Name
	if _, err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, o, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOrder(t, ns, "db", "waited for the subnet", func(in *v1.ServiceInstance) bool {
		return stepOf(in, fulfillment.StepSubnet).Message == fmt.Sprintf("waiting for subnet %s to be Provisioned (it is Init)", subnet.Name)
	})
	if _, err := kube.AppsV1().StatefulSets(ns).Get(ctx, workloadOf(t, ns, "db"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("StatefulSet made before the subnet was Provisioned (%v)", err)
	}
	subnet.Status.Phase = networkingv1.PhaseProvisioned
	if _, err := shared.Client.NetworkingV1alpha1().Subnets().UpdateStatus(ctx, subnet, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOrder(t, ns, "db", "moved on to its replicas", func(in *v1.ServiceInstance) bool {
		return stepOf(in, fulfillment.StepReplicas).State == v1.StepRunning
	})
	sts, err := kube.AppsV1().StatefulSets(ns).Get(ctx, workloadOf(t, ns, "db"), metav1.GetOptions{})
	if err != nil || sts.Spec.Template.Annotations[fulfillment.AnnotationSubnet] != subnet.Name {
		t.Errorf("pods are not annotated with the subnet: %v %v", err, sts)
	}
	if err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOrder(t, ns, "db", "went away", func(in *v1.ServiceInstance) bool { return in == nil })
}

func TestForbiddenNamespaceFailsAndCompensates(t *testing.T) {
	ctx := testContext(t)
	c := createClass(t)
	kube, _ := workload()
	ns := "locked-" + utilrand.String(6)
	kube.PrependReactor("create", "statefulsets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetNamespace() != ns {
			return false, nil, nil
		}
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "statefulsets"}, "db",
			fmt.Errorf(`User "system:serviceaccount:mizar:fulfillment" cannot create resource "statefulsets" in namespace %q`, ns))
	})
	startOperator(t, kube)
	if _, err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, "db", c.Name, "small", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in := waitOrder(t, ns, "db", "failed", func(in *v1.ServiceInstance) bool {
		r := meta.FindStatusCondition(in.Status.Conditions, fulfillment.ConditionReady)
		return in.Status.Phase == v1.PhaseFailed && r != nil && r.Reason == "Failed"
	})
	r := meta.FindStatusCondition(in.Status.Conditions, fulfillment.ConditionReady)
	if !strings.Contains(r.Message, "step 4 of 5 (CreatingStatefulSet) failed: creating the StatefulSet") || !strings.Contains(r.Message, "forbidden") ||
		!strings.HasSuffix(r.Message, "; removed what CreatingStatefulSet, CreatingService, CreatingSecret made") {
		t.Errorf("Ready message %q", r.Message)
	}
	if s := stepOf(in, fulfillment.StepSecret); s.State != v1.StepCompensated {
		t.Errorf("secret step %+v", s)
	}
	workloadGone(t, kube, ns, "db")
}

func TestDeprovisionDuringProvisioningStopsAndCleansUp(t *testing.T) {
	ctx := testContext(t)
	c := createClass(t)
	kube, _ := workload()
	startOperator(t, kube)
	ns := "team-" + utilrand.String(6)
	if _, err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, "db", c.Name, "small", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOrder(t, ns, "db", "reached its replicas", func(in *v1.ServiceInstance) bool {
		return stepOf(in, fulfillment.StepReplicas).State == v1.StepRunning
	})
	if err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOrder(t, ns, "db", "went away", func(in *v1.ServiceInstance) bool { return in == nil })
	workloadGone(t, kube, ns, "db")
}

func TestDeadlineFailsAndCompensates(t *testing.T) {
	ctx := testContext(t)
	c := createClass(t)
	kube, _ := workload()
	startOperator(t, kube)
	ns := "team-" + utilrand.String(6)
	o := order(ns, "db", c.Name, "small", "")
	o.Spec.Deadline = &metav1.Duration{Duration: 3 * time.Second}
	if _, err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, o, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in := waitOrder(t, ns, "db", "failed at its deadline", func(in *v1.ServiceInstance) bool {
		r := meta.FindStatusCondition(in.Status.Conditions, fulfillment.ConditionReady)
		return r != nil && r.Reason == "Failed"
	})
	if s := stepOf(in, fulfillment.StepReplicas); !strings.Contains(s.Message, "deadline") || s.State != v1.StepCompensated {
		t.Errorf("replicas step %+v", s)
	}
	workloadGone(t, kube, ns, "db")
	if err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOrder(t, ns, "db", "went away", func(in *v1.ServiceInstance) bool { return in == nil })
}

func TestRestartedOperatorResumesWithoutDuplicates(t *testing.T) {
	ctx := testContext(t)
	c := createClass(t)
	kube, cr := workload()
	stop := startOperator(t, kube)
	ns := "team-" + utilrand.String(6)
	if _, err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, "db", c.Name, "ha", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOrder(t, ns, "db", "reached its replicas", func(in *v1.ServiceInstance) bool {
		return stepOf(in, fulfillment.StepReplicas).State == v1.StepRunning
	})
	w := workloadOf(t, ns, "db")
	before, err := kube.CoreV1().Secrets(ns).Get(ctx, w+"-credentials", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stop()
	startOperator(t, kube)
	markReady(t, kube, ns, "db", 3)
	waitOrder(t, ns, "db", "became Provisioned", func(in *v1.ServiceInstance) bool { return in.Status.Phase == v1.PhaseProvisioned })
	for _, key := range []string{"statefulsets/" + w, "services/" + w, "secrets/" + w + "-credentials"} {
		if n := cr.get(key); n != 1 {
			t.Errorf("%s created %d times", key, n)
		}
	}
	after, err := kube.CoreV1().Secrets(ns).Get(ctx, w+"-credentials", metav1.GetOptions{})
	if err != nil || after.StringData["password"] != before.StringData["password"] {
		t.Errorf("credentials changed across the restart (%v)", err)
	}
}

// waitBinding waits until the binding's Ready condition has reason.
func waitBinding(t *testing.T, ns, name, reason string) *v1.ServiceBinding {
	t.Helper()
	var last *v1.ServiceBinding
	err := wait.PollUntilContextTimeout(testContext(t), 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		b, err := shared.Client.BrokerV1alpha1().ServiceBindings(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = b
		r := meta.FindStatusCondition(b.Status.Conditions, fulfillment.ConditionReady)
		return r != nil && r.Reason == reason, nil
	})
	if err != nil {
		t.Fatalf("binding %s/%s never %s: %v; last %+v", ns, name, reason, err, last)
	}
	return last
}
