package e2ecluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
)

// replicas is the size of the test Deployment, spread over every node.
const replicas = 30

// The netexec ports the test pods serve (HTTP over TCP, and UDP).
const (
	httpPort = 8080
	udpPort  = 8081
)

// TestCluster runs the checks in order on one cluster: each later step needs
// the pods of the first, and uninstalling mizar comes last. A step that fails
// says what failed and why; the steps after it still run when they can.
func TestCluster(t *testing.T) {
	e := clusterEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	ns := "e2e-" + rand.String(5)
	t.Logf("network: %s; namespace %s", e.cni, ns)

	t.Run("NodesReadyAfterAgent", func(t *testing.T) {
		e.requireMizar(t)
		e.checkNodesReadyAfterAgent(ctx, t)
	})

	w := &workload{e: e, ns: ns}
	deployed := t.Run("Deployment", func(t *testing.T) { w.deploy(ctx, t) })
	t.Cleanup(func() { w.cleanup() })
	if !deployed {
		t.Fatal("the test Deployment never became available; the checks below need its pods")
	}
	t.Run("Addresses", func(t *testing.T) { w.checkAddresses(ctx, t) })
	t.Run("PodToPod", func(t *testing.T) { w.checkPairs(ctx, t) })
	t.Run("Probes", func(t *testing.T) { w.checkProbes(ctx, t) })
	t.Run("ServicesAndDNS", func(t *testing.T) { w.checkServices(ctx, t) })
	t.Run("NodePortFromHost", func(t *testing.T) { w.checkNodePort(ctx, t) })
	t.Run("HostPort", func(t *testing.T) { w.checkHostPort(ctx, t) })
	t.Run("EgressToHost", func(t *testing.T) { w.checkEgress(ctx, t) })
	t.Run("NodesToPods", func(t *testing.T) { w.checkNodesToPods(ctx, t) })
	t.Run("SecondVPCIsolated", func(t *testing.T) {
		e.requireMizar(t)
		w.checkSecondVPCIsolated(ctx, t)
	})
	t.Run("ServicesKubeProxyNftables", func(t *testing.T) { w.checkServicesNftables(ctx, t) })
	t.Run("BrokerMariaDBThroughOSB", func(t *testing.T) {
		e.requireMizar(t)
		w.checkBroker(ctx, t)
	})
	t.Run("WaitReadyMizarKinds", func(t *testing.T) {
		e.requireMizar(t)
		e.checkWaitReady(ctx, t)
	})
	t.Run("HelmUpgradeUnderLoad", func(t *testing.T) {
		e.requireMizar(t)
		w.checkUpgradeUnderLoad(ctx, t)
	})
	// While the test's pods still run on every node (DeleteNamespaces removes them).
	t.Run("MizarctlOnKind", func(t *testing.T) {
		e.requireMizar(t)
		w.checkMizarctl(ctx, t)
	})
	t.Run("DeleteNamespaces", func(t *testing.T) { w.checkDeleteNamespaces(ctx, t) })
	t.Run("HelmUninstallLeavesNoNodeState", func(t *testing.T) {
		e.requireMizar(t)
		e.checkUninstall(ctx, t)
	})
}

// requireMizar skips a mizar-only check when the cluster runs the reference
// network: a deliberate choice of the run, not a missing prerequisite.
func (e *env) requireMizar(t *testing.T) {
	t.Helper()
	if e.cni != "mizar" {
		t.Skipf("MIZAR_KIND_CNI=%s: this check is about mizar", e.cni)
	}
}

