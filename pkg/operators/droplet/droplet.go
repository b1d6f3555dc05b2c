// Package droplet is the Droplet operator: it places every divider and bouncer on
// a Provisioned droplet (spec.droplet), spreading them, never putting two
// bouncers of one subnet (or two dividers of one VPC) on one droplet while
// another droplet is free of them, and re-places them when their droplet goes.
package droplet

import (
	"context"
	"fmt"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
	informers "mizar.dev/pkg/generated/informers/externalversions"
	listers "mizar.dev/pkg/generated/listers/networking/v1alpha1"
	"mizar.dev/pkg/operators/reconcile"
)

// Condition type and reasons the Droplet operator writes on dividers and bouncers.
const (
	ConditionPlaced          = "Placed"
	ReasonPlaced             = "Placed"
	ReasonNoDroplet          = "NoProvisionedDroplet"
	ReasonReplaced           = "DropletGone"
	dividerKey, bouncerKey   = "divider/", "bouncer/"
	dropletKey               = "droplet/"
	noDropletMessage         = "no Provisioned droplet to place on: start mizar-nodeagent on a node (or wait for its droplet to become Provisioned)"
	placedMessage            = "placed on droplet %s"
	replacedMessage          = "droplet %s is gone; placed on droplet %s"
	unplacedMessageAfterGone = "droplet %s is gone and " + noDropletMessage
)

// DropletOperator is the one writer of spec.droplet of dividers and bouncers.
type DropletOperator struct {
	client   versioned.Interface
	droplets listers.DropletLister
	dividers cache.SharedIndexInformer
	bouncers cache.SharedIndexInformer
	loop     *reconcile.Loop

	// assumed placements not yet seen by the informers, so back-to-back
	// placements spread instead of piling onto the same least-loaded droplet.
	mu      sync.Mutex
	assumed map[string]string
}

// New wires the operator to shared informers; call before the factory starts.
func New(client versioned.Interface, f informers.SharedInformerFactory) (*DropletOperator, error) {
	n := f.Networking().V1alpha1()
	o := &DropletOperator{
		client:   client,
		droplets: n.Droplets().Lister(),
		dividers: n.Dividers().Informer(),
		bouncers: n.Bouncers().Informer(),
		assumed:  map[string]string{},
	}
	o.loop = reconcile.New("droplet-operator", o.Reconcile)
	if err := reconcile.AddIndex(o.dividers, reconcile.ByDroplet, reconcile.DividerByDroplet); err != nil {
		return nil, err
	}
	if err := reconcile.AddIndex(o.bouncers, reconcile.ByDroplet, reconcile.BouncerByDroplet); err != nil {
		return nil, err
	}
	if _, err := o.dividers.AddEventHandler(o.loop.MapHandler(func(obj any) []string {
		return []string{dividerKey + obj.(*v1alpha1.Divider).Name}
	})); err != nil {
		return nil, err
	}
	if _, err := o.bouncers.AddEventHandler(o.loop.MapHandler(func(obj any) []string {
		return []string{bouncerKey + obj.(*v1alpha1.Bouncer).Name}
	})); err != nil {
		return nil, err
	}
	// A droplet that comes, becomes Provisioned or goes: place what waits for
	// one, and move what was on it.
	if _, err := n.Droplets().Informer().AddEventHandler(o.loop.MapHandler(func(obj any) []string {
		keys := []string{dropletKey + obj.(*v1alpha1.Droplet).Name}
		for _, droplet := range []string{"", obj.(*v1alpha1.Droplet).Name} {
			for _, d := range reconcile.ByIndex[*v1alpha1.Divider](o.dividers, reconcile.ByDroplet, droplet) {
				keys = append(keys, dividerKey+d.Name)
			}
			for _, b := range reconcile.ByIndex[*v1alpha1.Bouncer](o.bouncers, reconcile.ByDroplet, droplet) {
				keys = append(keys, bouncerKey+b.Name)
			}
		}
		return keys
	})); err != nil {
		return nil, err
	}
	// An endpoint gone may be the last one a deleting droplet waits for.
	if _, err := n.Endpoints().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if ep, ok := obj.(*v1alpha1.Endpoint); ok && ep.Spec.Droplet != "" {
				o.loop.Queue.Add(dropletKey + ep.Spec.Droplet)
			}
		},
	}); err != nil {
		return nil, err
	}
	return o, nil
}

// Run places until ctx ends. One worker: placements are decided one at a time
// so each sees the ones before it.
func (o *DropletOperator) Run(ctx context.Context, _ int) { o.loop.Run(ctx, 1) }

