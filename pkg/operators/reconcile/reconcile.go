// Package reconcile is the loop every mizar operator shares, after
// kubernetes/sample-controller: informer events put keys on a rate-limited
// workqueue and workers call the operator's Reconcile(key). Reconciles are
// level-triggered: each one reads the current state from listers, so repeating
// one is harmless and a missed event is repaired by the next.
package reconcile

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	// Queue depth, adds, latency and retries of every named workqueue,
	// served by mizar-apiserver's /metrics (workqueue_*{name=...}).
	_ "k8s.io/component-base/metrics/prometheus/workqueue"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
)

var (
	reconcileSeconds = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Name:           "mizar_operator_reconcile_duration_seconds",
		Help:           "Time one reconcile of a key took, by operator and result (success, error, conflict).",
		Buckets:        []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		StabilityLevel: metrics.ALPHA,
	}, []string{"operator", "result"})
	registerOnce sync.Once
)

// Func reconciles the object named by key ("name" or "namespace/name").
type Func func(ctx context.Context, key string) error

// Loop is one operator's queue and workers.
type Loop struct {
	Name  string
	Queue workqueue.TypedRateLimitingInterface[string]
	sync  Func
}

// New returns a loop that calls sync for every queued key.
func New(name string, sync Func) *Loop {
	registerOnce.Do(func() { legacyregistry.MustRegister(reconcileSeconds) })
	return &Loop{
		Name: name,
		Queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: name}),
		sync: sync,
	}
}

// Enqueue queues the key of obj (a tombstone included).
func (l *Loop) Enqueue(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(fmt.Errorf("%s: key of %T: %w", l.Name, obj, err))
		return
	}
	l.Queue.Add(key)
}

// Handler enqueues the object itself on every add, update and delete.
func (l *Loop) Handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    l.Enqueue,
		UpdateFunc: func(_, obj any) { l.Enqueue(obj) },
		DeleteFunc: l.Enqueue,
	}
}

// MapHandler enqueues the keys that keys(obj) returns for every event on another
// kind, e.g. a VPC for each change of one of its dividers.
func (l *Loop) MapHandler(keys func(obj any) []string) cache.ResourceEventHandler {
	add := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		for _, k := range keys(obj) {
			l.Queue.Add(k)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    add,
		UpdateFunc: func(_, obj any) { add(obj) },
		DeleteFunc: add,
	}
}

// Run processes the queue with workers goroutines until ctx ends.
func (l *Loop) Run(ctx context.Context, workers int) {
	defer l.Queue.ShutDown()
	for range workers {
		go func() {
			for l.next(ctx) {
			}
		}()
	}
	<-ctx.Done()
}

func (l *Loop) next(ctx context.Context) bool {
	key, quit := l.Queue.Get()
	if quit {
		return false
	}
	defer l.Queue.Done(key)
	start := time.Now()
	err := l.sync(ctx, key)
	result := "success"
	switch {
	case apierrors.IsConflict(err):
		result = "conflict"
	case err != nil:
		result = "error"
	}
	reconcileSeconds.WithLabelValues(l.Name, result).Observe(time.Since(start).Seconds())
	if apierrors.IsConflict(err) {
		// The cache was behind: the newer version's watch event queues the key
		// again, so waiting out a rate limit would only add latency.
		l.Queue.Forget(key)
		return true
	}
	if err != nil {
		if ctx.Err() == nil {
			utilruntime.HandleError(fmt.Errorf("%s: reconciling %q: %w", l.Name, key, err))
		}
		l.Queue.AddRateLimited(key)
		return true
	}
	l.Queue.Forget(key)
	return true
}

// SetCondition sets a condition on conds and reports whether anything changed,
// so a reconcile writes status only when it would differ.
func SetCondition(conds *[]metav1.Condition, generation int64, typ string, status bool, reason, message string) bool {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	return meta.SetStatusCondition(conds, metav1.Condition{
		Type: typ, Status: s, Reason: reason, Message: message, ObservedGeneration: generation,
	})
}

// The condition a divider or bouncer carries about what it names: its VPC or
// subnet, and the droplet it is placed on. One made by hand may name objects
// that do not exist; it is held (no agent serves it) with a condition that says so.
const (
	ConditionReferences    = "ReferencesResolved"
	ReasonReferencesFound  = "ReferencesFound"
	ReasonReferenceMissing = "ReferenceNotFound"
)

// SetReferences sets the ReferencesResolved condition from the names that were
// not found, and reports whether it changed.
func SetReferences(conds *[]metav1.Condition, generation int64, missing []string) bool {
	if len(missing) == 0 {
		return SetCondition(conds, generation, ConditionReferences, true, ReasonReferencesFound, "every object it names exists")
	}
	return SetCondition(conds, generation, ConditionReferences, false, ReasonReferenceMissing,
		strings.Join(missing, " and ")+" not found; create it, or fix the spec")
}

// AddIndex adds a named index to an informer unless another operator sharing the
// informer already did; indexes must be added before the informer starts.
func AddIndex(inf cache.SharedIndexInformer, name string, fn cache.IndexFunc) error {
	if _, ok := inf.GetIndexer().GetIndexers()[name]; ok {
		return nil
	}
	if err := inf.AddIndexers(cache.Indexers{name: fn}); err != nil {
		return fmt.Errorf("adding index %s: %w", name, err)
	}
	return nil
}

// ByIndex returns the objects of an informer under one index value, typed.
func ByIndex[T any](inf cache.SharedIndexInformer, index, value string) []T {
	objs, err := inf.GetIndexer().ByIndex(index, value)
	if err != nil {
		// Only an unknown index fails, a programming error caught by every test.
		panic(fmt.Sprintf("index %s: %v", index, err))
	}
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(T))
	}
	return out
}

// Finalizer holds an object until its operator has drained what depends on it.
const Finalizer = v1alpha1.OperatorFinalizer

// HasFinalizer reports whether the object carries mizar's finalizer.
func HasFinalizer(m metav1.Object) bool {
	for _, f := range m.GetFinalizers() {
		if f == Finalizer {
			return true
		}
	}
	return false
}

// WithoutFinalizer returns m's finalizers without mizar's.
func WithoutFinalizer(m metav1.Object) []string {
	var out []string
	for _, f := range m.GetFinalizers() {
		if f != Finalizer {
			out = append(out, f)
		}
	}
	return out
}

// OwnedBy reports whether uid is m's controller: objects an operator created for
// an earlier incarnation of a same-named owner are not its.
func OwnedBy(m metav1.Object, uid types.UID) bool {
	ref := metav1.GetControllerOf(m)
	return ref != nil && ref.UID == uid
}

// SameProvisioning reports whether two provisioning statuses are equal apart from
// condition timestamps, so a reconcile skips writes that change nothing.
func SameProvisioning(a, b *v1alpha1.ProvisioningStatus) bool {
	if a.Phase != b.Phase || a.ObservedGeneration != b.ObservedGeneration || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for _, c := range b.Conditions {
		old := meta.FindStatusCondition(a.Conditions, c.Type)
		if old == nil || old.Status != c.Status || old.Reason != c.Reason || old.Message != c.Message || old.ObservedGeneration != c.ObservedGeneration {
			return false
		}
	}
	return true
}