// checkNodesReadyAfterAgent: a node may turn Ready (its CNI configured) only
// once the mizar agent on it is Ready; otherwise pods are scheduled onto a
// node whose network cannot serve them yet.
func (e *env) checkNodesReadyAfterAgent(ctx context.Context, t *testing.T) {
	nodes, err := e.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agents, err := e.cs.CoreV1().Pods("mizar-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=mizar-agent"})
	if err != nil {
		t.Fatal(err)
	}
	byNode := map[string]*corev1.Pod{}
	for i := range agents.Items {
		byNode[agents.Items[i].Spec.NodeName] = &agents.Items[i]
	}
	for _, n := range nodes.Items {
		nodeReady := condition(n.Status.Conditions, corev1.NodeReady)
		if nodeReady == nil || nodeReady.Status != corev1.ConditionTrue {
			t.Errorf("node %s is not Ready: %s", n.Name, describeCondition(nodeReady))
			continue
		}
		agent := byNode[n.Name]
		if agent == nil {
			t.Errorf("node %s is Ready but runs no mizar agent pod (DaemonSet mizar-system/*-agent)", n.Name)
			continue
		}
		agentReady := podCondition(agent, corev1.PodReady)
		if agentReady == nil || agentReady.Status != corev1.ConditionTrue {
			t.Errorf("node %s is Ready while its mizar agent %s is not (%s): the node's network was declared ready before the agent", n.Name, agent.Name, describePodCondition(agentReady))
			continue
		}
		// One second of slack: both times are rounded to the second.
		if nodeReady.LastTransitionTime.Add(time.Second).Before(agentReady.LastTransitionTime.Time) {
			t.Errorf("node %s turned Ready at %s, before its mizar agent %s did (%s)", n.Name,
				nodeReady.LastTransitionTime.Format(time.RFC3339), agent.Name, agentReady.LastTransitionTime.Format(time.RFC3339))
		}
	}
}

// workload is the test Deployment and its Services.
type workload struct {
	e    *env
	ns   string
	pods []corev1.Pod
}

func (w *workload) deploy(ctx context.Context, t *testing.T) {
	cs := w.e.cs
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "mesh"}
	probe := func(path string, period int32) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(httpPort)}},
			PeriodSeconds: period, TimeoutSeconds: 2, FailureThreshold: 3}
	}
	n := int32(replicas)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "mesh"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &n,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					// Every node, the control plane too.
					Tolerations: []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}},
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
						MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.DoNotSchedule,
						LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
					}},
					TerminationGracePeriodSeconds: ptr(int64(1)),
					Containers: []corev1.Container{{
						Name: "netexec", Image: w.e.image, ImagePullPolicy: corev1.PullNever,
						Args: []string{"netexec", "--http-port=" + strconv.Itoa(httpPort), "--udp-port=" + strconv.Itoa(udpPort)},
						Ports: []corev1.ContainerPort{
							{Name: "http", ContainerPort: httpPort, Protocol: corev1.ProtocolTCP},
							{Name: "udp", ContainerPort: udpPort, Protocol: corev1.ProtocolUDP},
						},
						ReadinessProbe: probe("/readyz", 2),
						LivenessProbe:  probe("/healthz", 3),
					}},
				},
			},
		},
	}
	if _, err := cs.AppsV1().Deployments(w.ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svcs := []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Name: "mesh"}, Spec: corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(httpPort), Protocol: corev1.ProtocolTCP},
			{Name: "udp", Port: 81, TargetPort: intstr.FromInt32(udpPort), Protocol: corev1.ProtocolUDP},
		}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "mesh-headless"}, Spec: corev1.ServiceSpec{Selector: labels, ClusterIP: corev1.ClusterIPNone,
			Ports: []corev1.ServicePort{{Name: "http", Port: httpPort, Protocol: corev1.ProtocolTCP}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "mesh-nodeport"}, Spec: corev1.ServiceSpec{Selector: labels, Type: corev1.ServiceTypeNodePort,
			Ports: []corev1.ServicePort{{Name: "http", Port: httpPort, Protocol: corev1.ProtocolTCP}}}},
	}
	for _, s := range svcs {
		if _, err := cs.CoreV1().Services(w.ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 6*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := cs.AppsV1().Deployments(w.ns).Get(ctx, "mesh", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return d.Status.ReadyReplicas == replicas, nil
	})
	if err != nil {
		t.Fatalf("the Deployment of %d pods is not Ready after %s: %s", replicas, time.Since(start).Round(time.Second), w.whyNotReady(ctx))
	}
	t.Logf("%d pods Ready in %s", replicas, time.Since(start).Round(time.Second))
	pods, err := cs.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{LabelSelector: "app=mesh"})
	if err != nil {
		t.Fatal(err)
	}
	w.pods = pods.Items
}

