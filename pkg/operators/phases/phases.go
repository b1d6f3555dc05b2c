// Package phases follows the phase of every networking object for the people
// who operate mizar: one log line per phase change (with the time from Init to
// Provisioned), a histogram of that time per kind, and a Warning Event
// (AgentNotAcknowledging) on a Droplet, Bouncer or Divider whose agent has
// left it in Init for longer than StuckAfter. It writes nothing to the objects
// and reads only the operators' shared informers.
package phases

import (
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	informers "mizar.dev/pkg/generated/informers/externalversions"
)

// ReasonAgentNotAcknowledging is the reason of the Event on an object whose
// agent has not made it Provisioned.
const ReasonAgentNotAcknowledging = "AgentNotAcknowledging"

// DefaultStuckAfter is how long an object may stay in Init before it gets an Event.
const DefaultStuckAfter = 30 * time.Second

var (
	provisionSeconds = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Name: "mizar_provision_duration_seconds",
		Help: "Time from an object's creation (as this replica saw it) to its phase Provisioned, by kind.",
		// From a few milliseconds (an endpoint on a quiet cluster) to minutes.
		Buckets:        []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		StabilityLevel: metrics.ALPHA,
	}, []string{"kind"})
	phaseChanges = metrics.NewCounterVec(&metrics.CounterOpts{
		Name:           "mizar_phase_transitions_total",
		Help:           "Phase changes of networking objects, by kind and the phase entered.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"kind", "phase"})
	registerOnce sync.Once
)

// Register adds the package's metrics to the legacy registry, which
// mizar-apiserver serves on /metrics.
func Register() {
	registerOnce.Do(func() { legacyregistry.MustRegister(provisionSeconds, phaseChanges) })
}

// Observer follows the phases of one informer factory's networking kinds.
type Observer struct {
	events     record.EventRecorder
	stuckAfter time.Duration

	mu        sync.Mutex
	firstSeen map[types.UID]time.Time
	timers    map[types.UID]*time.Timer
}

// New adds the observer's handlers to f's informers (call before f starts).
// events may be nil (no Events); stuckAfter 0 is DefaultStuckAfter.
func New(f informers.SharedInformerFactory, events record.EventRecorder, stuckAfter time.Duration) (*Observer, error) {
	Register()
	if stuckAfter == 0 {
		stuckAfter = DefaultStuckAfter
	}
	o := &Observer{events: events, stuckAfter: stuckAfter, firstSeen: map[types.UID]time.Time{}, timers: map[types.UID]*time.Timer{}}
	n := f.Networking().V1alpha1()
	for _, k := range []struct {
		kind string
		inf  cache.SharedIndexInformer
		// agent names who makes the object Provisioned, for an Event; "" when
		// no agent does (an operator does, and logs its own reasons).
		agent func(obj any) string
	}{
		{"Vpc", n.Vpcs().Informer(), nil},
		{"Subnet", n.Subnets().Informer(), nil},
		{"Endpoint", n.Endpoints().Informer(), nil},
		{"Droplet", n.Droplets().Informer(), func(obj any) string { return obj.(*v1alpha1.Droplet).Name }},
		{"Bouncer", n.Bouncers().Informer(), func(obj any) string { return obj.(*v1alpha1.Bouncer).Spec.Droplet }},
		{"Divider", n.Dividers().Informer(), func(obj any) string { return obj.(*v1alpha1.Divider).Spec.Droplet }},
	} {
		var reg cache.ResourceEventHandlerRegistration
		var err error
		reg, err = k.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) {
				// Objects of the initial list were created before this
				// replica looked: their creationTimestamp is the start.
				o.added(k.kind, k.inf, k.agent, obj, reg != nil && reg.HasSynced())
			},
			UpdateFunc: func(old, cur any) { o.updated(k.kind, old, cur) },
			DeleteFunc: func(obj any) { o.deleted(obj) },
		})
		if err != nil {
			return nil, fmt.Errorf("phases: %s informer: %w", k.kind, err)
		}
	}
	return o, nil
}

// status is the part of a networking object the observer reads.
func status(obj any) (metav1.Object, v1alpha1.Phase, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	switch v := obj.(type) {
	case *v1alpha1.Vpc:
		return v, v.Status.Phase, true
	case *v1alpha1.Subnet:
		return v, v.Status.Phase, true
	case *v1alpha1.Endpoint:
		return v, v.Status.Phase, true
	case *v1alpha1.Droplet:
		return v, v.Status.Phase, true
	case *v1alpha1.Bouncer:
		return v, v.Status.Phase, true
	case *v1alpha1.Divider:
		return v, v.Status.Phase, true
	}
	return nil, "", false
}

func initial(p v1alpha1.Phase) bool { return p == "" || p == v1alpha1.PhaseInit }

