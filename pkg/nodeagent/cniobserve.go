package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"mizar.dev/pkg/cni"
)

// ReasonNetworkRefused is the reason of the Warning Event a workload pod gets
// when the agent refuses its CNI ADD.
const ReasonNetworkRefused = "NetworkRefused"

// CNIMetrics count and time the CNI server's requests. Labels are the
// command, the result ("success" or "error") and the CNI error code: each a
// handful of values, never a pod's.
type CNIMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
}

// NewCNIMetrics registers the CNI server's metrics with reg.
func NewCNIMetrics(reg prometheus.Registerer) *CNIMetrics {
	m := &CNIMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mizar_cni_requests_total",
			Help: "CNI requests the agent answered, by command and result (success or error)."}, []string{"command", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "mizar_cni_request_duration_seconds",
			Help:    "Time the agent took to answer a CNI request, by command and result.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"command", "result"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mizar_cni_errors_total",
			Help: "CNI requests that failed, by command and CNI error code."}, []string{"command", "code"}),
	}
	reg.MustRegister(m.requests, m.duration, m.errors)
	return m
}

func (m *CNIMetrics) observe(command string, took time.Duration, cerr *types.Error) {
	if m == nil {
		return
	}
	result := "success"
	if cerr != nil {
		result = "error"
		m.errors.WithLabelValues(command, strconv.FormatUint(uint64(cerr.Code), 10)).Inc()
	}
	m.requests.WithLabelValues(command, result).Inc()
	m.duration.WithLabelValues(command, result).Observe(took.Seconds())
}

// Handle implements cni.Handler: it runs the request and leaves one log line
// per outcome (failures always, with the CNI code and reason), counts and
// times it, and tells a workload pod why its ADD was refused.
func (s *CNIServer) Handle(ctx context.Context, r *cni.Request) (json.RawMessage, *types.Error) {
	start := time.Now()
	// As the spec writes them (the socket protocol carries them lower-case).
	command := strings.ToUpper(r.Command)
	logger := klog.FromContext(ctx).WithName("cni").WithValues("command", command, "containerID", shortID(r.ContainerID), "ifname", r.IfName)
	var ns, pod, uid string
	if a, cerr := cni.ParseArgs(r.Args); cerr == nil {
		ns, pod, uid = string(a.K8S_POD_NAMESPACE), string(a.K8S_POD_NAME), string(a.K8S_POD_UID)
		if ns == "" && pod != "" {
			ns = metav1.NamespaceDefault
		}
		if pod != "" {
			logger = logger.WithValues("pod", klog.KRef(ns, pod))
		}
	}
	res, cerr := s.handle(klog.NewContext(ctx, logger), r)
	took := time.Since(start)
	s.o.Metrics.observe(command, took, cerr)
	if cerr != nil {
		logger.Error(nil, "CNI request failed", "latency", took, "code", cerr.Code, "reason", cerr.Msg, "details", cerr.Details)
		if r.Command == cni.CmdAdd && pod != "" {
			s.refused(ctx, ns, pod, uid, cerr)
		}
		return res, cerr
	}
	// ADD and DEL come once per pod: at the default level. CHECK, STATUS
	// and GC may come periodically.
	v := 0
	switch r.Command {
	case cni.CmdCheck, cni.CmdGC:
		v = 2
	case cni.CmdStatus:
		v = 4
	}
	kv := []any{"latency", took}
	if r.Command == cni.CmdAdd {
		kv = append(kv, "endpoint", klog.KRef(ns, endpointName(r)))
	}
	logger.V(v).Info("CNI request succeeded", kv...)
	return res, nil
}

// endpointName is the endpoint name of a request's attachment.
func endpointName(r *cni.Request) string {
	ep, _ := names(attachmentID(r.ContainerID, r.IfName))
	return ep
}

// refused posts a NetworkRefused Warning on the workload pod. The Event is
// matched to the pod by its UID (kubectl describe selects on it): from
// CNI_ARGS when the runtime sent it, else read from the workload cluster.
func (s *CNIServer) refused(ctx context.Context, ns, pod, uid string, cerr *types.Error) {
	if s.o.Events == nil {
		return
	}
	if uid == "" && s.o.WorkloadPods != nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if po, err := s.o.WorkloadPods.Pods(ns).Get(ctx, pod, metav1.GetOptions{}); err == nil {
			uid = string(po.UID)
		} else {
			klog.FromContext(ctx).V(2).Info("No Event for the refused pod: it cannot be read", "pod", klog.KRef(ns, pod), "err", err)
			return
		}
	}
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: pod, UID: k8stypes.UID(uid)}
	msg := fmt.Sprintf("mizar-nodeagent on %s refused the pod's network (CNI error %d): %s", s.o.Droplet, cerr.Code, cerr.Msg)
	if cerr.Details != "" {
		msg += ": " + cerr.Details
	}
	s.o.Events.Event(ref, corev1.EventTypeWarning, ReasonNetworkRefused, msg)
}

// shortID is a container ID as runtimes print it.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