// Reconcile places one divider ("divider/<name>") or bouncer ("bouncer/<name>").
func (o *DropletOperator) Reconcile(ctx context.Context, key string) error {
	switch {
	case strings.HasPrefix(key, dropletKey):
		return o.reconcileDroplet(ctx, strings.TrimPrefix(key, dropletKey))
	case strings.HasPrefix(key, dividerKey):
		obj, ok, err := o.dividers.GetIndexer().GetByKey(strings.TrimPrefix(key, dividerKey))
		if err != nil || !ok {
			return err
		}
		d := obj.(*v1alpha1.Divider)
		if d.DeletionTimestamp != nil || o.hasLiveDroplet(d.Spec.Droplet) {
			return nil
		}
		target, cond := o.pick(key, d.Spec.Droplet, func(droplet string) bool {
			for _, x := range reconcile.ByIndex[*v1alpha1.Divider](o.dividers, reconcile.ByDroplet, droplet) {
				if x.Spec.VPC == d.Spec.VPC && x.Name != d.Name {
					return true
				}
			}
			return false
		})
		c := o.client.NetworkingV1alpha1().Dividers()
		// Status first: the divider reads Init, with no watermarks of the old
		// droplet's agent, before it names its new droplet.
		st := d.Status.DeepCopy()
		resetStatus(&st.ProvisioningStatus, d.Generation, cond, target != "")
		if target != "" {
			st.AppliedResourceVersions = nil
		}
		if !reconcile.SameProvisioning(&d.Status.ProvisioningStatus, &st.ProvisioningStatus) || len(st.AppliedResourceVersions) != len(d.Status.AppliedResourceVersions) {
			d = d.DeepCopy()
			d.Status = *st
			if d, err = c.UpdateStatus(ctx, d, metav1.UpdateOptions{}); err != nil {
				return placeErr(err, key)
			}
		}
		if target == "" {
			return nil
		}
		d = d.DeepCopy()
		d.Spec.Droplet = target
		if _, err = c.Update(ctx, d, metav1.UpdateOptions{}); err != nil {
			return placeErr(err, key)
		}
		o.assume(key, target)
		return nil
	case strings.HasPrefix(key, bouncerKey):
		obj, ok, err := o.bouncers.GetIndexer().GetByKey(strings.TrimPrefix(key, bouncerKey))
		if err != nil || !ok {
			return err
		}
		b := obj.(*v1alpha1.Bouncer)
		if b.DeletionTimestamp != nil || o.hasLiveDroplet(b.Spec.Droplet) {
			return nil
		}
		target, cond := o.pick(key, b.Spec.Droplet, func(droplet string) bool {
			for _, x := range reconcile.ByIndex[*v1alpha1.Bouncer](o.bouncers, reconcile.ByDroplet, droplet) {
				if x.Spec.Subnet == b.Spec.Subnet && x.Name != b.Name {
					return true
				}
			}
			return false
		})
		c := o.client.NetworkingV1alpha1().Bouncers()
		// Status first: the bouncer reads Init, with no watermark of the old
		// droplet's agent, before it names its new droplet.
		st := b.Status.DeepCopy()
		resetStatus(&st.ProvisioningStatus, b.Generation, cond, target != "")
		if target != "" {
			st.AppliedResourceVersion = ""
		}
		if !reconcile.SameProvisioning(&b.Status.ProvisioningStatus, &st.ProvisioningStatus) || st.AppliedResourceVersion != b.Status.AppliedResourceVersion {
			b = b.DeepCopy()
			b.Status = *st
			if b, err = c.UpdateStatus(ctx, b, metav1.UpdateOptions{}); err != nil {
				return placeErr(err, key)
			}
		}
		if target == "" {
			return nil
		}
		b = b.DeepCopy()
		b.Spec.Droplet = target
		if _, err = c.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
			return placeErr(err, key)
		}
		o.assume(key, target)
		return nil
	}
	return fmt.Errorf("unknown key %q", key)
}

func placeErr(err error, key string) error {
	if err == nil || apierrors.IsNotFound(err) {
		return nil
	}
	return fmt.Errorf("placing %s: %w", key, err)
}

// resetStatus records the placement outcome; a (re-)placed object starts over at
// Init because the agent of its new droplet has not programmed it yet.
func resetStatus(st *v1alpha1.ProvisioningStatus, generation int64, cond metav1.Condition, placed bool) {
	if placed || st.Phase == "" {
		st.Phase = v1alpha1.PhaseInit
	}
	reconcile.SetCondition(&st.Conditions, generation, ConditionPlaced, cond.Status == metav1.ConditionTrue, cond.Reason, cond.Message)
}

func (o *DropletOperator) hasLiveDroplet(name string) bool {
	if name == "" {
		return false
	}
	d, err := o.droplets.Get(name)
	return err == nil && d.DeletionTimestamp == nil
}

