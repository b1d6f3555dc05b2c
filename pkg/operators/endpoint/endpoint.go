// Package endpoint is the Endpoint operator: it moves an endpoint from Init to
// Provisioned once its host, every bouncer of its subnet and every divider of
// its VPC have applied it (a droplet that relays for none of the VPC sends
// cross-subnet packets through the dividers, so Provisioned must cover them for
// the first packets to be forwarded), marks it Failed when its droplet goes,
// and holds its deletion until they have removed it. Agents acknowledge with
// one watermark per watch stream (the resourceVersion up to which they applied
// it, on their Droplet and Bouncer status, per subnet on a Divider's), written
// only for versions the operator awaits
// (Endpoint.AwaitsAcknowledgement), so an endpoint costs no acknowledgement
// writes of its own; nothing polls. A watermark moving re-queues only the
// endpoints it covers (waiters).
package endpoint

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
	informers "mizar.dev/pkg/generated/informers/externalversions"
	listers "mizar.dev/pkg/generated/listers/networking/v1alpha1"
	"mizar.dev/pkg/operators/reconcile"
)

// Condition types and reasons the Endpoint operator writes.
const (
	ConditionApplied    = "Applied"
	ReasonApplied       = "AppliedByHostAndRelays"
	ReasonWaiting       = "WaitingForAgents"
	ReasonDropletGone   = "DropletNotFound"
	ReasonSubnetMissing = "SubnetNotFound"
	ReasonNoBouncer     = "NoProvisionedBouncer"

	pendingByDroplet = "pending.spec.droplet"
)

// EndpointOperator is the one writer of an endpoint's phase.
type EndpointOperator struct {
	client     versioned.Interface
	endpoints  cache.SharedIndexInformer
	droplets   listers.DropletLister
	subnets    listers.SubnetLister
	subnetInf  cache.SharedIndexInformer
	bouncers   cache.SharedIndexInformer
	dividers   cache.SharedIndexInformer
	loop       *reconcile.Loop
	waits      *waiters
	departures *departureLog

	// Events about endpoints stuck waiting (stuck.go); nil: none.
	events     record.EventRecorder
	stuckAfter time.Duration
	stuckMu    sync.Mutex
	stuck      map[string]bool // endpoints whose wait is being watched
}

// pending reports whether an endpoint may still change phase.
func pending(ep *v1alpha1.Endpoint) bool {
	return ep.DeletionTimestamp != nil || ep.Status.Phase != v1alpha1.PhaseProvisioned
}

// New wires the operator to shared informers; call before the factory starts.
func New(client versioned.Interface, f informers.SharedInformerFactory) (*EndpointOperator, error) {
	n := f.Networking().V1alpha1()
	o := &EndpointOperator{
		client:     client,
		endpoints:  n.Endpoints().Informer(),
		droplets:   n.Droplets().Lister(),
		subnets:    n.Subnets().Lister(),
		subnetInf:  n.Subnets().Informer(),
		bouncers:   n.Bouncers().Informer(),
		dividers:   n.Dividers().Informer(),
		waits:      newWaiters(),
		departures: newDepartureLog(client),
		stuck:      map[string]bool{},
	}
	o.loop = reconcile.New("endpoint-operator", o.Reconcile)
	for _, ix := range []struct {
		inf  cache.SharedIndexInformer
		name string
		fn   cache.IndexFunc
	}{
		// Only endpoints that may still change phase: a droplet appearing
		// re-queues those that failed for want of it.
		{o.endpoints, pendingByDroplet, func(obj any) ([]string, error) {
			if ep := obj.(*v1alpha1.Endpoint); pending(ep) {
				return []string{ep.Spec.Droplet}, nil
			}
			return nil, nil
		}},
		{o.endpoints, reconcile.ByDroplet, reconcile.EndpointByDroplet},
		{o.bouncers, reconcile.BySubnet, reconcile.BouncerBySubnet},
		{o.bouncers, reconcile.ByDroplet, reconcile.BouncerByDroplet},
		{o.dividers, reconcile.ByVPC, reconcile.DividerByVPC},
		{o.dividers, reconcile.ByDroplet, reconcile.DividerByDroplet},
		{o.subnetInf, reconcile.ByVPC, reconcile.SubnetByVPC},
	} {
		if err := reconcile.AddIndex(ix.inf, ix.name, ix.fn); err != nil {
			return nil, err
		}
	}
	if _, err := o.endpoints.AddEventHandler(o.loop.Handler()); err != nil {
		return nil, err
	}
	if _, err := o.bouncers.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { o.bouncerChanged(obj.(*v1alpha1.Bouncer), false) },
		UpdateFunc: func(old, obj any) {
			was, b := old.(*v1alpha1.Bouncer), obj.(*v1alpha1.Bouncer)
			if was.Spec == b.Spec && was.Status.Phase == b.Status.Phase && was.DeletionTimestamp.Equal(b.DeletionTimestamp) {
				o.enqueue(o.waits.covered(bouncerAgent(b.Name), b.Status.AppliedResourceVersion))
				return
			}
			o.bouncerChanged(b, false)
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			o.bouncerChanged(obj.(*v1alpha1.Bouncer), true)
		},
	}); err != nil {
		return nil, err
	}
	if _, err := o.dividers.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { o.dividerChanged(obj.(*v1alpha1.Divider), false) },
		UpdateFunc: func(old, obj any) {
			was, d := old.(*v1alpha1.Divider), obj.(*v1alpha1.Divider)
			if was.Spec == d.Spec && was.Status.Phase == d.Status.Phase && was.DeletionTimestamp.Equal(d.DeletionTimestamp) {
				for _, w := range d.Status.AppliedResourceVersions {
					if was.Status.AppliedResourceVersion(w.Subnet) != w.ResourceVersion {
						o.enqueue(o.waits.covered(dividerAgent(d.Name, w.Subnet), w.ResourceVersion))
					}
				}
				return
			}
			o.dividerChanged(d, false)
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			o.dividerChanged(obj.(*v1alpha1.Divider), true)
		},
	}); err != nil {
		return nil, err
	}
	if _, err := n.Droplets().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			d := obj.(*v1alpha1.Droplet)
			o.enqueue(o.keys(pendingByDroplet, d.Name))
			o.enqueue(o.waits.covered(dropletAgent(d.Name), d.Status.AppliedResourceVersion))
		},
		UpdateFunc: func(_, obj any) {
			d := obj.(*v1alpha1.Droplet)
			if d.DeletionTimestamp != nil {
				o.dropletGoing(d.Name, false)
				return
			}
			o.enqueue(o.waits.covered(dropletAgent(d.Name), d.Status.AppliedResourceVersion))
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			o.dropletGoing(obj.(*v1alpha1.Droplet).Name, true)
		},
	}); err != nil {
		return nil, err
	}
	return o, nil
}

