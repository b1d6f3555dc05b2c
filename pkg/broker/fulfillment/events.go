package fulfillment

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	brokerv1 "mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/broker/saga"
)

// Reasons of the Events an order gets from its saga.
const (
	ReasonStepRetrying  = "StepRetrying"
	ReasonStepFailed    = "StepFailed"
	ReasonStepNotUndone = "StepNotUndone"
)

// stepOutcome logs one step outcome of an order and posts the Event an
// operator would want on it: a retry, a failure, something left behind.
func (c *Controller) stepOutcome(ctx context.Context, in *brokerv1.ServiceInstance, o saga.StepOutcome) {
	logger := klog.FromContext(ctx).WithName("saga").WithValues("order", klog.KObj(in), "step", o.Step,
		"index", fmt.Sprintf("%d/%d", o.Index+1, o.Of), "outcome", o.Outcome, "attempts", o.Attempts)
	step := fmt.Sprintf("step %d of %d (%s)", o.Index+1, o.Of, o.Step)
	var reason, msg string
	switch o.Outcome {
	case saga.OutcomeRetrying, saga.OutcomeUndoRetry:
		logger.Info("Saga step failed, retrying", "err", o.Err, "retryIn", o.RetryIn)
		what := ""
		if o.Outcome == saga.OutcomeUndoRetry {
			what = "undoing "
		}
		reason, msg = ReasonStepRetrying, fmt.Sprintf("%s%s: attempt %d failed, retrying in %v: %v", what, step, o.Attempts, o.RetryIn.Round(1e6), o.Err)
	case saga.OutcomeFailed, saga.OutcomeDeadlineHit:
		logger.Error(o.Err, "Saga step failed; undoing the order")
		reason, msg = ReasonStepFailed, fmt.Sprintf("%s failed, undoing the order: %v", step, o.Err)
	case saga.OutcomeNotUndone:
		logger.Error(o.Err, "Saga step could not be undone; left behind")
		reason, msg = ReasonStepNotUndone, fmt.Sprintf("%s could not be undone and was left behind: %v", step, o.Err)
	case saga.OutcomeWaiting:
		logger.V(2).Info("Saga step waiting", "for", o.Err)
		return
	default:
		logger.V(1).Info("Saga step finished")
		return
	}
	if c.Events != nil {
		ref := &corev1.ObjectReference{APIVersion: brokerv1.SchemeGroupVersion.String(), Kind: "ServiceInstance",
			Namespace: in.Namespace, Name: in.Name, UID: in.UID}
		c.Events.Event(ref, corev1.EventTypeWarning, reason, msg)
	}
}