func (o *Observer) added(kind string, inf cache.SharedIndexInformer, agent func(any) string, obj any, live bool) {
	m, phase, ok := status(obj)
	if !ok || !initial(phase) {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if live {
		o.firstSeen[m.GetUID()] = time.Now()
	}
	if agent == nil || o.events == nil {
		return
	}
	// Due StuckAfter after creation: an object found already old at start
	// is checked at once.
	due := o.stuckAfter - time.Since(m.GetCreationTimestamp().Time)
	if live {
		due = o.stuckAfter
	}
	uid, key := m.GetUID(), keyOf(m)
	o.timers[uid] = time.AfterFunc(max(due, 0), func() { o.checkStuck(kind, inf, agent, key, uid) })
}

func keyOf(m metav1.Object) string {
	if m.GetNamespace() == "" {
		return m.GetName()
	}
	return m.GetNamespace() + "/" + m.GetName()
}

// checkStuck posts the Event if the object is still in Init, and looks again
// after twice the time (an Event that repeats is counted, not duplicated).
func (o *Observer) checkStuck(kind string, inf cache.SharedIndexInformer, agent func(any) string, key string, uid types.UID) {
	obj, exists, err := inf.GetStore().GetByKey(key)
	m, phase, ok := status(obj)
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, armed := o.timers[uid]; !armed {
		return
	}
	if err != nil || !exists || !ok || m.GetUID() != uid || !initial(phase) || m.GetDeletionTimestamp() != nil {
		delete(o.timers, uid)
		return
	}
	age := time.Since(m.GetCreationTimestamp().Time).Round(time.Second)
	droplet := agent(obj)
	msg := fmt.Sprintf("%s %s is still %s after %v: mizar-nodeagent of droplet %s has not acknowledged it; check that the agent runs on that node and reaches mizar-apiserver",
		kind, m.GetName(), v1alpha1.PhaseInit, age, droplet)
	klog.Background().WithName("phases").Info("Agent not acknowledging", "kind", kind, "object", klog.KObj(m), "droplet", droplet, "age", age)
	o.events.Event(Reference(kind, m), corev1.EventTypeWarning, ReasonAgentNotAcknowledging, msg)
	o.timers[uid] = time.AfterFunc(2*max(age, o.stuckAfter), func() { o.checkStuck(kind, inf, agent, key, uid) })
}

func (o *Observer) updated(kind string, old, cur any) {
	_, was, ok1 := status(old)
	m, phase, ok2 := status(cur)
	if !ok1 || !ok2 || was == phase {
		return
	}
	phaseChanges.WithLabelValues(kind, string(phase)).Inc()
	logger := klog.Background().WithName("phases")
	kv := []any{"kind", kind, "object", klog.KObj(m), "from", string(was), "to", string(phase)}
	o.mu.Lock()
	start, seen := o.firstSeen[m.GetUID()]
	if phase != v1alpha1.PhaseInit {
		delete(o.firstSeen, m.GetUID())
		if t := o.timers[m.GetUID()]; t != nil {
			t.Stop()
			delete(o.timers, m.GetUID())
		}
	}
	o.mu.Unlock()
	if initial(was) && phase == v1alpha1.PhaseProvisioned {
		if !seen {
			start = m.GetCreationTimestamp().Time
		}
		took := time.Since(start)
		provisionSeconds.WithLabelValues(kind).Observe(took.Seconds())
		kv = append(kv, "initToProvisioned", took)
	}
	if phase == v1alpha1.PhaseFailed {
		logger.Info("Phase changed to Failed", append(kv, "conditions", conditionsOf(cur))...)
		return
	}
	// Endpoints come and go with pods: their lines are one level down.
	v := 0
	if kind == "Endpoint" {
		v = 2
	}
	logger.V(v).Info("Phase changed", kv...)
}

func (o *Observer) deleted(obj any) {
	m, _, ok := status(obj)
	if !ok {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.firstSeen, m.GetUID())
	if t := o.timers[m.GetUID()]; t != nil {
		t.Stop()
		delete(o.timers, m.GetUID())
	}
}

func conditionsOf(obj any) []metav1.Condition {
	switch v := obj.(type) {
	case *v1alpha1.Vpc:
		return v.Status.Conditions
	case *v1alpha1.Subnet:
		return v.Status.Conditions
	case *v1alpha1.Endpoint:
		return v.Status.Conditions
	case *v1alpha1.Droplet:
		return v.Status.Conditions
	case *v1alpha1.Bouncer:
		return v.Status.Conditions
	case *v1alpha1.Divider:
		return v.Status.Conditions
	}
	return nil
}

// Reference is the involvedObject of an Event about a networking object: its
// UID included, since kubectl describe selects Events by it.
func Reference(kind string, m metav1.Object) *corev1.ObjectReference {
	return &corev1.ObjectReference{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: kind, Namespace: m.GetNamespace(), Name: m.GetName(),
		UID: m.GetUID()}
}