func (o *EndpointOperator) enqueue(keys []string) {
	for _, k := range keys {
		o.loop.Queue.Add(k)
	}
}

// keys returns the keys of the endpoints under one index value.
func (o *EndpointOperator) keys(index, value string) []string {
	keys, err := o.endpoints.GetIndexer().IndexKeys(index, value)
	if err != nil {
		panic(fmt.Sprintf("index %s: %v", index, err)) // only an unknown index fails
	}
	return keys
}

// bouncerChanged re-queues whoever may wait for a bouncer that came, went,
// moved or changed phase: who an endpoint waits for is decided again.
func (o *EndpointOperator) bouncerChanged(b *v1alpha1.Bouncer, gone bool) {
	o.enqueue(o.waits.changed(bouncerAgent(b.Name), gone))
	o.enqueue(o.waits.subnetWaiters(b.Spec.Subnet))
}

// dividerChanged re-queues whoever waits for a divider that came, went, moved
// or changed phase. The divider is awaited per subnet of its VPC.
func (o *EndpointOperator) dividerChanged(d *v1alpha1.Divider, gone bool) {
	subnets := map[string]bool{}
	for _, s := range reconcile.ByIndex[*v1alpha1.Subnet](o.subnetInf, reconcile.ByVPC, d.Spec.VPC) {
		subnets[s.Name] = true
	}
	for _, w := range d.Status.AppliedResourceVersions {
		subnets[w.Subnet] = true
	}
	for s := range subnets {
		o.enqueue(o.waits.changed(dividerAgent(d.Name, s), gone))
	}
}

// dropletGoing re-queues every endpoint on a droplet being deleted (they fail)
// and whoever waits for a bouncer on it (a deleting endpoint no longer does).
func (o *EndpointOperator) dropletGoing(name string, gone bool) {
	o.enqueue(o.keys(reconcile.ByDroplet, name))
	o.enqueue(o.waits.changed(dropletAgent(name), gone))
	for _, b := range reconcile.ByIndex[*v1alpha1.Bouncer](o.bouncers, reconcile.ByDroplet, name) {
		o.enqueue(o.waits.changed(bouncerAgent(b.Name), false))
	}
	for _, d := range reconcile.ByIndex[*v1alpha1.Divider](o.dividers, reconcile.ByDroplet, name) {
		o.dividerChanged(d, false)
	}
}

