package v1alpha1

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestAwaitsAcknowledgement(t *testing.T) {
	now := metav1.Now()
	for _, c := range []struct {
		name       string
		finalizers []string
		deleting   bool
		phase      Phase
		want       bool
	}{
		{"new, not yet followed by the operator", nil, false, "", false},
		{"followed, no phase yet", []string{OperatorFinalizer}, false, "", true},
		{"followed, Init", []string{OperatorFinalizer}, false, PhaseInit, true},
		{"Failed: it may recover once its droplet is back", []string{OperatorFinalizer}, false, PhaseFailed, true},
		{"Provisioned", []string{OperatorFinalizer}, false, PhaseProvisioned, false},
		{"Provisioned and being deleted", []string{"other", OperatorFinalizer}, true, PhaseProvisioned, true},
		{"finalizer gone: the final delete", []string{"other"}, true, PhaseProvisioned, false},
	} {
		ep := &Endpoint{ObjectMeta: metav1.ObjectMeta{Finalizers: c.finalizers}}
		ep.Status.Phase = c.phase
		if c.deleting {
			ep.DeletionTimestamp = &now
		}
		if got := ep.AwaitsAcknowledgement(); got != c.want {
			t.Errorf("%s: AwaitsAcknowledgement() = %v, want %v", c.name, got, c.want)
		}
	}
}
