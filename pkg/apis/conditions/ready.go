// Package conditions holds the Ready condition every mizar kind carries beside
// status.phase, so `kubectl wait --for=condition=Ready` works on each of them.
package conditions

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// Ready is True exactly when the object's phase is Provisioned (for kinds
	// without a phase: when the object is usable as stored).
	Ready = "Ready"
	// ReasonProvisioned is Ready's reason while it is True.
	ReasonProvisioned = "Provisioned"
	// ReasonNoPhase is Ready's reason before any phase was written.
	ReasonNoPhase = "NoPhase"
)

// SetReady makes conds' Ready condition follow phase: True with reason
// Provisioned when provisioned, else False with the phase as its reason and, as
// its message, the first other condition that is False (the deepest cause a
// writer recorded), or the phase. It reports whether conds changed. The
// condition's lastTransitionTime moves only when its status does.
func SetReady(conds *[]metav1.Condition, generation int64, phase string, provisioned bool) bool {
	c := metav1.Condition{Type: Ready, Status: metav1.ConditionTrue, Reason: ReasonProvisioned, ObservedGeneration: generation}
	if provisioned {
		c.Message = "phase is " + phase
		if phase == "" {
			c.Message = "usable as stored"
		}
	} else {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, phase, "phase is "+phase
		if phase == "" {
			c.Reason, c.Message = ReasonNoPhase, "no phase written yet"
		}
		for _, o := range *conds {
			if o.Type != Ready && o.Status == metav1.ConditionFalse {
				c.Message = fmt.Sprintf("phase is %s; %s: %s", phase, o.Type, o.Message)
				break
			}
		}
	}
	return meta.SetStatusCondition(conds, c)
}

// Written reports whether a status write set Ready itself: its Ready differs
// from the stored one's (timestamps aside). A writer that words Ready itself
// (the broker's fulfillment operator does) owns it; SetReady is for the others.
func Written(conds, stored []metav1.Condition) bool {
	c := meta.FindStatusCondition(conds, Ready)
	if c == nil {
		return false
	}
	o := meta.FindStatusCondition(stored, Ready)
	return o == nil || c.Status != o.Status || c.Reason != o.Reason || c.Message != o.Message || c.ObservedGeneration != o.ObservedGeneration
}