// watermark is an agent's current watermark, from the informers' caches.
func (o *EndpointOperator) watermark(agent string) string {
	kind, name, _ := strings.Cut(agent, "/")
	switch kind {
	case "droplet":
		if d, err := o.droplets.Get(name); err == nil {
			return d.Status.AppliedResourceVersion
		}
		return ""
	case "divider":
		name, subnet, _ := strings.Cut(name, "/")
		if obj, ok, err := o.dividers.GetIndexer().GetByKey(name); err == nil && ok {
			return obj.(*v1alpha1.Divider).Status.AppliedResourceVersion(subnet)
		}
		return ""
	}
	if obj, ok, err := o.bouncers.GetIndexer().GetByKey(name); err == nil && ok {
		return obj.(*v1alpha1.Bouncer).Status.AppliedResourceVersion
	}
	return ""
}

// Run reconciles until ctx ends.
func (o *EndpointOperator) Run(ctx context.Context, workers int) { o.loop.Run(ctx, workers) }

// Applied reports whether a watermark covers resourceVersion rv. mizar-apiserver's
// resourceVersions are its own etcd's revisions, so they are ordered integers.
func Applied(watermark, rv string) bool {
	w, err1 := strconv.ParseUint(watermark, 10, 64)
	r, err2 := strconv.ParseUint(rv, 10, 64)
	return err1 == nil && err2 == nil && w >= r
}

// Reconcile brings one endpoint ("namespace/name") towards Provisioned or gone.
func (o *EndpointOperator) Reconcile(ctx context.Context, key string) error {
	obj, ok, err := o.endpoints.GetIndexer().GetByKey(key)
	if err != nil || !ok {
		o.waits.forget(key)
		return err
	}
	ep := obj.(*v1alpha1.Endpoint)
	c := o.client.NetworkingV1alpha1().Endpoints(ep.Namespace)
	droplet, err := o.droplets.Get(ep.Spec.Droplet)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	hostGone := droplet == nil || droplet.DeletionTimestamp != nil

	if ep.DeletionTimestamp != nil {
		if !reconcile.HasFinalizer(ep) {
			o.waits.forget(key)
			return nil
		}
		// The endpoint leaves its host and relays before it goes: the update that
		// set deletionTimestamp is in their streams, so their watermarks pass it.
		if w := o.notApplied(ep, droplet, hostGone, true); len(w.agents) > 0 {
			o.await(key, ep, w)
			return nil
		}
		o.waits.forget(key)
		// Hosts that only learned where it lives forget it now that no
		// relay vouches for it any more (departure.go), and where it lived
		// before a move not listed yet.
		for _, d := range append(v1alpha1.DepartedFrom(ep.Annotations), ep.Spec.Droplet) {
			if err := o.recordDeparture(ctx, key, ep, d); err != nil {
				return err
			}
		}
		ep = ep.DeepCopy()
		ep.Finalizers = reconcile.WithoutFinalizer(ep)
		if _, err := c.Update(ctx, ep, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("removing the finalizer: %w", err)
		}
		return nil
	}
	if !reconcile.HasFinalizer(ep) {
		// Agents acknowledge only versions with the finalizer (AwaitsAcknowledgement):
		// the one this update makes is the first the operator waits for. A server
		// running the operators creates endpoints holding it; this is for the rest.
		ep = ep.DeepCopy()
		ep.Finalizers = append(ep.Finalizers, reconcile.Finalizer)
		if _, err = c.Update(ctx, ep, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("adding the finalizer: %w", err)
		}
		return nil // its watch event queues the endpoint again
	}

	moveWait, wrote, err := o.listMove(ctx, key, ep, droplet)
	if err != nil || wrote {
		return err
	}

	st := ep.Status.DeepCopy()
	if st.Phase == "" {
		st.Phase = v1alpha1.PhaseInit
	}
	waitFor := waiting{}
	switch {
	case hostGone:
		st.Phase = v1alpha1.PhaseFailed
		reconcile.SetCondition(&st.Conditions, ep.Generation, ConditionApplied, false, ReasonDropletGone,
			fmt.Sprintf("droplet %s does not exist: the pod's node is gone; delete this endpoint (its pod is recreated elsewhere)", ep.Spec.Droplet))
	case st.Phase == v1alpha1.PhaseProvisioned:
		// Provisioned is written once; later bouncers learn it from their own list.
	default:
		if _, err := o.subnets.Get(ep.Spec.Subnet); err != nil {
			reconcile.SetCondition(&st.Conditions, ep.Generation, ConditionApplied, false, ReasonSubnetMissing,
				fmt.Sprintf("subnet %s does not exist: create it or delete this endpoint", ep.Spec.Subnet))
			waitFor.forSubnet = true
			break
		}
		waitFor = o.notApplied(ep, droplet, false, false)
		if len(waitFor.agents) == 0 && !waitFor.forSubnet {
			st.Phase = v1alpha1.PhaseProvisioned
			reconcile.SetCondition(&st.Conditions, ep.Generation, ConditionApplied, true, ReasonApplied,
				"applied by its host, every bouncer of its subnet and every divider of its VPC")
			break
		}
		// The message names no agent: a write whenever another one catches up
		// would move the endpoint's resourceVersion past every watermark again.
		if waitFor.forSubnet {
			reconcile.SetCondition(&st.Conditions, ep.Generation, ConditionApplied, false, ReasonNoBouncer,
				fmt.Sprintf("subnet %s has no Provisioned bouncer yet", ep.Spec.Subnet))
			break
		}
		// The ordinary wait writes nothing (every write would move the endpoint
		// past the watermarks once more) unless an older condition must be replaced.
		if condition := meta.FindStatusCondition(st.Conditions, ConditionApplied); condition != nil {
			reconcile.SetCondition(&st.Conditions, ep.Generation, ConditionApplied, false, ReasonWaiting,
				fmt.Sprintf("waiting for droplet %s, the bouncers of subnet %s and the dividers of its VPC to apply it", ep.Spec.Droplet, ep.Spec.Subnet))
		}
	}
	if reconcile.SameProvisioning(&ep.Status.ProvisioningStatus, &st.ProvisioningStatus) {
		for _, a := range moveWait {
			if !slices.Contains(waitFor.agents, a) {
				waitFor.agents = append(waitFor.agents, a)
			}
		}
		o.await(key, ep, waitFor)
		return nil
	}
	// A status write makes a new version: its own watch event brings the
	// endpoint back, and that Reconcile registers the wait for it.
	o.waits.forget(key)
	st.ObservedGeneration = ep.Generation
	ep = ep.DeepCopy()
	ep.Status = *st
	if _, err := c.UpdateStatus(ctx, ep, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("writing status: %w", err)
	}
	return nil
}

