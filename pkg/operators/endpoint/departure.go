package endpoint

import (
	"context"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// Departures. A host that only learned where an endpoint lives (a relay's
// sending-host option, bpf/include/mizar.h) holds no API entry for it and
// follows no endpoint stream that would tell it of a move or a delete; every
// agent follows subnets, though. So the operator appends each departure (the
// endpoint's address and the droplet it left) to its subnet's
// status.departures, and every agent forgets what it learned about that
// address when the list grows (pkg/nodeagent, departures.go).

// moves remembers endpoints whose spec.droplet changed, as they were before
// the change, until their departure from the former droplet is recorded:
// the informer's update event is the only place the former droplet is seen.
type moves struct {
	mu   sync.Mutex
	from map[string]*v1alpha1.Endpoint // endpoint key -> before its first unrecorded move
}

func (m *moves) note(key string, was *v1alpha1.Endpoint) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.from == nil {
		m.from = map[string]*v1alpha1.Endpoint{}
	}
	if _, ok := m.from[key]; !ok {
		m.from[key] = was // moved twice before recorded: the first host is what others learned
	}
}

func (m *moves) pending(key string) *v1alpha1.Endpoint {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.from[key]
}

func (m *moves) done(key string, was *v1alpha1.Endpoint) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.from[key] == was {
		delete(m.from, key)
	}
}

// watchMoves queues a move for recordMove.
func (o *EndpointOperator) watchMoves() error {
	_, err := o.endpoints.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, cur any) {
			was, ep := old.(*v1alpha1.Endpoint), cur.(*v1alpha1.Endpoint)
			if was.Spec.Droplet != "" && was.Spec.Droplet != ep.Spec.Droplet {
				if key, err := cache.MetaNamespaceKeyFunc(ep); err == nil {
					o.moved.note(key, was)
					o.loop.Queue.Add(key)
				}
			}
		},
	})
	return err
}

// recordMove records the departure of a moved endpoint (now cur; nil once
// gone) from its former droplet, once.
func (o *EndpointOperator) recordMove(ctx context.Context, key string, cur *v1alpha1.Endpoint) error {
	was := o.moved.pending(key)
	if was == nil {
		return nil
	}
	if cur == nil || cur.Spec.Droplet != was.Spec.Droplet { // not moved back before this ran
		if err := o.recordDeparture(ctx, key, was, was.Spec.Droplet); err != nil {
			return err
		}
	}
	o.moved.done(key, was)
	return nil
}

// recordDeparture appends "ep left droplet" to its subnet's departures and
// returns once that is written. A departure recorded twice (a retry after a
// later step failed) only makes agents forget once more.
func (o *EndpointOperator) recordDeparture(ctx context.Context, key string, ep *v1alpha1.Endpoint, droplet string) error {
	if droplet == "" || ep.Spec.IP == "" {
		return nil // never placed: no host can have learned it
	}
	d := v1alpha1.EndpointDeparture{Endpoint: key, IP: ep.Spec.IP, Droplet: droplet}
	if err := o.departures.record(ctx, ep.Spec.Subnet, d); err != nil {
		return fmt.Errorf("recording the departure of %s (%s) from droplet %s in subnet %s: %w", key, ep.Spec.IP, droplet, ep.Spec.Subnet, err)
	}
	klog.V(2).InfoS("Recorded endpoint departure", "endpoint", key, "ip", ep.Spec.IP, "droplet", droplet, "subnet", ep.Spec.Subnet)
	return nil
}

// departureLog writes departures, one subnet status write for all those
// that wait on a subnet (group commit): the operator's workers deleting a
// namespace's endpoints of one subnet would otherwise all write the same
// object at once and mostly conflict.
type departureLog struct {
	client versioned.Interface

	mu      sync.Mutex
	pending map[string][]departureWait // subnet -> waiting to be written
	writing map[string]bool            // a writer is at work on the subnet
}

type departureWait struct {
	d    v1alpha1.EndpointDeparture
	done chan error
}

func newDepartureLog(client versioned.Interface) *departureLog {
	return &departureLog{client: client, pending: map[string][]departureWait{}, writing: map[string]bool{}}
}

// record queues d and waits until it is written. The first caller for a
// subnet writes, in rounds, whatever has queued meanwhile.
func (l *departureLog) record(ctx context.Context, subnet string, d v1alpha1.EndpointDeparture) error {
	w := departureWait{d: d, done: make(chan error, 1)}
	l.mu.Lock()
	l.pending[subnet] = append(l.pending[subnet], w)
	if l.writing[subnet] {
		l.mu.Unlock()
		select {
		case err := <-w.done:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	l.writing[subnet] = true
	for len(l.pending[subnet]) > 0 {
		batch := l.pending[subnet]
		delete(l.pending, subnet)
		l.mu.Unlock()
		err := l.write(ctx, subnet, batch)
		for _, b := range batch {
			b.done <- err
		}
		l.mu.Lock()
	}
	delete(l.writing, subnet)
	l.mu.Unlock()
	return <-w.done
}

func (l *departureLog) write(ctx context.Context, subnet string, batch []departureWait) error {
	c := l.client.NetworkingV1alpha1().Subnets()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := c.Get(ctx, subnet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, b := range batch {
			s.Status.Departures = AppendDeparture(s.Status.Departures, b.d)
		}
		_, err = c.UpdateStatus(ctx, s, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil // subnet gone: agents forget everything learned in it (pkg/nodeagent, departures.go)
	}
	return err
}

// AppendDeparture returns deps with d appended under the next sequence
// number, keeping the newest MaxSubnetDepartures.
func AppendDeparture(deps []v1alpha1.EndpointDeparture, d v1alpha1.EndpointDeparture) []v1alpha1.EndpointDeparture {
	d.Sequence = 1
	if n := len(deps); n > 0 {
		d.Sequence = deps[n-1].Sequence + 1
	}
	deps = append(deps, d)
	if over := len(deps) - v1alpha1.MaxSubnetDepartures; over > 0 {
		deps = append([]v1alpha1.EndpointDeparture(nil), deps[over:]...)
	}
	return deps
}
