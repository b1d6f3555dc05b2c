// Package endpoint is the Endpoint operator: it moves an endpoint from Init to
// Provisioned once its host and every bouncer of its subnet have applied it, marks
// it Failed when its droplet goes, and holds its deletion until they have
// removed it. Agents acknowledge with one watermark per watch stream (the
// resourceVersion up to which they applied it, on their Droplet and Bouncer
// status), so an endpoint costs no acknowledgement writes of its own; nothing polls.
package endpoint

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
	informers "mizar.dev/pkg/generated/informers/externalversions"
	listers "mizar.dev/pkg/generated/listers/networking/v1alpha1"
	"mizar.dev/pkg/operators/reconcile"
)

// Condition types and reasons the Endpoint operator writes.
const (
	ConditionApplied    = "Applied"
	ReasonApplied       = "AppliedByHostAndBouncers"
	ReasonWaiting       = "WaitingForAgents"
	ReasonDropletGone   = "DropletNotFound"
	ReasonSubnetMissing = "SubnetNotFound"
	ReasonNoBouncer     = "NoProvisionedBouncer"

	pendingBySubnet  = "pending.spec.subnet"
	pendingByDroplet = "pending.spec.droplet"
)

// EndpointOperator is the one writer of an endpoint's phase.
type EndpointOperator struct {
	client    versioned.Interface
	endpoints cache.SharedIndexInformer
	droplets  listers.DropletLister
	subnets   listers.SubnetLister
	bouncers  cache.SharedIndexInformer
	loop      *reconcile.Loop

	// finalized remembers, per endpoint, the resourceVersion before and after the
	// operator added its finalizer: agents need not acknowledge that change, so
	// while the endpoint is unchanged since, the earlier version is the one to
	// wait for. Lost on restart, which only makes the wait one round longer.
	finalized sync.Map // key -> rvPair
}

type rvPair struct{ before, after string }

// pending reports whether an endpoint still waits for acknowledgements.
func pending(ep *v1alpha1.Endpoint) bool {
	return ep.DeletionTimestamp != nil || ep.Status.Phase != v1alpha1.PhaseProvisioned
}