// whyNotReady names what keeps the test pods from being Ready: pod phases and
// the warning events (sandbox and CNI failures show up there).
func (w *workload) whyNotReady(ctx context.Context) string {
	var b strings.Builder
	pods, err := w.e.cs.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{})
	if err == nil {
		phases := map[string]int{}
		for _, p := range pods.Items {
			k := string(p.Status.Phase)
			if c := podCondition(&p, corev1.PodReady); c != nil && c.Status == corev1.ConditionTrue {
				k += "/Ready"
			}
			phases[k]++
		}
		fmt.Fprintf(&b, "pods by phase %v; ", phases)
	}
	events, err := w.e.cs.CoreV1().Events(w.ns).List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	if err == nil {
		seen := map[string]int{}
		for _, ev := range events.Items {
			seen[ev.Reason+": "+ev.Message] += int(max(ev.Count, 1))
		}
		msgs := make([]string, 0, len(seen))
		for m, c := range seen {
			msgs = append(msgs, fmt.Sprintf("[%dx] %s", c, m))
		}
		sort.Strings(msgs)
		if len(msgs) > 8 {
			msgs = msgs[:8]
		}
		fmt.Fprintf(&b, "warning events: %s", strings.Join(msgs, "; "))
	}
	return b.String()
}

func (w *workload) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_ = w.e.cs.CoreV1().Namespaces().Delete(ctx, w.ns, metav1.DeleteOptions{})
}

// checkAddresses: pods on every node, each with its own address, from the
// network's ranges (mizar's Subnets, or the cluster's pod CIDR).
func (w *workload) checkAddresses(ctx context.Context, t *testing.T) {
	nodes, err := w.e.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	perNode := map[string]int{}
	for _, n := range nodes.Items {
		perNode[n.Name] = 0
	}
	var ranges []netip.Prefix
	if w.e.cni == "mizar" {
		out, err := w.e.kubectlRun(ctx, "get", "subnets.networking.mizar.dev", "-o", "jsonpath={.items[*].spec.cidr}")
		if err != nil {
			t.Fatalf("listing mizar's Subnets: %v", err)
		}
		for _, f := range strings.Fields(out) {
			p, err := netip.ParsePrefix(f)
			if err != nil {
				t.Fatalf("Subnet CIDR %q: %v", f, err)
			}
			ranges = append(ranges, p)
		}
		if len(ranges) == 0 {
			t.Fatal("mizar has no Subnet: pods cannot be on mizar addresses (the chart creates no default VPC/subnet)")
		}
	} else {
		ranges = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	}
	seen := map[string]string{}
	for _, p := range w.pods {
		perNode[p.Spec.NodeName]++
		a, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil {
			t.Errorf("pod %s has no valid IP (%q)", p.Name, p.Status.PodIP)
			continue
		}
		if other, dup := seen[p.Status.PodIP]; dup {
			t.Errorf("pods %s and %s share %s", p.Name, other, a)
		}
		seen[p.Status.PodIP] = p.Name
		in := false
		for _, r := range ranges {
			in = in || r.Contains(a)
		}
		if !in {
			t.Errorf("pod %s has %s, outside the network's ranges %v", p.Name, a, ranges)
		}
	}
	for n, c := range perNode {
		if c == 0 {
			t.Errorf("no test pod on node %s (pods per node: %v)", n, perNode)
		}
	}
	t.Logf("pods per node %v, ranges %v", perNode, ranges)
}

// dialResult is netexec's /dial answer.
type dialResult struct {
	Responses []string `json:"responses"`
	Errors    []string `json:"errors"`
}

