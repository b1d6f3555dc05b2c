package endpoint

import (
	"context"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// listMove lists the departures of a moved endpoint from the droplets it
// left (v1alpha1.EndpointDepartedFromAnnotation, written by the API server
// with the move) once every relay of its subnet and VPC has applied the
// move, and clears the annotation. Listed earlier, a host that forgot what it
// learned could learn the former host again from a relay that still sent
// there. It returns the relays still to apply it (the endpoint waits for
// them) and whether it wrote the endpoint (its watch event brings it back).
func (o *EndpointOperator) listMove(ctx context.Context, key string, ep *v1alpha1.Endpoint, droplet *v1alpha1.Droplet) ([]string, bool, error) {
	from := v1alpha1.DepartedFrom(ep.Annotations)
	if len(from) == 0 {
		return nil, false, nil
	}
	// Relays only (the host is not asked), and only those that can still
	// answer: the deleting rule of notApplied.
	if w := o.notApplied(ep, droplet, true, true); len(w.agents) > 0 {
		return w.agents, false, nil
	}
	for _, d := range from {
		if d == ep.Spec.Droplet {
			continue // moved back before it was listed: learners are right about it
		}
		if err := o.recordDeparture(ctx, key, ep, d); err != nil {
			return nil, false, err
		}
	}
	ep = ep.DeepCopy()
	ep.Annotations[v1alpha1.EndpointDepartedFromAnnotation] = "" // the server's way to clear it
	if _, err := o.client.NetworkingV1alpha1().Endpoints(ep.Namespace).Update(ctx, ep, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		// A conflict: moved again meanwhile; the next try lists that too.
		return nil, false, fmt.Errorf("clearing the listed departures: %w", err)
	}
	return nil, true, nil
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
