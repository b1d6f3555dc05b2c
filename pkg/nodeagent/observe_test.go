package nodeagent

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/dataplane"
	testcluster "mizar.dev/test/cluster"
	"mizar.dev/test/logtest"
	"mizar.dev/test/workloadcluster"
)

// sample is the value of one series in a gathered registry (-1: absent).
func sample(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
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
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return -1
}

// A refused ADD, a good ADD and its DEL through the real plugin: each leaves
// one log line with its latency (the refusal with its CNI code and reason),
// and the CNI metrics count them by command and result.
func TestCNIOutcomesLoggedAndCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newCNIEnv(t, func(o *CNIOptions) { o.Metrics = NewCNIMetrics(reg) })
	logs := logtest.Capture(t, 0)
	ctx := context.Background()

	rt, _ := e.pod("refused")
	_, err := e.cni.AddNetworkList(ctx, e.conflist("1.1.0", "no-such-"+e.sfx), rt)
	if cniCode(t, err) != types.ErrInvalidNetworkConfig {
		t.Fatalf("ADD into an unknown subnet: %v", err)
	}
	lines := logs.Lines(`"CNI request failed"`, `"command"="ADD"`, `"code"=7`, `"latency"=`, `no-such-`+e.sfx, `"pod"={"name"="refused" "namespace"="default"}`)
	if len(lines) != 1 {
		t.Errorf("want one log line naming the refused ADD's pod, code and reason; got %q", logs.Lines(`"CNI request`))
	}

	rt, _ = e.pod("good")
	l := e.conflist("1.1.0", e.subnet)
	if _, err := e.cni.AddNetworkList(ctx, l, rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if err := e.cni.DelNetworkList(ctx, l, rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	for _, cmd := range []string{"ADD", "DEL"} {
		if got := logs.Lines(`"CNI request succeeded"`, `"command"="`+cmd+`"`, `"latency"=`, `"name"="good"`); len(got) != 1 {
			t.Errorf("%s: want one success line, got %q", cmd, got)
		}
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"mizar_cni_requests_total", map[string]string{"command": "ADD", "result": "error"}, 1},
		{"mizar_cni_requests_total", map[string]string{"command": "ADD", "result": "success"}, 1},
		{"mizar_cni_requests_total", map[string]string{"command": "DEL", "result": "success"}, 1},
		{"mizar_cni_errors_total", map[string]string{"command": "ADD", "code": "7"}, 1},
		{"mizar_cni_request_duration_seconds", map[string]string{"command": "ADD", "result": "success"}, 1},
		{"mizar_cni_request_duration_seconds", map[string]string{"command": "ADD", "result": "error"}, 1},
	} {
		if got := sample(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// A pod whose ADD the agent refuses gets a NetworkRefused Warning Event in
// the workload cluster (a real kube-apiserver), which kubectl describe shows.
func TestCNIRefusedPodGetsAnEvent(t *testing.T) {
	requireRoot(t)
	wc := workloadcluster.StartAPIServer(t)
	kube, err := kubernetes.NewForConfig(wc.Admin)
	if err != nil {
		t.Fatal(err)
	}
	events, stop := workloadEvents(kube, "node-under-test")
	t.Cleanup(stop)
	e := newCNIEnv(t, func(o *CNIOptions) { o.Events, o.WorkloadPods = events, kube.CoreV1() })
	ctx := context.Background()
	name := "refused-" + e.sfx
	// No controller-manager makes the namespace's ServiceAccount, which
	// admission wants for a pod.
	if _, err := kube.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// The pod asks for a subnet that does not exist (its annotation wins
	// over the conflist): the ADD is refused with code 7.
	pod, err := kube.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name,
		Annotations: map[string]string{AnnotationSubnet: "missing-" + e.sfx}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rt, _ := e.pod(name)
	if _, err := e.cni.AddNetworkList(ctx, e.conflist("1.1.0", e.subnet), rt); cniCode(t, err) != types.ErrInvalidNetworkConfig {
		t.Fatalf("ADD of a pod annotated with a missing subnet: %v", err)
	}
	var ev *corev1.Event
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=" + ReasonNetworkRefused})
		if err != nil || len(l.Items) == 0 {
			return false, nil
		}
		ev = &l.Items[0]
		return true, nil
	}); err != nil {
		t.Fatalf("no %s Event on pod %s: %v", ReasonNetworkRefused, name, err)
	}
	if ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.UID != pod.UID || !strings.Contains(ev.Message, "missing-"+e.sfx) ||
		!strings.Contains(ev.Message, "CNI error 7") {
		t.Errorf("Event %s %q on %+v", ev.Type, ev.Message, ev.InvolvedObject)
	}
	bins, err := testcluster.Binaries("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bins["kubectl"], "--kubeconfig", wc.AdminKubeconfig, "describe", "pod", name).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl describe: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), ReasonNetworkRefused) || !strings.Contains(string(out), "missing-"+e.sfx) {
		t.Errorf("kubectl describe pod shows no %s naming the subnet:\n%s", ReasonNetworkRefused, out)
	}
}

// A scrape of the agent's metrics has the same series with 10 and with
// 1,000 endpoints and pods: nothing is labelled per pod, and map occupancy
// comes from the agent's bookkeeping (whose counts the gauges report).
func TestScrapeDoesNotGrowWithPods(t *testing.T) {
	requireRoot(t)
	sfx := suffix(t)
	node := netnsAdd(t, "mzt-scrape-"+sfx)
	h := handle(t, node)
	ul := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul0", MTU: 1500}, PeerName: "ul0p"}
	if err := h.LinkAdd(ul); err != nil {
		t.Fatal(err)
	}
	ull, err := h.LinkByName("ul0")
	if err != nil {
		t.Fatal(err)
	}
	if err := dataplane.MountBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	pins := "/sys/fs/bpf/mizar-test-scrape-" + sfx
	t.Cleanup(func() {
		if err := dataplane.Purge(pins); err != nil {
			t.Errorf("purge %s: %v", pins, err)
		}
	})
	hostIP := netip.MustParseAddr("198.18.9.1")
	dp, err := dataplane.Load(dataplane.Options{PinRoot: pins, UnderlayIfindex: ull.Attrs().Index, HostIP: hostIP,
		HostMAC: ull.Attrs().HardwareAddr, XDPMode: dataplane.XDPGeneric})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	rdp := NewDatapath(DatapathOptions{DP: dp, Droplet: "scrape", Underlay: "ul0", HostIP: netip.PrefixFrom(hostIP, 24), HostNetns: node})
	reg := newRegistry()
	NewCNIMetrics(reg)
	newMetrics(reg, metricSources{dp: dp, occupancy: rdp.Occupancy, events: func() int64 { return 0 },
		underlay: func() (dataplane.LinkDrops, error) { return rdp.Pods().underlayDrops(ull.Attrs().Index) }})

	// Endpoints and pod interfaces go through the same bookkeeping the
	// agent's calls use, and into the real maps.
	added := 0
	grow := func(n int) {
		for ; added < n; added++ {
			ip := netip.AddrFrom4([4]byte{10, 66, byte(added >> 8), byte(added)})
			ep := &v1alpha1.Endpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("ep-%d", added)}}
			if err := rdp.set("bouncer/b", ep, dataplane.Endpoint{VNI: 7, IP: ip, MAC: randomMAC(), HostIP: netip.MustParseAddr("198.18.9.2")}); err != nil {
				t.Fatal(err)
			}
			if err := dp.UpsertPodInterface(dataplane.PodInterface{Ifindex: 100000 + added, VNI: 7, IP: ip, MAC: randomMAC(),
				Subnet: netip.MustParsePrefix("10.66.0.0/16"), GatewayIP: netip.MustParseAddr("10.66.0.1"), GatewayMAC: randomMAC()}); err != nil {
				t.Fatal(err)
			}
			rdp.pods.track(fmt.Sprintf("mz%011d", added), true)
		}
	}
	scrape := func() (series int, took time.Duration) {
		start := time.Now()
		mfs, err := reg.Gather()
		took = time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			series += len(mf.GetMetric())
		}
		return series, took
	}
	grow(10)
	small, tSmall := scrape()
	if got := sample(t, reg, "mizar_dataplane_map_entries", map[string]string{"map": "endpoints"}); got != 10 {
		t.Errorf("endpoints entries with 10: %v", got)
	}
	grow(1000)
	large, tLarge := scrape()
	if got := sample(t, reg, "mizar_dataplane_map_entries", map[string]string{"map": "pod_ifaces"}); got != 1000 {
		t.Errorf("pod_ifaces entries with 1000: %v", got)
	}
	if small != large {
		t.Errorf("a scrape has %d series with 10 endpoints and pods, %d with 1000", small, large)
	}
	t.Logf("series: %d with 10 endpoints and pods, %d with 1000; scrape %v vs %v", small, large, tSmall, tLarge)
	// Every series the agent promises is there.
	for _, name := range []string{"mizar_dataplane_packets_total", "mizar_dataplane_map_entries", "mizar_underlay_kernel_drops_total",
		"mizar_dataplane_readable", "go_goroutines", "process_resident_memory_bytes"} {
		if sample(t, reg, name, nil) < 0 {
			t.Errorf("%s missing from the scrape", name)
		}
	}
}
