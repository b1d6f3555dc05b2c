package conditions

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSetReady(t *testing.T) {
	waiting := metav1.Condition{Type: "DividersReady", Status: metav1.ConditionFalse, Reason: "Waiting", Message: "0 of 1 dividers are Provisioned"}
	for name, tc := range map[string]struct {
		conds       []metav1.Condition
		phase       string
		provisioned bool
		status      metav1.ConditionStatus
		reason      string
		message     string
	}{
		"provisioned":          {nil, "Provisioned", true, metav1.ConditionTrue, ReasonProvisioned, "phase is Provisioned"},
		"init names the cause": {[]metav1.Condition{waiting}, "Init", false, metav1.ConditionFalse, "Init", "phase is Init; DividersReady: 0 of 1 dividers are Provisioned"},
		"failed":               {nil, "Failed", false, metav1.ConditionFalse, "Failed", "phase is Failed"},
		"no phase":             {nil, "", false, metav1.ConditionFalse, ReasonNoPhase, "no phase written yet"},
		"true causes ignored": {[]metav1.Condition{{Type: "Applied", Status: metav1.ConditionTrue, Reason: "Applied", Message: "ok"}},
			"Pending", false, metav1.ConditionFalse, "Pending", "phase is Pending"},
	} {
		t.Run(name, func(t *testing.T) {
			conds := append([]metav1.Condition(nil), tc.conds...)
			if !SetReady(&conds, 3, tc.phase, tc.provisioned) {
				t.Fatal("SetReady reported no change on a list without Ready")
			}
			c := meta.FindStatusCondition(conds, Ready)
			if c == nil || c.Status != tc.status || c.Reason != tc.reason || c.Message != tc.message || c.ObservedGeneration != 3 {
				t.Fatalf("Ready = %+v, want %s %s %q at generation 3", c, tc.status, tc.reason, tc.message)
			}
			if len(conds) != len(tc.conds)+1 {
				t.Errorf("conditions %v: want the others kept and one Ready added", conds)
			}
		})
	}
}

// TestSetReadyTransitions: the transition time moves only when the status flips,
// and an unchanged phase reports no change (no write on a reconcile that changes nothing).
func TestSetReadyTransitions(t *testing.T) {
	var conds []metav1.Condition
	SetReady(&conds, 1, "Init", false)
	past := metav1.NewTime(time.Now().Add(-time.Hour))
	conds[0].LastTransitionTime = past
	if SetReady(&conds, 1, "Init", false) {
		t.Error("the same phase again reported a change")
	}
	if !SetReady(&conds, 1, "Failed", false) || !conds[0].LastTransitionTime.Equal(&past) {
		t.Errorf("Init -> Failed: %+v, want the reason changed and the transition time kept", conds[0])
	}
	if !SetReady(&conds, 2, "Provisioned", true) || conds[0].Status != metav1.ConditionTrue || conds[0].LastTransitionTime.Equal(&past) {
		t.Errorf("Failed -> Provisioned: %+v, want True with a new transition time", conds[0])
	}
	if len(conds) != 1 {
		t.Errorf("%d conditions, want one Ready", len(conds))
	}
}

// TestWritten: a write that words Ready itself keeps it; one that copied the
// stored Ready (or has none) gets the derived one.
func TestWritten(t *testing.T) {
	var stored []metav1.Condition
	SetReady(&stored, 1, "Pending", false)
	same := append([]metav1.Condition(nil), stored...)
	same[0].LastTransitionTime = metav1.Now()
	own := []metav1.Condition{{Type: Ready, Status: metav1.ConditionFalse, Reason: "InstanceNotReady", Message: "instance db is Provisioning"}}
	for name, tc := range map[string]struct {
		conds []metav1.Condition
		want  bool
	}{
		"copied, timestamps aside": {same, false},
		"none":                     {nil, false},
		"its own wording":          {own, true},
	} {
		if got := Written(tc.conds, stored); got != tc.want {
			t.Errorf("%s: Written = %v, want %v", name, got, tc.want)
		}
	}
	if !Written(own, nil) {
		t.Error("a Ready written where none was stored is the writer's")
	}
}