// checkPairs: every pod reaches every other pod, over TCP (HTTP) and UDP.
// Each source pod's netexec dials the others (/dial); kubectl exec reaches
// the source through kubelet, so only the pod-to-pod path is under test.
func (w *workload) checkPairs(ctx context.Context, t *testing.T) {
	type failure struct{ from, to, proto, why string }
	var (
		mu       sync.Mutex
		failures []failure
		ok       int
		wg       sync.WaitGroup
	)
	start := time.Now()
	sem := make(chan struct{}, 10)
	for _, src := range w.pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			// One shell loop per source: a line per (target, protocol).
			var script strings.Builder
			for _, dst := range w.pods {
				if dst.Name == src.Name {
					continue
				}
				for _, pr := range []struct {
					proto string
					port  int
				}{{"http", httpPort}, {"udp", udpPort}} {
					fmt.Fprintf(&script, "echo \"%s %s $(timeout 9 wget -q -O - 'http://127.0.0.1:%d/dial?request=hostname&protocol=%s&host=%s&port=%d&tries=1')\"\n",
						dst.Name, pr.proto, httpPort, pr.proto, dst.Status.PodIP, pr.port)
				}
			}
			cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
			defer cancel()
			// The answers go to a file in the pod first: a short exec stream
			// (a line lost by the stream, not by the network) is told from a
			// lost answer by reading the file again.
			file := "/tmp/pairs-" + rand.String(6)
			expect := (len(w.pods) - 1) * 2
			out, err := w.e.exec(cctx, w.ns, src.Name, "sh", "-c", "{\n"+script.String()+"} >"+file+"; cat "+file)
			if err == nil && len(strings.Split(strings.TrimSpace(out), "\n")) != expect {
				t.Logf("%s: the exec stream brought %d of %d lines; reading %s again", src.Name, len(strings.Split(strings.TrimSpace(out), "\n")), expect, file)
				out, err = w.e.exec(cctx, w.ns, src.Name, "cat", file)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, failure{src.Name, "*", "*", err.Error()})
				return
			}
			answered := map[string]bool{}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				f := strings.SplitN(line, " ", 3)
				if len(f) < 3 {
					failures = append(failures, failure{src.Name, "?", "?", "unparsable line " + line})
					continue
				}
				answered[f[0]+" "+f[1]] = true
				var r dialResult
				if err := json.Unmarshal([]byte(f[2]), &r); err != nil || len(r.Responses) != 1 || r.Responses[0] != f[0] {
					why := strings.TrimSpace(f[2])
					if why == "" {
						why = "no answer from the source pod's own netexec within 9 s"
					}
					failures = append(failures, failure{src.Name, f[0], f[1], why})
					continue
				}
				ok++
			}
			for _, dst := range w.pods {
				for _, proto := range []string{"http", "udp"} {
					if dst.Name != src.Name && !answered[dst.Name+" "+proto] {
						failures = append(failures, failure{src.Name, dst.Name, proto, "no line for this pair in the pod's answers"})
					}
				}
			}
		}()
	}
	wg.Wait()
	want := len(w.pods) * (len(w.pods) - 1) * 2
	t.Logf("%d of %d pod pairs x {TCP, UDP} answered in %s", ok, want, time.Since(start).Round(time.Second))
	if len(failures) > 0 || ok != want {
		sort.Slice(failures, func(i, j int) bool { return failures[i].from+failures[i].to < failures[j].from+failures[j].to })
		for i, f := range failures {
			if i == 10 {
				t.Errorf("... %d failures in all", len(failures))
				break
			}
			t.Errorf("%s -> %s over %s: %s", f.from, f.to, f.proto, f.why)
		}
		if ok != want && len(failures) == 0 {
			t.Errorf("%d pairs answered, want %d", ok, want)
		}
	}
}

// checkProbes: kubelet's readiness and liveness probes (HTTP from the node to
// each pod) keep passing: every pod Ready, none restarted.
func (w *workload) checkProbes(ctx context.Context, t *testing.T) {
	// Long enough for several liveness periods (3 s, failure threshold 3).
	time.Sleep(12 * time.Second)
	pods, err := w.e.cs.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{LabelSelector: "app=mesh"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if c := podCondition(&p, corev1.PodReady); c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("pod %s on %s is not Ready (readiness probe failing): %s", p.Name, p.Spec.NodeName, describePodCondition(c))
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount > 0 {
				t.Errorf("pod %s on %s restarted %d times (liveness probe failing?)", p.Name, p.Spec.NodeName, cs.RestartCount)
			}
		}
	}
}