// New wires the operator to shared informers; call before the factory starts.
func New(client versioned.Interface, f informers.SharedInformerFactory) (*EndpointOperator, error) {
	n := f.Networking().V1alpha1()
	o := &EndpointOperator{
		client:    client,
		endpoints: n.Endpoints().Informer(),
		droplets:  n.Droplets().Lister(),
		subnets:   n.Subnets().Lister(),
		bouncers:  n.Bouncers().Informer(),
	}
	o.loop = reconcile.New("endpoint-operator", o.Reconcile)
	// Only endpoints still waiting are indexed, so a watermark moving costs a
	// lookup of those, not a scan of a subnet's every endpoint.
	pendingIndex := func(field func(*v1alpha1.Endpoint) string) cache.IndexFunc {
		return func(obj any) ([]string, error) {
			ep := obj.(*v1alpha1.Endpoint)
			if !pending(ep) {
				return nil, nil
			}
			return []string{field(ep)}, nil
		}
	}
	for _, ix := range []struct {
		inf  cache.SharedIndexInformer
		name string
		fn   cache.IndexFunc
	}{
		{o.endpoints, pendingBySubnet, pendingIndex(func(ep *v1alpha1.Endpoint) string { return ep.Spec.Subnet })},
		{o.endpoints, pendingByDroplet, pendingIndex(func(ep *v1alpha1.Endpoint) string { return ep.Spec.Droplet })},
		{o.endpoints, reconcile.ByDroplet, reconcile.EndpointByDroplet},
		{o.bouncers, reconcile.BySubnet, reconcile.BouncerBySubnet},
	} {
		if err := reconcile.AddIndex(ix.inf, ix.name, ix.fn); err != nil {
			return nil, err
		}
	}
	if _, err := o.endpoints.AddEventHandler(o.loop.Handler()); err != nil {
		return nil, err
	}
	keys := func(index, value string) []string {
		var out []string
		for _, ep := range reconcile.ByIndex[*v1alpha1.Endpoint](o.endpoints, index, value) {
			out = append(out, ep.Namespace+"/"+ep.Name)
		}
		return out
	}
	if _, err := o.bouncers.AddEventHandler(o.loop.MapHandler(func(obj any) []string {
		return keys(pendingBySubnet, obj.(*v1alpha1.Bouncer).Spec.Subnet)
	})); err != nil {
		return nil, err
	}
	if _, err := n.Droplets().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			for _, k := range keys(pendingByDroplet, obj.(*v1alpha1.Droplet).Name) {
				o.loop.Queue.Add(k)
			}
		},
		UpdateFunc: func(_, obj any) {
			d := obj.(*v1alpha1.Droplet)
			index := pendingByDroplet
			if d.DeletionTimestamp != nil {
				index = reconcile.ByDroplet // every endpoint on it fails
			}
			for _, k := range keys(index, d.Name) {
				o.loop.Queue.Add(k)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			for _, k := range keys(reconcile.ByDroplet, obj.(*v1alpha1.Droplet).Name) {
				o.loop.Queue.Add(k)
			}
		},
	}); err != nil {
		return nil, err
	}
	return o, nil
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
		o.finalized.Delete(key)
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
			return nil
		}
		// The endpoint leaves its host and bouncers before it goes: the update that
		// set deletionTimestamp is in their streams, so their watermarks pass it.
		o.finalized.Delete(key)
		if waiting := o.notApplied(ep, ep.ResourceVersion, droplet, hostGone, true); len(waiting) > 0 {
			return nil // a watermark moving re-queues this endpoint
		}
		ep = ep.DeepCopy()
		ep.Finalizers = reconcile.WithoutFinalizer(ep)
		if _, err := c.Update(ctx, ep, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("removing the finalizer: %w", err)
		}
		return nil
	}
	if !reconcile.HasFinalizer(ep) {
		before := ep.ResourceVersion
		ep = ep.DeepCopy()
		ep.Finalizers = append(ep.Finalizers, reconcile.Finalizer)
		if ep, err = c.Update(ctx, ep, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("adding the finalizer: %w", err)
		}
		o.finalized.Store(key, rvPair{before: before, after: ep.ResourceVersion})
	}
	need := ep.ResourceVersion
	if p, ok := o.finalized.Load(key); ok && p.(rvPair).after == need {
		need = p.(rvPair).before
	}

	st := ep.Status.DeepCopy()
	if st.Phase == "" {
		st.Phase = v1alpha1.PhaseInit
	}
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
			break
		}
		waiting := o.notApplied(ep, need, droplet, false, false)
		if len(waiting) == 0 {
			st.Phase = v1alpha1.PhaseProvisioned
			reconcile.SetCondition(&st.Conditions, ep.Generation, ConditionApplied, true, ReasonApplied,
				"applied by its host and every bouncer of its subnet")
			break
		}
		// The message names no agent: a write whenever another one catches up
		// would move the endpoint's resourceVersion past every watermark again.
		if waiting[0] == noBouncer {
			reconcile.SetCondition(&st.Conditions, ep.Generation, ConditionApplied, false, ReasonNoBouncer,
				fmt.Sprintf("subnet %s has no Provisioned bouncer yet", ep.Spec.Subnet))
			break
		}
		// The ordinary wait writes nothing (every write would move the endpoint
		// past the watermarks once more) unless an older condition must be replaced.
		if condition := meta.FindStatusCondition(st.Conditions, ConditionApplied); condition != nil {
			reconcile.SetCondition(&st.Conditions, ep.Generation, ConditionApplied, false, ReasonWaiting,
				fmt.Sprintf("waiting for droplet %s and the bouncers of subnet %s to apply it", ep.Spec.Droplet, ep.Spec.Subnet))
		}
	}
	if reconcile.SameProvisioning(&ep.Status.ProvisioningStatus, &st.ProvisioningStatus) {
		return nil
	}
	st.ObservedGeneration = ep.Generation
	if st.Phase != v1alpha1.PhaseInit {
		o.finalized.Delete(key)
	}
	ep = ep.DeepCopy()
	ep.Status = *st
	if _, err := c.UpdateStatus(ctx, ep, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("writing status: %w", err)
	}
	return nil
}

const noBouncer = "a Provisioned bouncer of the subnet"

// notApplied lists who has not yet applied the endpoint's current version. On
// deletion, agents that are gone or never started cannot hold it back.
func (o *EndpointOperator) notApplied(ep *v1alpha1.Endpoint, rv string, droplet *v1alpha1.Droplet, hostGone, deleting bool) []string {
	var waiting []string
	if !hostGone && !Applied(droplet.Status.AppliedResourceVersion, rv) {
		waiting = append(waiting, "the agent of droplet "+ep.Spec.Droplet)
	}
	live := 0
	for _, b := range reconcile.ByIndex[*v1alpha1.Bouncer](o.bouncers, reconcile.BySubnet, ep.Spec.Subnet) {
		if b.DeletionTimestamp != nil || b.Spec.Droplet == "" {
			continue
		}
		if deleting {
			if d, err := o.droplets.Get(b.Spec.Droplet); err != nil || d.DeletionTimestamp != nil || b.Status.Phase != v1alpha1.PhaseProvisioned {
				continue
			}
		} else if b.Status.Phase != v1alpha1.PhaseProvisioned {
			continue
		}
		live++
		if !Applied(b.Status.AppliedResourceVersion, rv) {
			waiting = append(waiting, "bouncer "+b.Name+" on droplet "+b.Spec.Droplet)
		}
	}
	if live == 0 && !deleting {
		waiting = append([]string{noBouncer}, waiting...)
	}
	sort.Strings(waiting[min(1, len(waiting)):])
	return waiting
}