// waiting is what an endpoint's current version waits for: agents (droplet/x,
// bouncer/y, divider/z/<subnet>) whose watermarks do not cover it, and its subnet or the subnet's
// first Provisioned bouncer.
type waiting struct {
	agents    []string
	forSubnet bool
}

// await registers the wait, or re-queues the endpoint at once if the
// watermarks moved meanwhile; a wait for nothing is forgotten.
func (o *EndpointOperator) await(key string, ep *v1alpha1.Endpoint, w waiting) {
	if len(w.agents) == 0 && !w.forSubnet {
		o.waits.forget(key)
		return
	}
	if o.waits.wait(key, ep.ResourceVersion, w.agents, ep.Spec.Subnet, w.forSubnet, o.watermark) {
		o.loop.Queue.Add(key)
		return
	}
	o.watchStuck(key)
}

// notApplied says who has not yet applied the endpoint's current version. On
// deletion, agents that are gone or never started cannot hold it back. Only
// Provisioned bouncers and dividers are awaited: one that is not serving yet
// writes Provisioned only after listing every endpoint it relays for.
func (o *EndpointOperator) notApplied(ep *v1alpha1.Endpoint, droplet *v1alpha1.Droplet, hostGone, deleting bool) waiting {
	var w waiting
	rv := ep.ResourceVersion
	if !hostGone && !Applied(droplet.Status.AppliedResourceVersion, rv) {
		w.agents = append(w.agents, dropletAgent(ep.Spec.Droplet))
	}
	live := 0
	for _, b := range reconcile.ByIndex[*v1alpha1.Bouncer](o.bouncers, reconcile.BySubnet, ep.Spec.Subnet) {
		if !o.serving(b.DeletionTimestamp, b.Spec.Droplet, b.Status.Phase, deleting) {
			continue
		}
		live++
		if !Applied(b.Status.AppliedResourceVersion, rv) {
			w.agents = append(w.agents, bouncerAgent(b.Name))
		}
	}
	w.forSubnet = live == 0 && !deleting
	s, err := o.subnets.Get(ep.Spec.Subnet)
	if err != nil {
		return w // no subnet, no VPC: no divider to wait for (Reconcile says why it waits)
	}
	for _, d := range reconcile.ByIndex[*v1alpha1.Divider](o.dividers, reconcile.ByVPC, s.Spec.VPC) {
		if !o.serving(d.DeletionTimestamp, d.Spec.Droplet, d.Status.Phase, deleting) {
			continue
		}
		if !Applied(d.Status.AppliedResourceVersion(ep.Spec.Subnet), rv) {
			w.agents = append(w.agents, dividerAgent(d.Name, ep.Spec.Subnet))
		}
	}
	return w
}

// serving reports whether a bouncer or divider counts among those an endpoint
// waits for: it is Provisioned and not going and, for a deleting endpoint,
// its droplet is not going either (nobody would ever acknowledge for it).
func (o *EndpointOperator) serving(deletion *metav1.Time, droplet string, phase v1alpha1.Phase, deleting bool) bool {
	if deletion != nil || droplet == "" || phase != v1alpha1.PhaseProvisioned {
		return false
	}
	if deleting {
		d, err := o.droplets.Get(droplet)
		return err == nil && d.DeletionTimestamp == nil
	}
	return true
}
