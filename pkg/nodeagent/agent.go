// Package nodeagent is the API side of mizar's node agent: it registers its
// Droplet, watches only its slice of the API (objects placed on its droplet,
// endpoints it hosts, endpoints of the subnets it bounces for, subnets of the
// VPCs it divides for and their endpoints), drives a Dataplane with them, and
// publishes what it has applied: Provisioned for its droplet, dividers and
// bouncers, and a watermark per endpoint stream (status.appliedResourceVersion
// on its Droplet and Bouncers, one entry per subnet in a Divider's
// status.appliedResourceVersions), written only when it applied a version the
// Endpoint operator awaits and at most once per ack interval.
package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// Options configure an agent.
type Options struct {
	// Client reaches mizar-apiserver as this droplet's identity.
	Client versioned.Interface
	// Droplet is the droplet to register: its name and spec.
	Droplet *v1alpha1.Droplet
	// Dataplane programs the node.
	Dataplane Dataplane
	// AckInterval is the least time between two watermark writes of one stream:
	// what is applied meanwhile is acknowledged together. Default DefaultAckInterval.
	AckInterval time.Duration
	// OnProvisioned, if set, runs once the droplet is Provisioned (the node
	// agent installs the CNI conflist then); its error stops the agent.
	OnProvisioned func(context.Context) error
}

// DefaultAckInterval bounds an agent's watermark writes to 20 a second per
// stream while adding at most that much to an endpoint's provisioning.
const DefaultAckInterval = 50 * time.Millisecond

// Agent is one droplet's node agent.
type Agent struct {
	client versioned.Interface
	name   string
	spec   v1alpha1.DropletSpec
	// annotations the droplet publishes (its WireGuard key in encrypted mode)
	annotations map[string]string
	dp          Dataplane
	ack         time.Duration
	onProv      func(context.Context) error

	endpointEvents atomic.Int64
	otherEvents    atomic.Int64

	mu   sync.Mutex
	ctx  context.Context // Run's: sub-streams end with it
	subs map[string]*sub // "bouncer/<name>", "divider/<name>" -> its stream
	wg   sync.WaitGroup
}

type sub struct {
	uid    types.UID
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns an agent; Run starts it.
func New(o Options) (*Agent, error) {
	if o.Client == nil || o.Droplet == nil || o.Dataplane == nil || o.Droplet.Name == "" {
		return nil, errors.New("nodeagent: a client, a named droplet and a dataplane are required")
	}
	if o.AckInterval < 0 {
		return nil, fmt.Errorf("nodeagent: negative ack interval %v", o.AckInterval)
	}
	if o.AckInterval == 0 {
		o.AckInterval = DefaultAckInterval
	}
	return &Agent{client: o.Client, name: o.Droplet.Name, spec: o.Droplet.Spec, annotations: o.Droplet.Annotations, dp: o.Dataplane, ack: o.AckInterval, onProv: o.OnProvisioned, subs: map[string]*sub{}}, nil
}

// EndpointEvents is how many endpoint watch events the agent has received.
func (a *Agent) EndpointEvents() int64 { return a.endpointEvents.Load() }

// Run registers the droplet, attaches the programs, and follows the agent's
// slice of the API until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	a.mu.Lock()
	a.ctx = ctx
	a.mu.Unlock()
	if err := untilServed(ctx, "registering the droplet", func() error { return a.register(ctx) }); err != nil {
		return err
	}
	if err := a.dp.Attach(ctx); err != nil {
		return fmt.Errorf("attaching the dataplane: %w", err)
	}
	if err := untilServed(ctx, "marking the droplet Provisioned", func() error {
		return a.patchStatus(ctx, "droplet", a.name, "", map[string]any{"phase": v1alpha1.PhaseProvisioned})
	}); err != nil {
		return fmt.Errorf("marking droplet %s Provisioned: %w", a.name, err)
	}
	if a.onProv != nil {
		if err := a.onProv(ctx); err != nil {
			return fmt.Errorf("droplet %s is Provisioned, but: %w", a.name, err)
		}
	}
	onMe := fields.OneTermEqualSelector("spec.droplet", a.name).String()
	n := a.client.NetworkingV1alpha1()
	host := &stream[*v1alpha1.Endpoint]{
		name: "endpoints on " + a.name, selector: onMe,
		list:  lister(n.Endpoints(metav1.NamespaceAll).List, endpointItems),
		watch: n.Endpoints(metav1.NamespaceAll).Watch,
		set:   a.dp.SetHostEndpoint,
		del:   a.dp.DeleteHostEndpoint,
		synced: func(ctx context.Context, rv string) error {
			return a.patchStatus(ctx, "droplet", a.name, "", map[string]any{"appliedResourceVersion": rv})
		},
		awaited:     (*v1alpha1.Endpoint).AwaitsAcknowledgement,
		ackInterval: a.ack,
		events:      &a.endpointEvents,
	}
	bouncers := &stream[*v1alpha1.Bouncer]{
		name: "bouncers on " + a.name, selector: onMe,
		list:   lister(n.Bouncers().List, func(l *v1alpha1.BouncerList) []v1alpha1.Bouncer { return l.Items }),
		watch:  n.Bouncers().Watch,
		set:    a.startBouncer,
		del:    func(key string) error { return a.stop("bouncer/"+key, func() error { return a.dp.DeleteBouncer(key) }) },
		synced: func(context.Context, string) error { return nil },
		events: &a.otherEvents,
	}
	dividers := &stream[*v1alpha1.Divider]{
		name: "dividers on " + a.name, selector: onMe,
		list:   lister(n.Dividers().List, func(l *v1alpha1.DividerList) []v1alpha1.Divider { return l.Items }),
		watch:  n.Dividers().Watch,
		set:    a.startDivider,
		del:    func(key string) error { return a.stop("divider/"+key, func() error { return a.dp.DeleteDivider(key) }) },
		synced: func(context.Context, string) error { return nil },
		events: &a.otherEvents,
	}
	a.wg.Add(3)
	go func() { defer a.wg.Done(); host.run(ctx) }()
	go func() { defer a.wg.Done(); bouncers.run(ctx) }()
	go func() { defer a.wg.Done(); dividers.run(ctx) }()
	<-ctx.Done()
	a.wg.Wait()
	a.stopAll()
	return nil
}

