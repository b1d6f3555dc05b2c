package nodeagent

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"mizar.dev/pkg/dataplane"
)

// newRegistry is the agent's Prometheus registry, with the Go runtime's and
// the process's collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// workloadEvents returns a recorder posting Events to the workload cluster
// (nil without one) and what stops it.
func workloadEvents(workload kubernetes.Interface, node string) (record.EventRecorder, func()) {
	if workload == nil {
		return nil, func() {}
	}
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: workload.CoreV1().Events("")})
	return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "mizar-nodeagent", Host: node}), b.Shutdown
}

// metricSources are what a scrape reads. Each is O(1) in the number of pods
// and endpoints: per-CPU counter arrays of fixed size, the agent's own
// bookkeeping of what it wrote into the maps (a length per map, never a
// walk of a map), and the underlay's link statistics. No series is labelled
// by a pod or an interface that comes and goes with pods.
type metricSources struct {
	dp        *dataplane.Datapath
	occupancy func() map[string]int
	events    func() int64
	underlay  func() (dataplane.LinkDrops, error)
}

// metrics exports the datapath's state to Prometheus.
type metrics struct {
	reg *prometheus.Registry
	src metricSources
}

var (
	descPackets = prometheus.NewDesc("mizar_dataplane_packets_total",
		"Fast-path verdicts on this node, by program (underlay: XDP on the underlay; pod: TC on the pods' veths) and reason (deliver, fwd_*, drop_*).",
		[]string{"program", "reason"}, nil)
	descEntries = prometheus.NewDesc("mizar_dataplane_map_entries",
		"Entries the agent has written into the datapath's maps, by map (from its own bookkeeping).", []string{"map"}, nil)
	descKernel = prometheus.NewDesc("mizar_underlay_kernel_drops_total",
		"Kernel drop and error counters of the underlay interface (losses after the programs returned).", []string{"counter"}, nil)
	descEvents = prometheus.NewDesc("mizar_nodeagent_endpoint_events_total", "Endpoint watch events the agent received.", nil, nil)
	descUp     = prometheus.NewDesc("mizar_dataplane_readable", "1 when the datapath's counters could be read at this scrape, else 0.", nil, nil)
)

func newMetrics(reg *prometheus.Registry, src metricSources) *metrics {
	m := &metrics{reg: reg, src: src}
	reg.MustRegister(m)
	return m
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPackets, descEntries, descKernel, descEvents, descUp} {
		ch <- d
	}
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	up := 0.0
	if c, err := m.src.dp.Counters(); err == nil {
		up = 1
		for k, v := range c.Underlay {
			ch <- prometheus.MustNewConstMetric(descPackets, prometheus.CounterValue, float64(v), "underlay", k)
		}
		for k, v := range c.Pod {
			ch <- prometheus.MustNewConstMetric(descPackets, prometheus.CounterValue, float64(v), "pod", k)
		}
	}
	ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, up)
	for name, n := range m.src.occupancy() {
		ch <- prometheus.MustNewConstMetric(descEntries, prometheus.GaugeValue, float64(n), name)
	}
	if m.src.underlay != nil {
		if l, err := m.src.underlay(); err == nil {
			for k, v := range map[string]uint64{"rx_dropped": l.RxDropped, "tx_dropped": l.TxDropped, "rx_errors": l.RxErrors, "tx_errors": l.TxErrors} {
				ch <- prometheus.MustNewConstMetric(descKernel, prometheus.CounterValue, float64(v), k)
			}
		}
	}
	if m.src.events != nil {
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(m.src.events()))
	}
}

func (m *metrics) mux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if _, err := m.src.dp.Counters(); err != nil {
			http.Error(w, "datapath unreadable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// underlayDrops reads the underlay's kernel counters in the host netns.
func (p *DatapathPods) underlayDrops(ifindex int) (dataplane.LinkDrops, error) {
	var ld dataplane.LinkDrops
	err := p.inHost(func() error {
		l, err := netlink.LinkByIndex(ifindex)
		if err != nil {
			return fmt.Errorf("underlay statistics: %w", err)
		}
		ld = dataplane.LinkDrops{Ifname: l.Attrs().Name, Ifindex: ifindex}
		if s := l.Attrs().Statistics; s != nil {
			ld.RxDropped, ld.TxDropped, ld.RxErrors, ld.TxErrors = s.RxDropped, s.TxDropped, s.RxErrors, s.TxErrors
		}
		return nil
	})
	return ld, err
}
