package e2ecluster

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"mizar.dev/pkg/dataplane"
)

// clusterFigures is what BenchmarkCluster measures of one network.
type clusterFigures struct {
	startupP50, startupP99 time.Duration // pod creation seen -> Ready seen, 100 pods of one Deployment
	gbps                   float64       // cross-node TCP, one stream
	rtt                    time.Duration // cross-node ping, average
}

// BenchmarkCluster (make bench-cluster) measures, in one run, a fresh
// cluster with the reference network (bridge + host-local, a route per
// node's pod CIDR: what kind's kindnet does), then one with mizar, and
// reports mizar's figures as ratios to the reference's: pod startup p50/p99
// of a 100-pod Deployment, cross-node TCP throughput and ping RTT. One
// iteration: each is a whole cluster (-benchtime 1x).
func BenchmarkCluster(b *testing.B) {
	if os.Getenv("MIZAR_E2E_CLUSTER") != "1" {
		b.Skip("the kind cluster benchmark runs with MIZAR_E2E_CLUSTER=1 (make bench-cluster)")
	}
	figures := map[string]clusterFigures{}
	for _, cni := range []string{"reference", "mizar"} {
		if err := down(); err != nil {
			b.Fatal(err)
		}
		e, err := setup(cni)
		upRan = true
		if err != nil {
			b.Fatalf("%s cluster: %v", cni, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		f, err := e.measure(ctx, b)
		cancel()
		if err != nil {
			b.Fatalf("%s: %v", cni, err)
		}
		b.Logf("%s: pod startup p50 %s p99 %s (100 pods); cross-node TCP %.2f Gbit/s; RTT %s", cni,
			f.startupP50.Round(time.Millisecond), f.startupP99.Round(time.Millisecond), f.gbps, f.rtt.Round(time.Microsecond))
		figures[cni] = f
		if cni == "reference" {
			// The floor for an overlay whose underlay program must see
			// whole frames: the reference with its nodes' veths in wire
			// mode (what mizar's agent sets on a veth underlay), so that
			// both carry MTU-sized frames between nodes, as on a NIC.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			w, err := e.measureWire(ctx)
			cancel()
			if err != nil {
				b.Fatalf("reference in wire mode: %v", err)
			}
			b.Logf("reference, node veths in wire mode: cross-node TCP %.2f Gbit/s; RTT %s", w.gbps, w.rtt.Round(time.Microsecond))
			figures["reference-wire"] = w
		}
	}
	wire := figures["reference-wire"]
	ref, mz := figures["reference"], figures["mizar"]
	b.ReportMetric(mz.startupP50.Seconds(), "startup-p50-s")
	b.ReportMetric(mz.startupP99.Seconds(), "startup-p99-s")
	b.ReportMetric(mz.startupP99.Seconds()/ref.startupP99.Seconds(), "startup-p99-x-ref")
	b.ReportMetric(mz.gbps, "Gbit/s")
	b.ReportMetric(mz.gbps/ref.gbps, "throughput-x-ref")
	b.ReportMetric(mz.gbps/wire.gbps, "throughput-x-wire-ref")
	b.ReportMetric(float64(mz.rtt)/float64(ref.rtt), "rtt-x-ref")
	b.Logf("mizar / reference in wire mode: throughput %.2fx, RTT %.2fx", mz.gbps/wire.gbps, float64(mz.rtt)/float64(wire.rtt))
	b.Logf("mizar / reference: startup p50 %.2fx, p99 %.2fx (goal <= 1.2x); throughput %.2fx (goal >= 0.9x); RTT %.2fx",
		mz.startupP50.Seconds()/ref.startupP50.Seconds(), mz.startupP99.Seconds()/ref.startupP99.Seconds(), mz.gbps/ref.gbps, float64(mz.rtt)/float64(ref.rtt))
}

func (e *env) measure(ctx context.Context, b *testing.B) (clusterFigures, error) {
	var f clusterFigures
	ns := "bench-" + rand.String(5)
	if _, err := e.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return f, err
	}
	defer func() {
		_ = e.cs.CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), ns, metav1.DeleteOptions{})
	}()
	var err error
	if f.startupP50, f.startupP99, err = e.podStartup(ctx, ns, 100); err != nil {
		return f, fmt.Errorf("pod startup: %w", err)
	}
	if f.gbps, f.rtt, err = e.crossNode(ctx, ns); err != nil {
		return f, fmt.Errorf("cross-node: %w", err)
	}
	return f, nil
}

// measureWire turns off, on every node's eth0, the offloads mizar's agent
// turns off on a veth underlay (dataplane.WireFeatures), measures cross-node
// TCP and RTT in a fresh namespace, and turns them on again.
func (e *env) measureWire(ctx context.Context) (clusterFigures, error) {
	var f clusterFigures
	nodes, err := e.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return f, err
	}
	set := func(node string, on bool) error {
		pid, err := e.run(ctx, "podman", "inspect", "-f", "{{.State.Pid}}", node)
		if err != nil {
			return err
		}
		features := map[string]bool{}
		for name := range dataplane.WireFeatures {
			features[name] = on
		}
		return ns.WithNetNSPath("/proc/"+strings.TrimSpace(pid)+"/ns/net", func(ns.NetNS) error { return dataplane.SetFeatures("eth0", features) })
	}
	for _, n := range nodes.Items {
		if err := set(n.Name, false); err != nil {
			return f, fmt.Errorf("wire mode on %s: %w", n.Name, err)
		}
		defer func() {
			if err := set(n.Name, true); err != nil {
				fmt.Fprintf(os.Stderr, "e2ecluster: turning %s's offloads on again: %v\n", n.Name, err)
			}
		}()
	}
	name := "bench-wire-" + rand.String(5)
	if _, err := e.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return f, err
	}
	defer func() {
		_ = e.cs.CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{})
	}()
	f.gbps, f.rtt, err = e.crossNode(ctx, name)
	return f, err
}