// pick chooses a Provisioned droplet: first one holding no sibling (same subnet
// or VPC), then the least loaded, then by name so the choice is reproducible.
func (o *DropletOperator) pick(key, old string, hasSibling func(droplet string) bool) (string, metav1.Condition) {
	all, _ := o.droplets.List(labels.Everything())
	best, bestSibling, bestLoad := "", true, 0
	for _, d := range all {
		if d.DeletionTimestamp != nil || d.Status.Phase != v1alpha1.PhaseProvisioned {
			continue
		}
		sib := hasSibling(d.Name) || o.assumedSibling(key, d.Name)
		load := len(reconcile.ByIndex[*v1alpha1.Divider](o.dividers, reconcile.ByDroplet, d.Name)) +
			len(reconcile.ByIndex[*v1alpha1.Bouncer](o.bouncers, reconcile.ByDroplet, d.Name)) + o.assumedOn(d.Name)
		better := best == "" ||
			(!sib && bestSibling) ||
			(sib == bestSibling && (load < bestLoad || (load == bestLoad && d.Name < best)))
		if better {
			best, bestSibling, bestLoad = d.Name, sib, load
		}
	}
	switch {
	case best == "" && old != "":
		return "", metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonNoDroplet, Message: fmt.Sprintf(unplacedMessageAfterGone, old)}
	case best == "":
		return "", metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonNoDroplet, Message: noDropletMessage}
	case old != "":
		return best, metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonReplaced, Message: fmt.Sprintf(replacedMessage, old, best)}
	}
	return best, metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonPlaced, Message: fmt.Sprintf(placedMessage, best)}
}

func (o *DropletOperator) assume(key, droplet string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.assumed[key] = droplet
}

// assumedOn counts placements on droplet that the informers have not shown yet,
// forgetting those they have.
func (o *DropletOperator) assumedOn(droplet string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for key, d := range o.assumed {
		if o.seen(key, d) {
			delete(o.assumed, key)
			continue
		}
		if d == droplet {
			n++
		}
	}
	return n
}

// assumedSibling reports an unseen placement of a sibling of key on droplet.
func (o *DropletOperator) assumedSibling(key, droplet string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	group := o.group(key)
	for k, d := range o.assumed {
		if k != key && d == droplet && !o.seen(k, d) && o.group(k) == group {
			return true
		}
	}
	return false
}

// seen reports whether the informer shows key placed on droplet (or gone).
func (o *DropletOperator) seen(key, droplet string) bool {
	inf, name := o.dividers, strings.TrimPrefix(key, dividerKey)
	if strings.HasPrefix(key, bouncerKey) {
		inf, name = o.bouncers, strings.TrimPrefix(key, bouncerKey)
	}
	obj, ok, _ := inf.GetIndexer().GetByKey(name)
	if !ok {
		return true
	}
	switch x := obj.(type) {
	case *v1alpha1.Divider:
		return x.Spec.Droplet == droplet
	case *v1alpha1.Bouncer:
		return x.Spec.Droplet == droplet
	}
	return true
}

// group is the sibling group of key: its VPC for a divider, its subnet for a bouncer.
func (o *DropletOperator) group(key string) string {
	if strings.HasPrefix(key, dividerKey) {
		if obj, ok, _ := o.dividers.GetIndexer().GetByKey(strings.TrimPrefix(key, dividerKey)); ok {
			return "vpc/" + obj.(*v1alpha1.Divider).Spec.VPC
		}
	} else if obj, ok, _ := o.bouncers.GetIndexer().GetByKey(strings.TrimPrefix(key, bouncerKey)); ok {
		return "subnet/" + obj.(*v1alpha1.Bouncer).Spec.Subnet
	}
	return key
}

// reconcileDroplet keeps the operators' finalizer on a droplet and, once the
// droplet is being deleted, lets it go only when no endpoint names it any more,
// as etcd says: an endpoint whose create the informer has not delivered yet
// still holds the droplet. New endpoints are refused from the moment it is
// marked (the registry writes an endpoint only if its droplet is unchanged).
func (o *DropletOperator) reconcileDroplet(ctx context.Context, name string) error {
	d, err := o.droplets.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	c := o.client.NetworkingV1alpha1().Droplets()
	if d.DeletionTimestamp == nil {
		if reconcile.HasFinalizer(d) {
			return nil
		}
		d = d.DeepCopy()
		d.Finalizers = append(d.Finalizers, reconcile.Finalizer)
		if _, err := c.Update(ctx, d, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("adding the finalizer of droplet %s: %w", name, err)
		}
		return nil
	}
	if !reconcile.HasFinalizer(d) {
		return nil
	}
	// A consistent read (no resourceVersion): not what the informer has seen.
	eps, err := o.client.NetworkingV1alpha1().Endpoints(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.droplet", name).String(), Limit: 1})
	if err != nil {
		return fmt.Errorf("listing the endpoints of deleting droplet %s: %w", name, err)
	}
	if len(eps.Items) > 0 {
		klog.InfoS("Deleting droplet waits for its endpoints", "droplet", name, "endpoint", klog.KObj(&eps.Items[0]))
		return nil // queued again when an endpoint goes
	}
	d = d.DeepCopy()
	d.Finalizers = reconcile.WithoutFinalizer(d)
	if _, err := c.Update(ctx, d, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing the finalizer of droplet %s: %w", name, err)
	}
	klog.InfoS("Deleted droplet drained", "droplet", name)
	return nil
}