// checkServices: a ClusterIP Service by name (TCP and UDP, several backends),
// a headless Service's DNS name listing every pod, and the API's Service.
// Names are resolved by agnhost (Go's resolver, with the pod's search path).
func (w *workload) checkServices(ctx context.Context, t *testing.T) {
	src := w.pods[0].Name
	dial := func(proto, host string, port, tries int) (dialResult, error) {
		var r dialResult
		out, err := w.e.exec(ctx, w.ns, src, wgetCmd(
			fmt.Sprintf("http://127.0.0.1:%d/dial?request=hostname&protocol=%s&host=%s&port=%d&tries=%d", httpPort, proto, host, port, tries), 60)...)
		if err != nil {
			return r, err
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			return r, fmt.Errorf("netexec answered %q: %w", out, err)
		}
		return r, nil
	}
	for _, pr := range []struct {
		proto string
		port  int
	}{{"http", 80}, {"udp", 81}} {
		r, err := dial(pr.proto, "mesh", pr.port, 20)
		backends := map[string]bool{}
		for _, b := range r.Responses {
			backends[b] = true
		}
		switch {
		case err != nil:
			t.Errorf("pod %s -> Service mesh:%d (%s, by its short DNS name): %v", src, pr.port, pr.proto, err)
		case len(r.Responses) != 20:
			t.Errorf("pod %s -> Service mesh:%d (%s): %d of 20 requests answered; errors %v%s", src, pr.port, pr.proto, len(r.Responses), r.Errors, w.dnsHint(ctx))
		case len(backends) < 2:
			t.Errorf("pod %s -> Service mesh:%d (%s): 20 requests all reached %v: kube-proxy does not balance", src, pr.port, pr.proto, backends)
		default:
			t.Logf("Service mesh:%d (%s): 20 answers from %d pods", pr.port, pr.proto, len(backends))
		}
	}

	// The headless Service's name lists the pods (busybox's nslookup asks the
	// pod's nameserver directly; its own "Address: <server>:53" line is not a
	// record). busybox sends no EDNS0 and does not retry a truncated answer
	// over TCP, so it sees what one 512-byte UDP answer holds: the header,
	// the question, and 16 bytes per A record (the name compressed).
	name := "mesh-headless." + w.ns + ".svc.cluster.local"
	fits := (512 - 12 - (len(name) + 2 + 4)) / 16
	out, err := w.e.exec(ctx, w.ns, src, "nslookup", name)
	if err != nil {
		t.Errorf("headless Service DNS name from pod %s: %v%s", src, err, w.dnsHint(ctx))
	} else {
		podIPs := map[string]bool{}
		for _, p := range w.pods {
			podIPs[p.Status.PodIP] = true
		}
		got := map[string]bool{}
		var foreign []string
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && f[0] == "Address:" && !strings.Contains(f[1], "#") && !strings.HasSuffix(f[1], ":53") {
				got[f[1]] = true
				if !podIPs[f[1]] {
					foreign = append(foreign, f[1])
				}
			}
		}
		want := min(len(w.pods), fits)
		if len(foreign) > 0 || len(got) < want {
			t.Errorf("headless Service %s resolves to %d addresses, want %d of the %d pods' (%d fit one UDP answer); not a test pod's: %v\n%s",
				name, len(got), want, len(w.pods), fits, foreign, out)
		} else {
			t.Logf("headless Service %s: %d records, all test pods' (%d pods, %d fit one UDP answer)", name, len(got), len(w.pods), fits)
		}
	}
	// The API server's Service, which every in-cluster client uses.
	if out, err := w.e.exec(ctx, w.ns, src, "/agnhost", "connect", "--timeout=5s", "kubernetes.default.svc.cluster.local:443"); err != nil {
		t.Errorf("pod %s -> kubernetes.default:443 (TCP): %v %s", src, err, out)
	}
}

// dnsHint says whether CoreDNS is running, for a failed name lookup.
func (w *workload) dnsHint(ctx context.Context) string {
	pods, err := w.e.cs.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
	if err != nil {
		return ""
	}
	var s []string
	for _, p := range pods.Items {
		c := podCondition(&p, corev1.PodReady)
		s = append(s, fmt.Sprintf("%s %s ready=%s ip=%s", p.Name, p.Status.Phase, describePodCondition(c), p.Status.PodIP))
	}
	return fmt.Sprintf(" (CoreDNS: %s)", strings.Join(s, "; "))
}