// register creates the droplet, or brings an existing one's spec up to date.
func (a *Agent) register(ctx context.Context) error {
	c := a.client.NetworkingV1alpha1().Droplets()
	// Read first: a restarted agent's Create would be refused as a duplicate
	// underlay IP (its own droplet's claim) before it could be AlreadyExists.
	old, err := c.Get(ctx, a.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		d := &v1alpha1.Droplet{ObjectMeta: metav1.ObjectMeta{Name: a.name, Annotations: a.annotations}, Spec: a.spec}
		if _, err := c.Create(ctx, d, metav1.CreateOptions{}); err != nil {
			if apierrors.IsNotFound(err) {
				// Not the droplet: the resource itself, which the aggregator
				// does not serve yet (the APIService is still being discovered).
				err = notServedYet{err}
			}
			return fmt.Errorf("registering droplet %s: %w", a.name, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading droplet %s: %w", a.name, err)
	}
	stale := false
	for k, v := range a.annotations {
		stale = stale || old.Annotations[k] != v
	}
	if old.Spec == a.spec && !stale {
		return nil
	}
	old.Spec = a.spec
	if stale {
		old.Annotations = maps.Clone(old.Annotations)
		if old.Annotations == nil {
			old.Annotations = map[string]string{}
		}
		maps.Copy(old.Annotations, a.annotations)
	}
	if _, err := c.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating droplet %s: %w", a.name, err)
	}
	return nil
}

// startBouncer serves a bouncer placed here: it follows the endpoints of the
// bouncer's subnet and acknowledges them with the bouncer's watermark.
func (a *Agent) startBouncer(b *v1alpha1.Bouncer) error {
	if err := a.dp.SetBouncer(b); err != nil {
		return err
	}
	n := a.client.NetworkingV1alpha1()
	name := b.Name
	provisioned := false
	s := &stream[*v1alpha1.Endpoint]{
		name:     "endpoints of subnet " + b.Spec.Subnet + " for bouncer " + name,
		selector: fields.OneTermEqualSelector("spec.subnet", b.Spec.Subnet).String(),
		list:     lister(n.Endpoints(metav1.NamespaceAll).List, endpointItems),
		watch:    n.Endpoints(metav1.NamespaceAll).Watch,
		set:      func(ep *v1alpha1.Endpoint) error { return a.dp.SetBouncerEndpoint(name, ep) },
		del:      func(key string) error { return a.dp.DeleteBouncerEndpoint(name, key) },
		synced: func(ctx context.Context, rv string) error {
			st := map[string]any{"appliedResourceVersion": rv}
			if !provisioned {
				// It holds every endpoint of the subnet now: it serves.
				st["phase"] = v1alpha1.PhaseProvisioned
			}
			if err := a.patchStatus(ctx, "bouncer", name, a.name, st); err != nil {
				return err
			}
			provisioned = true
			return nil
		},
		awaited:     (*v1alpha1.Endpoint).AwaitsAcknowledgement,
		ackInterval: a.ack,
		events:      &a.endpointEvents,
	}
	a.start("bouncer/"+name, b.UID, s.run)
	return nil
}

// start runs a sub-stream for key unless one runs for the same object already.
func (a *Agent) start(key string, uid types.UID, run func(context.Context)) {
	a.mu.Lock()
	old := a.subs[key]
	a.mu.Unlock()
	if old != nil {
		if old.uid == uid {
			return
		}
		old.cancel()
		<-old.done
	}
	a.mu.Lock()
	ctx, cancel := context.WithCancel(a.ctx)
	s := &sub{uid: uid, cancel: cancel, done: make(chan struct{})}
	a.subs[key] = s
	a.mu.Unlock()
	go func() { defer close(s.done); run(ctx) }()
}

// stop ends key's sub-stream, then undoes it in the dataplane.
func (a *Agent) stop(key string, undo func() error) error {
	a.mu.Lock()
	s := a.subs[key]
	delete(a.subs, key)
	a.mu.Unlock()
	if s != nil {
		s.cancel()
		<-s.done
	}
	return undo()
}

// stopAll ends every sub-stream; Run calls it when its context ends.
func (a *Agent) stopAll() {
	a.mu.Lock()
	subs := a.subs
	a.subs = map[string]*sub{}
	a.mu.Unlock()
	for _, s := range subs {
		s.cancel()
		<-s.done
	}
}

// patchStatus writes status fields with one JSON patch. With placedOn set the
// patch first tests spec.droplet, so an agent never acknowledges for an object
// that was moved to another droplet meanwhile.
func (a *Agent) patchStatus(ctx context.Context, kind, name, placedOn string, st map[string]any) error {
	var ops []map[string]any
	if placedOn != "" {
		ops = append(ops, map[string]any{"op": "test", "path": "/spec/droplet", "value": placedOn})
	}
	for k, v := range st {
		ops = append(ops, map[string]any{"op": "add", "path": "/status/" + k, "value": v})
	}
	data, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: fieldManager}
	n := a.client.NetworkingV1alpha1()
	switch kind {
	case "droplet":
		_, err = n.Droplets().Patch(ctx, name, types.JSONPatchType, data, opts, "status")
	case "bouncer":
		_, err = n.Bouncers().Patch(ctx, name, types.JSONPatchType, data, opts, "status")
	case "divider":
		_, err = n.Dividers().Patch(ctx, name, types.JSONPatchType, data, opts, "status")
	default:
		return fmt.Errorf("patching %s: unknown kind %s", name, kind)
	}
	if apierrors.IsNotFound(err) || (placedOn != "" && apierrors.IsInvalid(err)) {
		return nil // gone, or moved to another droplet: nothing of ours to acknowledge
	}
	if err != nil {
		return fmt.Errorf("writing status of %s: %w", name, err)
	}
	return nil
}

// fieldManager names the agent in managedFields.
const fieldManager = "mizar-nodeagent"

// lister makes a stream's list from a typed client's List and the items of
// the list it returns.
func lister[T any, L interface{ GetResourceVersion() string }](list func(context.Context, metav1.ListOptions) (L, error),
	items func(L) []T) func(context.Context, metav1.ListOptions) ([]*T, string, error) {
	return func(ctx context.Context, o metav1.ListOptions) ([]*T, string, error) {
		l, err := list(ctx, o)
		if err != nil {
			return nil, "", err
		}
		return ptrs(items(l)), l.GetResourceVersion(), nil
	}
}

func endpointItems(l *v1alpha1.EndpointList) []v1alpha1.Endpoint { return l.Items }

func ptrs[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}
