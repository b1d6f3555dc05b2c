package nodeagent

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// stream follows one slice of one kind (a field selector) and hands every change
// to its handler in order. After a disconnect it resumes watching from the last
// resourceVersion it saw; when that is too old (410 Gone) it lists again and
// removes what disappeared meanwhile. It reports the resourceVersion up to which
// it has applied the slice (synced) after every list, and after watch events
// only when it applied one that somebody awaits, at most once per ackInterval:
// a burst of events costs one write, and events nobody waits for cost none.
type stream[T runtime.Object] struct {
	name     string
	selector string
	list     func(context.Context, metav1.ListOptions) ([]T, string, error)
	watch    func(context.Context, metav1.ListOptions) (watch.Interface, error)
	// set applies a present object; del removes one ("namespace/name" or "name")
	// that is gone or being deleted.
	set func(T) error
	del func(key string) error
	// synced is called with the resourceVersion up to which the slice is applied.
	synced func(ctx context.Context, rv string) error
	// awaited reports whether somebody waits for the acknowledgement of a
	// version; nil: nobody, synced runs after lists only.
	awaited func(T) bool
	// ackInterval is the least time between two synced calls after watch events.
	ackInterval time.Duration
	// events counts watch events received, for the benchmarks.
	events *atomic.Int64
	// keepDeleting hands objects being deleted to set: only their final
	// removal goes to del (a divider follows a deleting subnet's endpoints
	// until they are drained and the subnet is gone).
	keepDeleting bool

	// unacked: an awaited version was applied but not yet reported. Kept across
	// reconnects, so a failed or interrupted report is made after resuming.
	unacked bool
	lastAck time.Time
}

// errRelist asks run to list again.
type errRelist struct{ error }

// run follows the slice until ctx ends.
func (s *stream[T]) run(ctx context.Context) {
	known := map[string]bool{}
	backoff := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 8, Cap: 10 * time.Second}
	rv := ""
	for ctx.Err() == nil {
		var err error
		if rv == "" {
			rv, err = s.relist(ctx, known)
		} else {
			rv, err = s.follow(ctx, rv, known)
			if _, ok := err.(errRelist); ok {
				klog.V(2).InfoS("Watch expired; listing again", "stream", s.name, "resourceVersion", rv)
				rv, err = "", nil
				continue
			}
		}
		if err != nil && ctx.Err() == nil {
			klog.ErrorS(err, "Agent stream failed; retrying", "stream", s.name)
			select {
			case <-ctx.Done():
			case <-time.After(backoff.Step()):
			}
			continue
		}
		backoff = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 8, Cap: 10 * time.Second}
	}
}

// relist applies a fresh list and returns its resourceVersion, or "" on error.
func (s *stream[T]) relist(ctx context.Context, known map[string]bool) (string, error) {
	items, rv, err := s.list(ctx, metav1.ListOptions{FieldSelector: s.selector})
	if err != nil {
		return "", fmt.Errorf("listing %s: %w", s.name, err)
	}
	seen := map[string]bool{}
	for _, obj := range items {
		key, err := s.apply(obj, false)
		if err != nil {
			return "", err
		}
		seen[key] = true
	}
	for key := range known {
		if !seen[key] {
			if err := s.del(key); err != nil {
				return "", fmt.Errorf("%s: removing %s: %w", s.name, key, err)
			}
		}
	}
	clear(known)
	for k := range seen {
		known[k] = true
	}
	// Always reported: whatever anyone awaits up to rv is applied now.
	if err := s.ack(ctx, rv); err != nil {
		return "", err
	}
	return rv, nil
}

// ack reports rv as applied. The interval runs from the start of one write to
// the next (writes are sequential, so it still bounds their rate): counted from
// the end, every write's own latency would delay the next acknowledgement too.
func (s *stream[T]) ack(ctx context.Context, rv string) error {
	start := time.Now()
	if err := s.synced(ctx, rv); err != nil {
		return err
	}
	s.unacked = false
	s.lastAck = start
	return nil
}

// follow watches from rv and returns the last resourceVersion applied when the
// watch ends; errRelist when rv is too old.
func (s *stream[T]) follow(ctx context.Context, rv string, known map[string]bool) (string, error) {
	w, err := s.watch(ctx, metav1.ListOptions{FieldSelector: s.selector, ResourceVersion: rv})
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return rv, errRelist{err}
	}
	if err != nil {
		return rv, fmt.Errorf("watching %s: %w", s.name, err)
	}
	defer w.Stop()
	// The acknowledgement timer runs while something awaited is unreported. It
	// fires at once after a quiet spell, so a lone event is acknowledged without
	// delay; within a burst the events of one interval share one write.
	var timer *time.Timer
	var due <-chan time.Time
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	arm := func() {
		if due != nil || !s.unacked {
			return
		}
		timer = time.NewTimer(max(0, s.ackInterval-time.Since(s.lastAck)))
		due = timer.C
	}
	arm()
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-ctx.Done():
			return rv, nil
		case <-due:
			due = nil
			if err := s.ack(ctx, rv); err != nil {
				return rv, err
			}
			continue
		case ev, ok = <-w.ResultChan():
		}
		if !ok {
			return rv, nil // closed: resume from rv (and report what is unreported then)
		}
		s.events.Add(1)
		if ev.Type == watch.Error {
			err := apierrors.FromObject(ev.Object)
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				return rv, errRelist{err}
			}
			return rv, fmt.Errorf("watch of %s: %w", s.name, err)
		}
		obj, isT := ev.Object.(T)
		if !isT {
			return rv, fmt.Errorf("watch of %s: unexpected %T", s.name, ev.Object)
		}
		if ev.Type != watch.Bookmark {
			key, err := s.apply(obj, ev.Type == watch.Deleted)
			if err != nil {
				return rv, err
			}
			if ev.Type == watch.Deleted {
				delete(known, key)
			} else {
				known[key] = true
			}
			if s.awaited != nil && s.awaited(obj) {
				s.unacked = true
			}
		}
		m, _ := meta.Accessor(obj)
		rv = m.GetResourceVersion()
		arm()
	}
}

// apply hands obj to set, or to del when it is gone or being deleted.
func (s *stream[T]) apply(obj T, gone bool) (string, error) {
	key, err := cache.MetaNamespaceKeyFunc(obj)
	if err != nil {
		return "", err
	}
	m, _ := meta.Accessor(obj)
	if gone || (m.GetDeletionTimestamp() != nil && !s.keepDeleting) {
		err = s.del(key)
	} else {
		err = s.set(obj)
	}
	if err != nil {
		return key, fmt.Errorf("%s: applying %s: %w", s.name, key, err)
	}
	return key, nil
}