// checkNodePort: the NodePort Service answers on every node's address from
// this process, which runs outside the cluster (the host, on kind's network).
func (w *workload) checkNodePort(ctx context.Context, t *testing.T) {
	svc, err := w.e.cs.CoreV1().Services(w.ns).Get(ctx, "mesh-nodeport", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	port := svc.Spec.Ports[0].NodePort
	nodes, err := w.e.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	for _, n := range nodes.Items {
		ip := nodeIP(&n)
		url := fmt.Sprintf("http://%s/hostname", net.JoinHostPort(ip, strconv.Itoa(int(port))))
		got := map[string]bool{}
		for i := 0; i < 5; i++ {
			resp, err := client.Get(url)
			if err != nil {
				t.Errorf("NodePort %s on node %s from the host: %v", url, n.Name, err)
				break
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(b), "mesh-") {
				t.Errorf("NodePort %s on node %s: %d %q, want a test pod's name", url, n.Name, resp.StatusCode, b)
				break
			}
			got[string(b)] = true
		}
		t.Logf("NodePort on %s (%s) reached %d pods", n.Name, ip, len(got))
	}
	// From pods, to every node's NodePort: most connections are DNATed
	// to a pod of a third node, the node forwarding what arrived
	// encapsulated out again (the Services conformance specs do this).
	for _, p := range w.podPerNode() {
		var script strings.Builder
		for _, n := range nodes.Items {
			addr := net.JoinHostPort(nodeIP(&n), strconv.Itoa(int(port)))
			fmt.Fprintf(&script, "for i in 1 2 3 4 5 6; do /agnhost connect --timeout=5s %s >/dev/null 2>&1 && echo %s ok || echo %s FAILED; done\n", addr, n.Name, n.Name)
		}
		out, err := w.e.exec(ctx, w.ns, p.Name, "sh", "-c", script.String())
		if err != nil {
			t.Errorf("NodePort from pod %s: %v\n%s", p.Name, err, out)
			continue
		}
		if strings.Contains(out, "FAILED") {
			t.Errorf("NodePort from pod %s (node %s), 6 connections to each node:\n%s", p.Name, p.Spec.NodeName, out)
		}
	}
}

// checkEgress: pods reach a server on the host, outside the cluster, at its
// address on kind's network (the podman bridge's gateway).
func (w *workload) checkEgress(ctx context.Context, t *testing.T) {
	out, err := w.e.run(ctx, "podman", "network", "inspect", "kind", "--format", "{{range .Subnets}}{{.Gateway}} {{end}}")
	if err != nil {
		t.Fatal(err)
	}
	var gw string
	for _, f := range strings.Fields(out) {
		if a, err := netip.ParseAddr(f); err == nil && a.Is4() {
			gw = f
		}
	}
	if gw == "" {
		t.Fatalf("kind's podman network has no IPv4 gateway: %q", out)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(gw, "0"))
	if err != nil {
		t.Fatal(err)
	}
	token := "host-" + rand.String(8)
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { io.WriteString(rw, token) }),
		ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/"
	byNode := map[string]bool{}
	for _, p := range w.pods {
		if byNode[p.Spec.NodeName] {
			continue
		}
		byNode[p.Spec.NodeName] = true
		out, err := w.e.exec(ctx, w.ns, p.Name, wgetCmd(url, 10)...)
		if err != nil || strings.TrimSpace(out) != token {
			t.Errorf("pod %s on %s -> the host at %s: %v %q", p.Name, p.Spec.NodeName, url, err, out)
		}
	}
}

