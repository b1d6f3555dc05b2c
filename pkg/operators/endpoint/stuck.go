package endpoint

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/operators/phases"
)

// ReasonWaitingForAgent is the reason of the Warning Event on an endpoint
// that has waited StuckAfter for agents to apply it.
const ReasonWaitingForAgent = "WaitingForAgent"

// SetEvents makes the operator post a WaitingForAgent Event (and log a line)
// on an endpoint still waiting for agents stuckAfter after its wait began
// (phases.DefaultStuckAfter when 0), naming them. Call before Run.
func (o *EndpointOperator) SetEvents(events record.EventRecorder, stuckAfter time.Duration) {
	if stuckAfter == 0 {
		stuckAfter = phases.DefaultStuckAfter
	}
	o.events, o.stuckAfter = events, stuckAfter
}

// watchStuck arms the check of a wait just registered, once per endpoint.
func (o *EndpointOperator) watchStuck(key string) {
	if o.events == nil {
		return
	}
	o.stuckMu.Lock()
	defer o.stuckMu.Unlock()
	if o.stuck[key] {
		return
	}
	o.stuck[key] = true
	time.AfterFunc(o.stuckAfter, func() { o.checkStuck(key, o.stuckAfter) })
}

// checkStuck posts the Event while the endpoint still waits, and looks again
// after twice the time.
func (o *EndpointOperator) checkStuck(key string, after time.Duration) {
	agents, forSubnet, waiting := o.waits.pending(key)
	obj, exists, _ := o.endpoints.GetIndexer().GetByKey(key)
	ep, _ := obj.(*v1alpha1.Endpoint)
	if !waiting || !exists || ep == nil || (ep.Status.Phase == v1alpha1.PhaseProvisioned && ep.DeletionTimestamp == nil) {
		o.stuckMu.Lock()
		delete(o.stuck, key)
		o.stuckMu.Unlock()
		return
	}
	var who []string
	for _, a := range agents {
		who = append(who, o.describeAgent(a))
	}
	if forSubnet {
		who = append(who, fmt.Sprintf("a Provisioned bouncer of subnet %s", ep.Spec.Subnet))
	}
	what := "apply it"
	if ep.DeletionTimestamp != nil {
		what = "remove it"
	}
	msg := fmt.Sprintf("waiting %v for %s to %s: check that mizar-nodeagent runs on those droplets and reaches mizar-apiserver",
		after.Round(time.Second), strings.Join(who, ", "), what)
	klog.Background().WithName("endpoint-operator").Info("Endpoint waiting for agents", "endpoint", klog.KObj(ep), "agents", agents,
		"forSubnet", forSubnet, "waited", after.Round(time.Second))
	o.events.Event(phases.Reference("Endpoint", ep), corev1.EventTypeWarning, ReasonWaitingForAgent, msg)
	time.AfterFunc(after, func() { o.checkStuck(key, 2*after) })
}

// describeAgent turns a waiters agent ("droplet/n", "bouncer/b",
// "divider/d/subnet") into words naming the droplet that runs it.
func (o *EndpointOperator) describeAgent(a string) string {
	kind, rest, _ := strings.Cut(a, "/")
	switch kind {
	case "droplet":
		return "droplet " + rest + " (its host)"
	case "bouncer":
		if obj, ok, _ := o.bouncers.GetIndexer().GetByKey(rest); ok {
			return fmt.Sprintf("bouncer %s on droplet %s", rest, obj.(*v1alpha1.Bouncer).Spec.Droplet)
		}
		return "bouncer " + rest
	case "divider":
		name, _, _ := strings.Cut(rest, "/")
		if obj, ok, _ := o.dividers.GetIndexer().GetByKey(name); ok {
			return fmt.Sprintf("divider %s on droplet %s", name, obj.(*v1alpha1.Divider).Spec.Droplet)
		}
		return "divider " + name
	}
	return a
}
