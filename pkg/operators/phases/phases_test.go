package phases_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/nodeagent"
	"mizar.dev/pkg/operators/endpoint"
	"mizar.dev/pkg/operators/phases"
	"mizar.dev/test/cluster"
	"mizar.dev/test/logtest"
	"mizar.dev/test/workloadcluster"
)

// scrape returns the server's /metrics samples: "name{labels}" -> value.
func scrape(ctx context.Context, t *testing.T, s *apiservertest.Server) map[string]float64 {
	t.Helper()
	raw, err := s.Client.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("scraping /metrics: %v", err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// One droplet's agent runs, another's never does: the running one's Droplet
// turns Provisioned (a log line with its Init -> Provisioned time, counted in
// the histogram), the silent one gets AgentNotAcknowledging, and an endpoint
// placed on it gets WaitingForAgent naming it. The Events are posted to a
// real kube-apiserver, where kubectl lists them; workqueue and reconcile
// metrics are on mizar-apiserver's /metrics.
func TestStuckObjectsGetEventsAndTransitionsAreLogged(t *testing.T) {
	logs := logtest.Capture(t, 2)
	wc := workloadcluster.StartAPIServer(t)
	kube, err := kubernetes.NewForConfig(wc.Admin)
	if err != nil {
		t.Fatal(err)
	}
	s := apiservertest.Start(t, t.TempDir(), "--operators=true", "--events-kubeconfig", wc.AdminKubeconfig, "--stuck-after", "1s")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var b [3]byte
	_, _ = rand.Read(b[:])
	sfx := hex.EncodeToString(b[:])
	live, ghost := "live-"+sfx, "ghost-"+sfx

	agent, err := nodeagent.New(nodeagent.Options{Client: s.Client, Dataplane: nodeagent.NewRecorder(), Droplet: &v1alpha1.Droplet{
		ObjectMeta: metav1.ObjectMeta{Name: live}, Spec: v1alpha1.DropletSpec{Node: live, IP: "198.18.20.1", MAC: "02:00:00:20:00:01", Interface: "eth0"}}})
	if err != nil {
		t.Fatal(err)
	}
	agentCtx, stopAgent := context.WithCancel(ctx)
	agentDone := make(chan error, 1)
	go func() { agentDone <- agent.Run(agentCtx) }()
	defer func() {
		stopAgent()
		if err := <-agentDone; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	}()
	api := s.Client.NetworkingV1alpha1()
	if _, err := api.Droplets().Create(ctx, &v1alpha1.Droplet{ObjectMeta: metav1.ObjectMeta{Name: ghost},
		Spec: v1alpha1.DropletSpec{Node: ghost, IP: "198.18.20.2", MAC: "02:00:00:20:00:02", Interface: "eth0"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vpc, subnet := "vpc-"+sfx, "sn-"+sfx
	if _, err := api.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: vpc}, Spec: v1alpha1.VpcSpec{CIDR: "10.88.0.0/16"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: subnet}, Spec: v1alpha1.SubnetSpec{VPC: vpc, CIDR: "10.88.1.0/24"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ep, err := api.Endpoints("default").Create(ctx, &v1alpha1.Endpoint{ObjectMeta: metav1.ObjectMeta{Name: "stuck-" + sfx},
		Spec: v1alpha1.EndpointSpec{Subnet: subnet, Droplet: ghost, MAC: "02:00:00:20:01:01"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	find := func(kind, name, reason string) *corev1.Event {
		var found *corev1.Event
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			l, err := kube.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=" + kind + ",involvedObject.name=" + name + ",reason=" + reason})
			if err != nil || len(l.Items) == 0 {
				return false, nil
			}
			found = &l.Items[0]
			return true, nil
		}); err != nil {
			t.Fatalf("no %s Event on %s %s: %v", reason, kind, name, err)
		}
		return found
	}
	if e := find("Droplet", ghost, phases.ReasonAgentNotAcknowledging); e.Type != corev1.EventTypeWarning || !strings.Contains(e.Message, "droplet "+ghost) {
		t.Errorf("AgentNotAcknowledging: %s %q", e.Type, e.Message)
	}
	if e := find("Endpoint", ep.Name, endpoint.ReasonWaitingForAgent); e.InvolvedObject.UID != ep.UID || !strings.Contains(e.Message, "droplet "+ghost+" (its host)") {
		t.Errorf("WaitingForAgent on %+v: %q", e.InvolvedObject, e.Message)
	}
	if l := logs.Lines(`"Agent not acknowledging"`, `"kind"="Droplet"`, ghost); len(l) == 0 {
		t.Error("no log line for the droplet whose agent is silent")
	}
	if l := logs.Lines(`"Endpoint waiting for agents"`, "stuck-"+sfx, "droplet/"+ghost); len(l) == 0 {
		t.Error("no log line for the endpoint waiting for its agent")
	}
	if l := logs.Lines(`"Phase changed"`, `"kind"="Droplet"`, live, `"to"="Provisioned"`, `"initToProvisioned"=`); len(l) != 1 {
		t.Errorf("want one phase line for the live droplet, got %q", l)
	}

	m := scrape(ctx, t, s)
	for _, series := range []string{
		`mizar_provision_duration_seconds_count{kind="Droplet"}`,
		`mizar_phase_transitions_total{kind="Droplet",phase="Provisioned"}`,
		`workqueue_adds_total{name="endpoint-operator"}`,
		`mizar_operator_reconcile_duration_seconds_count{operator="endpoint-operator",result="success"}`,
	} {
		if m[series] < 1 {
			t.Errorf("%s = %v, want >= 1", series, m[series])
		}
	}
	if _, ok := m[`workqueue_depth{name="endpoint-operator"}`]; !ok {
		t.Error("workqueue_depth of the endpoint operator is not served")
	}

	bins, err := cluster.Binaries("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bins["kubectl"], "--kubeconfig", wc.AdminKubeconfig, "get", "events", "-A").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get events: %v\n%s", err, out)
	}
	for _, want := range []string{"droplet/" + ghost, "endpoint/stuck-" + sfx, phases.ReasonAgentNotAcknowledging, endpoint.ReasonWaitingForAgent} {
		if !strings.Contains(string(out), want) {
			t.Errorf("kubectl get events lacks %q:\n%s", want, out)
		}
	}
}