// checkWaitReady: `kubectl wait --for=condition=Ready` returns for every
// object of every mizar kind.
func (e *env) checkWaitReady(ctx context.Context, t *testing.T) {
	out, err := e.kubectlRun(ctx, "api-resources", "--api-group=networking.mizar.dev", "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	kinds := strings.Fields(out)
	if len(kinds) == 0 {
		t.Fatal("the API serves no networking.mizar.dev kind")
	}
	for _, k := range kinds {
		list, err := e.kubectlRun(ctx, "get", k, "-A", "-o", "name")
		if err != nil {
			t.Errorf("kubectl get %s: %v", k, err)
			continue
		}
		if strings.TrimSpace(list) == "" {
			t.Logf("%s: none to wait for", k)
			continue
		}
		if err := e.waitAllReady(ctx, t, k); err != nil {
			t.Errorf("kubectl wait --for=condition=Ready %s --all -A: %v", k, err)
		}
	}
}

// waitAllReady runs `kubectl wait --all` for one kind. kubectl lists the
// objects and then waits for each, so an object deleted in between (a pod
// sandbox's Endpoint, removed by its CNI DEL) fails the wait with NotFound
// although nothing is unready: a failed wait is retried with a fresh list,
// and only a kind that fails three times running fails the check.
func (e *env) waitAllReady(ctx context.Context, t *testing.T, kind string) error {
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		_, err = e.kubectlRun(cctx, "wait", "--for=condition=Ready", kind, "--all", "-A", "--timeout=60s")
		cancel()
		if err == nil {
			return nil
		}
		t.Logf("%s: wait attempt %d: %v (retrying with a fresh list)", kind, attempt, err)
	}
	return err
}

// checkUpgradeUnderLoad: `helm upgrade` with a changed value (and then one
// with none) while one pod pings another across nodes and another sends HTTP
// requests to the ClusterIP Service: no ping lost, no request failed, and
// mizar's API answers afterwards.
func (w *workload) checkUpgradeUnderLoad(ctx context.Context, t *testing.T) {
	a, b, c := w.pods[0], w.crossNodePeer(w.pods[0]), w.pods[len(w.pods)/2]
	svc, err := w.e.cs.CoreV1().Services(w.ns).Get(ctx, "mesh", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const seconds = 90
	var wg sync.WaitGroup
	var pingOut, httpOut string
	var pingErr, httpErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		pingOut, pingErr = w.e.exec(ctx, w.ns, a.Name, "ping", "-q", "-i", "0.2", "-w", strconv.Itoa(seconds), b.Status.PodIP)
	}()
	go func() {
		defer wg.Done()
		// nc -w, not timeout(1): busybox's timeout leaves its watchdog to the
		// container's PID 1 (netexec, which reaps nothing), one zombie per
		// request, and after ~240 requests every fork failed with EAGAIN.
		// busybox-static 1.35's wget -T segfaults.
		script := fmt.Sprintf(`ok=0; fail=0; end=$(( $(date +%%s) + %d )); while [ $(date +%%s) -lt $end ]; do
  if printf 'GET /hostname HTTP/1.0\r\n\r\n' | nc -w 2 %s 80 | grep -q '^HTTP/1.[01] 200'; then ok=$((ok+1)); else fail=$((fail+1)); fi; sleep 0.1; done; echo "ok=$ok fail=$fail"`, seconds, svc.Spec.ClusterIP)
		httpOut, httpErr = w.e.exec(ctx, w.ns, c.Name, "sh", "-c", script)
	}()
	time.Sleep(5 * time.Second)
	chart := w.e.root + "/artifacts/charts/mizar"
	upgrades := [][]string{
		{"upgrade", "mizar", chart, "-n", "mizar-system", "--reuse-values", "--set", "apiserver.resources.requests.cpu=110m", "--wait", "--timeout", "60s"},
		{"upgrade", "mizar", chart, "-n", "mizar-system", "--reuse-values", "--wait", "--timeout", "60s"},
	}
	for _, args := range upgrades {
		if _, err := w.e.run(ctx, w.e.helm, args...); err != nil {
			t.Errorf("helm %s: %v", strings.Join(args, " "), err)
		}
	}
	wg.Wait()
	// ping -q: "N packets transmitted, M packets received, X% packet loss".
	if pingErr != nil || !strings.Contains(pingOut, " 0% packet loss") {
		t.Errorf("ping %s (%s) -> %s (%s) during the upgrades: %v\n%s", a.Name, a.Spec.NodeName, b.Name, b.Spec.NodeName, pingErr, lastLines(pingOut, 3))
	}
	if httpErr != nil || !strings.Contains(httpOut, "fail=0") {
		t.Errorf("HTTP to Service mesh from %s during the upgrades: %v %s", c.Name, httpErr, strings.TrimSpace(httpOut))
	}
	t.Logf("ping: %s; http: %s", strings.TrimSpace(lastLines(pingOut, 2)), strings.TrimSpace(httpOut))
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := w.e.kubectlRun(ctx, "get", "vpcs.networking.mizar.dev")
		return err == nil, nil
	})
	if err != nil {
		_, last := w.e.kubectlRun(ctx, "get", "vpcs.networking.mizar.dev")
		t.Errorf("mizar's API does not answer within 60 s of the upgrades: %v", last)
	}
}

