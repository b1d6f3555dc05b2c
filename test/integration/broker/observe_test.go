package broker

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics/legacyregistry"

	v1 "mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/broker/fulfillment"
	"mizar.dev/pkg/broker/saga"
	"mizar.dev/test/cluster"
	"mizar.dev/test/logtest"
	"mizar.dev/test/workloadcluster"
)

// counter reads one series of the process's legacy registry (0 when absent).
func counter(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// A step that fails twice and then for good: each retry and the failure
// leave a log line and a Warning Event on the order (in a real kube-apiserver,
// as kubectl lists them), and mizar_saga_steps_total counts the outcomes.
func TestSagaStepEventsLogsAndMetrics(t *testing.T) {
	ctx := testContext(t)
	wc := workloadcluster.StartAPIServer(t)
	events, err := kubernetes.NewForConfig(wc.Admin)
	if err != nil {
		t.Fatal(err)
	}
	logs := logtest.Capture(t, 0)
	c := createClass(t)
	kube, _ := workload()
	ns := "default" // the Events' namespace must exist in the events cluster
	name := "flaky-" + utilrand.String(6)
	var attempts atomic.Int32
	kube.PrependReactor("create", "statefulsets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.CreateAction).GetObject().(metav1.Object).GetLabels()[fulfillment.LabelInstance] != name {
			return false, nil, nil
		}
		if attempts.Add(1) <= 2 {
			return true, nil, apierrors.NewInternalError(errors.New("etcd leader changed"))
		}
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "statefulsets"}, name,
			fmt.Errorf("quota %q exceeded", "no-more-"+name))
	})
	retried := counter(t, "mizar_saga_steps_total", map[string]string{"step": fulfillment.StepStatefulSet, "outcome": saga.OutcomeRetrying})
	failed := counter(t, "mizar_saga_steps_total", map[string]string{"step": fulfillment.StepStatefulSet, "outcome": saga.OutcomeFailed})

	op, err := fulfillment.New(shared.Client, kube)
	if err != nil {
		t.Fatal(err)
	}
	op.Backoff = saga.Backoff{Initial: 20 * time.Millisecond, Factor: 2, Max: 200 * time.Millisecond}
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: events.CoreV1().Events("")})
	t.Cleanup(b.Shutdown)
	op.Events = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "mizar-broker-fulfillment"})
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := op.Run(runCtx, 2); err != nil {
			t.Errorf("operator: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })

	in, err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, name, c.Name, "small", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = shared.Client.BrokerV1alpha1().ServiceInstances(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	waitOrder(t, ns, name, "failed", func(in *v1.ServiceInstance) bool { return in.Status.Phase == v1.PhaseFailed })

	got := map[string]int{}
	var messages []string
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := events.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",involvedObject.kind=ServiceInstance"})
		if err != nil {
			return false, err
		}
		got, messages = map[string]int{}, nil
		for _, e := range l.Items {
			if e.InvolvedObject.UID == in.UID && e.Type == corev1.EventTypeWarning {
				got[e.Reason] += int(e.Count)
				messages = append(messages, e.Reason+": "+e.Message)
			}
		}
		return got[fulfillment.ReasonStepRetrying] >= 2 && got[fulfillment.ReasonStepFailed] >= 1, nil
	}); err != nil {
		t.Fatalf("Events on the order: %v (%v): %q", got, err, messages)
	}
	for _, m := range messages {
		if strings.HasPrefix(m, fulfillment.ReasonStepFailed) && !strings.Contains(m, "no-more-"+name) {
			t.Errorf("the StepFailed Event does not name the cause: %q", m)
		}
		if strings.HasPrefix(m, fulfillment.ReasonStepRetrying) && !strings.Contains(m, "etcd leader changed") {
			t.Errorf("the StepRetrying Event does not name the cause: %q", m)
		}
	}
	if l := logs.Lines(`"Saga step failed, retrying"`, name, "etcd leader changed"); len(l) != 2 {
		t.Errorf("want 2 retry lines, got %q", l)
	}
	if l := logs.Lines(`"Saga step failed; undoing the order"`, name, "no-more-"+name); len(l) != 1 {
		t.Errorf("want 1 failure line, got %q", l)
	}
	if d := counter(t, "mizar_saga_steps_total", map[string]string{"step": fulfillment.StepStatefulSet, "outcome": saga.OutcomeRetrying}) - retried; d != 2 {
		t.Errorf("mizar_saga_steps_total{outcome=retrying} grew by %v, want 2", d)
	}
	if d := counter(t, "mizar_saga_steps_total", map[string]string{"step": fulfillment.StepStatefulSet, "outcome": saga.OutcomeFailed}) - failed; d != 1 {
		t.Errorf("mizar_saga_steps_total{outcome=failed} grew by %v, want 1", d)
	}

	// What an operator types.
	bins, err := cluster.Binaries("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bins["kubectl"], "--kubeconfig", wc.AdminKubeconfig, "get", "events", "-n", ns,
		"--field-selector", "involvedObject.name="+name).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get events: %v\n%s", err, out)
	}
	for _, want := range []string{fulfillment.ReasonStepRetrying, fulfillment.ReasonStepFailed, "serviceinstance/" + name} {
		if !strings.Contains(strings.ToLower(string(out)), strings.ToLower(want)) {
			t.Errorf("kubectl get events lacks %q:\n%s", want, out)
		}
	}
}

// Every OSB request is counted by operation and status, refusals included.
func TestOSBRequestsCounted(t *testing.T) {
	f := newOSB(t)
	before := func(op, code string) float64 {
		return counter(t, "mizar_osb_requests_total", map[string]string{"operation": op, "code": code})
	}
	catalog, unauth, provision := before("catalog", "200"), before("catalog", "412"), before("provision", "202")
	f.expect(f.do("GET", "/v2/catalog", nil, nil), 200, "catalog")
	f.expect(f.do("GET", "/v2/catalog", nil, map[string]string{"X-Broker-API-Version": ""}), 412, "catalog without a version")
	id := "5b2c" + strings.ToLower(utilrand.String(8))
	f.expect(f.do("PUT", "/v2/service_instances/"+id+"?accepts_incomplete=true", f.provisionBody(f.smallID, nil), nil), 202, "provision")
	for _, c := range []struct {
		op, code string
		was      float64
	}{{"catalog", "200", catalog}, {"catalog", "412", unauth}, {"provision", "202", provision}} {
		if d := before(c.op, c.code) - c.was; d != 1 {
			t.Errorf("mizar_osb_requests_total{operation=%s,code=%s} grew by %v, want 1", c.op, c.code, d)
		}
	}
}