// podStartup creates a Deployment of n pods spread over the nodes and
// measures, for each pod, from the watch event that shows it created to the
// one that shows it Ready (this process's clock, so no rounding to seconds).
func (e *env) podStartup(ctx context.Context, ns string, n int32) (p50, p99 time.Duration, err error) {
	labels := map[string]string{"app": "startup"}
	// A watch that resumes from its last resourceVersion: the server may end
	// one at any time (a kind control plane under the burst did, with no pod
	// Ready yet, and the run was lost).
	sel := metav1.ListOptions{LabelSelector: "app=startup"}
	initial, err := e.cs.CoreV1().Pods(ns).List(ctx, sel)
	if err != nil {
		return 0, 0, err
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, initial.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel.LabelSelector
			return e.cs.CoreV1().Pods(ns).Watch(ctx, o)
		},
	})
	if err != nil {
		return 0, 0, err
	}
	defer w.Stop()
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "startup"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &n,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Tolerations: []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}},
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
						MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.DoNotSchedule,
						LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
					}},
					TerminationGracePeriodSeconds: ptr(int64(1)),
					Containers: []corev1.Container{{Name: "pause", Image: e.image, ImagePullPolicy: corev1.PullNever,
						Command: []string{"sleep", "3600"}}},
				},
			},
		},
	}
	if _, err := e.cs.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		return 0, 0, err
	}
	created, ready := map[string]time.Time{}, map[string]time.Duration{}
	timeout := time.After(10 * time.Minute)
	for len(ready) < int(n) {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return 0, 0, fmt.Errorf("the pod watch ended with %d of %d pods Ready", len(ready), n)
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod || ev.Type == watch.Deleted {
				continue
			}
			now := time.Now()
			if _, seen := created[p.Name]; !seen {
				created[p.Name] = now
			}
			if c := podCondition(p, corev1.PodReady); c != nil && c.Status == corev1.ConditionTrue {
				if _, done := ready[p.Name]; !done {
					ready[p.Name] = now.Sub(created[p.Name])
				}
			}
		case <-timeout:
			return 0, 0, fmt.Errorf("%d of %d pods Ready after 10 minutes", len(ready), n)
		}
	}
	lat := make([]time.Duration, 0, len(ready))
	for _, d := range ready {
		lat = append(lat, d)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat[len(lat)/2], lat[(len(lat)*99+99)/100-1], nil
}

var pingAvg = regexp.MustCompile(`= [0-9.]+/([0-9.]+)/`)

// crossNode runs a server pod and a client pod on two different nodes and
// measures one TCP stream (busybox nc, 1 GiB of zeros, counted by the server) and
// the ping RTT between them. The transfer is timed around kubectl exec, less
// the same exec moving nothing.
func (e *env) crossNode(ctx context.Context, ns string) (gbps float64, rtt time.Duration, err error) {
	nodes, err := e.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) < 2 {
		return 0, 0, fmt.Errorf("want 2 nodes: %v", err)
	}
	mk := func(name, node string, cmd ...string) (*corev1.Pod, error) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
			NodeName: node, Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}, TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []corev1.Container{{Name: "c", Image: e.image, ImagePullPolicy: corev1.PullNever, Command: cmd}}}}
		if _, err := e.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			p, err = e.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", nil
		})
		return p, err
	}
	// The client sends and the server counts: busybox nc ends a
	// connection at the first EOF it reads, from the socket or from its
	// stdin, so the server's stdin is a pipe that never ends (one
	// connection; the count is logged when the client closes).
	srv, err := mk("server", nodes.Items[0].Name, "sh", "-c", "sleep 2147483647 | nc -l -p 5201 | wc -c")
	if err != nil {
		return 0, 0, fmt.Errorf("server pod: %w", err)
	}
	cli, err := mk("client", nodes.Items[1].Name, "sleep", "3600")
	if err != nil {
		return 0, 0, fmt.Errorf("client pod: %w", err)
	}
	const bytes = 1 << 30
	timed := func(script string) (time.Duration, string, error) {
		start := time.Now()
		out, err := e.exec(ctx, ns, cli.Name, "sh", "-c", script)
		return time.Since(start), strings.TrimSpace(out), err
	}
	idle, _, err := timed("true")
	if err != nil {
		return 0, 0, err
	}
	took, out, err := timed(fmt.Sprintf("head -c %d /dev/zero | nc %s 5201", bytes, srv.Status.PodIP))
	if err != nil {
		return 0, 0, fmt.Errorf("transfer: %v %q", err, out)
	}
	var logs []byte
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		logs, err = e.cs.CoreV1().Pods(ns).GetLogs(srv.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		return err == nil && len(strings.TrimSpace(string(logs))) > 0, nil
	}); err != nil || strings.TrimSpace(string(logs)) != strconv.Itoa(bytes) {
		return 0, 0, fmt.Errorf("transfer: the server counted %q of %d bytes (%v)", logs, bytes, err)
	}
	gbps = float64(bytes*8) / (took - idle).Seconds() / 1e9
	out, err = e.exec(ctx, ns, cli.Name, "ping", "-q", "-c", "20", "-i", "0.2", srv.Status.PodIP)
	m := pingAvg.FindStringSubmatch(out)
	if err != nil || m == nil {
		return 0, 0, fmt.Errorf("ping: %v %q", err, out)
	}
	ms, _ := strconv.ParseFloat(m[1], 64)
	return gbps, time.Duration(ms * float64(time.Millisecond)), nil
}