// crossNodePeer is a test pod on another node than p.
func (w *workload) crossNodePeer(p corev1.Pod) corev1.Pod {
	for _, q := range w.pods {
		if q.Spec.NodeName != p.Spec.NodeName {
			return q
		}
	}
	return w.pods[1]
}

// checkDeleteNamespaces: `kubectl delete namespace` finishes for the test's
// namespace (its pods' mizar Endpoints live there) and for one that never
// held a mizar object; kube-controller-manager's deleter lists every
// namespaced kind, mizar's included.
func (w *workload) checkDeleteNamespaces(ctx context.Context, t *testing.T) {
	plain := w.ns + "-plain"
	if _, err := w.e.kubectlRun(ctx, "create", "namespace", plain); err != nil {
		t.Fatal(err)
	}
	if _, err := w.e.kubectlRun(ctx, "create", "configmap", "x", "-n", plain); err != nil {
		t.Fatal(err)
	}
	if w.e.cni == "mizar" {
		out, _ := w.e.kubectlRun(ctx, "get", "endpoints.networking.mizar.dev", "-n", w.ns, "-o", "name")
		t.Logf("mizar objects in %s before the delete: %d Endpoints", w.ns, len(strings.Fields(out)))
	}
	for _, ns := range []string{plain, w.ns} {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		_, err := w.e.kubectlRun(cctx, "delete", "namespace", ns, "--timeout=150s")
		cancel()
		if err != nil {
			cond, _ := w.e.kubectlRun(ctx, "get", "namespace", ns, "-o", "jsonpath={range .status.conditions[*]}{.type}={.status}: {.message}{\"\\n\"}{end}")
			t.Errorf("kubectl delete namespace %s did not finish in 150 s: %v\nnamespace conditions:\n%s", ns, err, cond)
			continue
		}
		t.Logf("namespace %s deleted in %s", ns, time.Since(start).Round(time.Second))
	}
}

// checkUninstall: `helm uninstall` leaves nothing of mizar on the nodes: no
// conflist, no plugin, no pinned BPF object, no mizar link.
func (e *env) checkUninstall(ctx context.Context, t *testing.T) {
	if _, err := e.run(ctx, e.helm, "uninstall", "mizar", "-n", "mizar-system", "--wait", "--timeout", "120s"); err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	// The DaemonSet's pods clean up as they stop.
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := e.cs.CoreV1().Pods("mizar-system").List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		t.Errorf("mizar's pods are still there 90 s after helm uninstall")
	}
	nodes, err := e.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		out, err := e.node(ctx, n.Name, "sh", "-c",
			`ls /etc/cni/net.d/ | grep -i mizar; ls /opt/cni/bin | grep -i mizar; find /sys/fs/bpf -mindepth 1 -maxdepth 2 | grep -i mizar; ip -o link | grep -i mizar; true`)
		if err != nil {
			t.Errorf("inspecting node %s: %v", n.Name, err)
			continue
		}
		if s := strings.TrimSpace(out); s != "" {
			t.Errorf("node %s keeps mizar state after helm uninstall:\n%s", n.Name, s)
		}
	}
}

func condition(cs []corev1.NodeCondition, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}

func podCondition(p *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func describeCondition(c *corev1.NodeCondition) string {
	if c == nil {
		return "no condition"
	}
	return fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
}

func describePodCondition(c *corev1.PodCondition) string {
	if c == nil {
		return "no condition"
	}
	return fmt.Sprintf("%s %s %s", c.Status, c.Reason, c.Message)
}

func nodeIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

func ptr[T any](v T) *T { return &v }
