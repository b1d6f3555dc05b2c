package serviceinstance

import (
	"testing"

	"mizar.dev/pkg/apis/broker"
)

func TestStepSummary(t *testing.T) {
	steps := func(states ...broker.StepState) *broker.ServiceInstanceStatus {
		st := &broker.ServiceInstanceStatus{}
		for i, s := range states {
			st.Steps = append(st.Steps, broker.Step{Name: []string{"A", "B", "C", "D"}[i], State: s})
		}
		return st
	}
	failedB := steps(broker.StepCompensated, broker.StepCompensated, broker.StepPending, broker.StepPending)
	failedB.Steps[1].Message = "forbidden"
	for _, tc := range []struct {
		st   *broker.ServiceInstanceStatus
		want string
	}{
		{steps(), ""},
		{steps(broker.StepPending, broker.StepPending, broker.StepPending, broker.StepPending), "1/4 A"},
		{steps(broker.StepDone, broker.StepDone, broker.StepRunning, broker.StepPending), "3/4 C"},
		{steps(broker.StepDone, broker.StepDone, broker.StepDone, broker.StepDone), "4/4 D"},
		{steps(broker.StepDone, broker.StepCompensating, broker.StepCompensated, broker.StepFailed), "2/4 B"},
		{failedB, "2/4 B"},
		{steps(broker.StepCompensated, broker.StepCompensated, broker.StepCompensated, broker.StepPending), "1/4 A"},
	} {
		if got := StepSummary(tc.st); got != tc.want {
			t.Errorf("StepSummary(%+v) = %q, want %q", tc.st.Steps, got, tc.want)
		}
	}
}
