package fulfillment

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	brokerv1 "mizar.dev/pkg/apis/broker/v1alpha1"
	networkingv1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/broker/saga"
)

// Finalizer holds a deleted order until what it made is gone.
const Finalizer = "broker.mizar.dev/fulfillment"

// Step names, in order, as status.steps and kubectl show them.
const (
	StepValidating  = "ValidatingOrder"
	StepSubnet      = "WaitingForSubnet"
	StepSecret      = "CreatingSecret"
	StepService     = "CreatingService"
	StepStatefulSet = "CreatingStatefulSet"
	StepReplicas    = "WaitingForReplicas"
)

// ConditionReady is the order's summary condition.
const ConditionReady = "Ready"

// steps builds the saga of one order. The class is read inside the first step
// so a missing class or plan fails the order like any other permanent error.
func (c *Controller) steps(in *brokerv1.ServiceInstance) []saga.Step {
	var (
		class *brokerv1.ServiceClass
		plan  *brokerv1.ServicePlan
	)
	loadPlan := func() error {
		if plan != nil {
			return nil
		}
		cl, err := c.classes.Get(in.Spec.Class)
		if apierrors.IsNotFound(err) {
			return saga.Permanent(fmt.Errorf("service class %q does not exist", in.Spec.Class))
		}
		if err != nil {
			return fmt.Errorf("reading service class %q: %w", in.Spec.Class, err)
		}
		for i := range cl.Spec.Plans {
			if cl.Spec.Plans[i].Name == in.Spec.Plan {
				class, plan = cl, &cl.Spec.Plans[i]
				return nil
			}
		}
		return saga.Permanent(fmt.Errorf("service class %q has no plan %q", in.Spec.Class, in.Spec.Plan))
	}
	kube := c.workload
	steps := []saga.Step{
		{Name: StepValidating, Do: func(context.Context) error { return loadPlan() }},
	}
	if in.Spec.Subnet != "" {
		steps = append(steps, saga.Step{Name: StepSubnet, Do: func(context.Context) error {
			s, err := c.subnets.Get(in.Spec.Subnet)
			if apierrors.IsNotFound(err) {
				return saga.Wait("waiting for subnet %s to exist", in.Spec.Subnet)
			}
			if err != nil {
				return fmt.Errorf("reading subnet %s: %w", in.Spec.Subnet, err)
			}
			if s.Status.Phase != networkingv1.PhaseProvisioned {
				return saga.Wait("waiting for subnet %s to be Provisioned (it is %s)", in.Spec.Subnet, phaseOr(string(s.Status.Phase), "Init"))
			}
			return nil
		}})
	}
	steps = append(steps,
		saga.Step{
			Name: StepSecret,
			Do:   func(ctx context.Context) error { return ensureSecret(ctx, kube, in, database(in)) },
			Undo: func(ctx context.Context) error { return deleteSecret(ctx, kube, in) },
		},
		saga.Step{
			Name: StepService,
			Do:   func(ctx context.Context) error { return ensureService(ctx, kube, in) },
			Undo: func(ctx context.Context) error { return deleteService(ctx, kube, in) },
		},
		saga.Step{
			Name: StepStatefulSet,
			Do: func(ctx context.Context) error {
				if err := loadPlan(); err != nil {
					return err
				}
				return ensureStatefulSet(ctx, kube, in, class, plan)
			},
			Undo: func(ctx context.Context) error { return deleteStatefulSet(ctx, kube, in) },
		},
		saga.Step{
			Name: StepReplicas,
			Do: func(ctx context.Context) error {
				if err := loadPlan(); err != nil {
					return err
				}
				return replicasReady(ctx, kube, in, plan)
			},
		},
	)
	return steps
}

func phaseOr(p, def string) string {
	if p == "" {
		return def
	}
	return p
}

// database is the parameter "database", or "app".
func database(in *brokerv1.ServiceInstance) string {
	if in.Spec.Parameters != nil {
		var p struct {
			Database string `json:"database"`
		}
		if json.Unmarshal(in.Spec.Parameters.Raw, &p) == nil && p.Database != "" {
			return p.Database
		}
	}
	return "app"
}

// restartFrom runs the saga forward again from the named step on.
func restartFrom(p *saga.Progress, step string) {
	from := slices.IndexFunc(p.Steps, func(s saga.StepProgress) bool { return s.Name == step })
	if from < 0 {
		return
	}
	for i := from; i < len(p.Steps); i++ {
		p.Steps[i] = saga.StepProgress{Name: p.Steps[i].Name, State: saga.Pending}
	}
	p.Phase, p.Reason = saga.Running, ""
}

// deadline is the order's creation plus its deadline (or its plan's limit);
// for an update, the update's start plus the same.
func (c *Controller) deadline(in *brokerv1.ServiceInstance) time.Time {
	d := brokerv1.DefaultMaxProvisioningDuration
	if in.Spec.Deadline != nil {
		d = in.Spec.Deadline.Duration
	} else if cl, err := c.classes.Get(in.Spec.Class); err == nil {
		for _, p := range cl.Spec.Plans {
			if p.Name == in.Spec.Plan && p.MaxProvisioningDuration != nil {
				d = p.MaxProvisioningDuration.Duration
			}
		}
	}
	start := in.CreationTimestamp.Time
	if strings.HasPrefix(in.Status.Operation, "update-") {
		start = c.now()
		for _, s := range in.Status.Steps {
			if s.Name == StepStatefulSet && s.StartedAt != nil && in.Status.ObservedGeneration == in.Generation {
				start = s.StartedAt.Time
			}
		}
	}
	return start.Add(d)
}

// progressOf reads the saga's progress from the order's status.
func progressOf(in *brokerv1.ServiceInstance) *saga.Progress {
	st := &in.Status
	p := &saga.Progress{Cancelled: in.DeletionTimestamp != nil}
	undone := true
	for _, s := range st.Steps {
		p.Steps = append(p.Steps, saga.StepProgress{
			Name: s.Name, State: saga.StepState(s.State), Attempts: s.Attempts, Message: s.Message,
			StartedAt: timeOf(s.StartedAt), FinishedAt: timeOf(s.FinishedAt),
		})
		if s.State != brokerv1.StepPending && s.State != brokerv1.StepCompensated {
			undone = false
		}
	}
	if c := meta.FindStatusCondition(st.Conditions, ConditionReady); c != nil && c.Status == metav1.ConditionFalse && st.Phase != brokerv1.PhaseProvisioning {
		p.Reason = c.Message
	}
	switch st.Phase {
	case brokerv1.PhasePending, "":
		p.Phase = ""
	case brokerv1.PhaseProvisioning:
		p.Phase = saga.Running
	case brokerv1.PhaseProvisioned:
		p.Phase = saga.Succeeded
	case brokerv1.PhaseFailed:
		p.Phase = saga.Failed
		if !undone {
			p.Phase = saga.Compensating
		}
	case brokerv1.PhaseDeprovisioning:
		p.Phase = saga.Compensating
		if undone {
			p.Phase = saga.Cancelled
		}
	}
	if p.Cancelled {
		// Only the first call turns it around; Cancel is idempotent on the rest.
		p.Cancelled = false
		saga.Cancel(p, "deprovision requested")
	}
	return p
}

func timeOf(t *metav1.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.Time
}

func metaTime(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	mt := metav1.NewTime(t.Truncate(time.Second))
	return &mt
}

// applyProgress writes the saga's progress into the order's status.
func applyProgress(in *brokerv1.ServiceInstance, p *saga.Progress) {
	st := &in.Status
	st.Steps = st.Steps[:0]
	for _, s := range p.Steps {
		st.Steps = append(st.Steps, brokerv1.Step{
			Name: s.Name, State: brokerv1.StepState(s.State), Attempts: s.Attempts, Message: s.Message,
			StartedAt: metaTime(s.StartedAt), FinishedAt: metaTime(s.FinishedAt),
		})
	}
	st.ObservedGeneration = in.Generation
	cond := metav1.Condition{Type: ConditionReady, ObservedGeneration: in.Generation}
	switch p.Phase {
	case saga.Running:
		st.Phase = brokerv1.PhaseProvisioning
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Provisioning", Describe(in)
	case saga.Succeeded:
		st.Phase = brokerv1.PhaseProvisioned
		st.ConnectionSecret = namesOf(in).secret
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, "Provisioned", "every replica is ready"
	case saga.Compensating:
		st.Phase = brokerv1.PhaseFailed
		if p.Cancelled {
			st.Phase = brokerv1.PhaseDeprovisioning
		}
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Compensating", p.Reason
	case saga.Failed:
		st.Phase = brokerv1.PhaseFailed
		st.ConnectionSecret = ""
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Failed", p.Reason+"; "+undone(p)
	case saga.Cancelled:
		st.Phase = brokerv1.PhaseDeprovisioning
		st.ConnectionSecret = ""
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Deprovisioned", "everything the order made was removed"
	}
	meta.SetStatusCondition(&st.Conditions, cond)
}

// undone says what compensation removed, e.g. "removed what CreatingService,
// CreatingSecret made".
func undone(p *saga.Progress) string {
	var names, left []string
	for i := len(p.Steps) - 1; i >= 0; i-- {
		s := p.Steps[i]
		switch {
		case s.State != saga.Compensated || !makers[s.Name]:
		case strings.HasPrefix(s.Message, saga.NotUndone):
			left = append(left, s.Name+" ("+s.Message+")")
		default:
			names = append(names, s.Name)
		}
	}
	out := "nothing had been made"
	if len(names) > 0 {
		out = "removed what " + strings.Join(names, ", ") + " made"
	}
	if len(left) > 0 {
		out += "; could not remove what " + strings.Join(left, ", ") + " made"
	}
	return out
}

// makers are the steps that make something in the workload cluster.
var makers = map[string]bool{StepSecret: true, StepService: true, StepStatefulSet: true}

// Describe says where an order is, for people: the step in progress and its
// latest message, e.g. "step 6 of 6 (WaitingForReplicas): waiting for 2/3 replicas ready".
func Describe(in *brokerv1.ServiceInstance) string {
	steps := in.Status.Steps
	for i, s := range steps {
		if s.State == brokerv1.StepDone {
			continue
		}
		d := fmt.Sprintf("step %d of %d (%s)", i+1, len(steps), s.Name)
		if s.Message != "" {
			d += ": " + s.Message
		}
		return d
	}
	return "all steps done"
}

// reconcile advances one order. It returns when to look again without a watch
// event (zero: only when something changes).
func (c *Controller) reconcile(ctx context.Context, namespace, name string) (time.Duration, error) {
	if _, err := c.instances.ServiceInstances(namespace).Get(name); apierrors.IsNotFound(err) {
		return 0, nil
	}
	// The watch wakes us, but the order is read from the server: right after our
	// own status write the cache is often one write behind, and acting on it
	// would only end in a conflict and a backoff.
	in, err := c.orders.ServiceInstances(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the order: %w", err)
	}
	if in.DeletionTimestamp == nil && !slices.Contains(in.Finalizers, Finalizer) {
		in.Finalizers = append(in.Finalizers, Finalizer)
		if in, err = c.orders.ServiceInstances(namespace).Update(ctx, in, metav1.UpdateOptions{}); err != nil {
			return 0, fmt.Errorf("adding the finalizer: %w", err)
		}
	}
	if in.DeletionTimestamp != nil && !slices.Contains(in.Finalizers, Finalizer) {
		return 0, nil
	}

	if in.Status.WorkloadName == "" {
		// Picked once and written with the first progress, before any step
		// makes a workload object under it.
		in.Status.WorkloadName = workloadName(in)
	}
	p := progressOf(in)
	if in.DeletionTimestamp == nil && in.Status.ObservedGeneration != in.Generation && (p.Phase == saga.Succeeded || p.Phase == saga.Running) &&
		slices.ContainsFunc(p.Steps, func(s saga.StepProgress) bool { return s.Name == StepStatefulSet && s.State == saga.Done }) {
		// The plan or parameters changed (an update) after the StatefulSet was
		// made: bring it to the new spec and wait for its replicas again. The
		// Secret and Service stay done, so a failure compensates the whole
		// workload as always.
		restartFrom(p, StepStatefulSet)
	}
	s := &saga.Saga{
		Steps:    c.steps(in),
		Deadline: c.deadline(in),
		Backoff:  c.Backoff,
		Now:      c.now,
		Observe:  func(o saga.StepOutcome) { c.stepOutcome(ctx, in, o) },
		Persist: func(ctx context.Context, p *saga.Progress) error {
			applyProgress(in, p)
			updated, err := c.orders.ServiceInstances(namespace).UpdateStatus(ctx, in, metav1.UpdateOptions{})
			if err != nil {
				return err
			}
			in = updated
			return nil
		},
	}
	res, err := s.Run(ctx, p)
	if err != nil {
		return 0, err
	}
	if res.Finished && in.DeletionTimestamp != nil {
		// The credentials are gone with the workload: so are the bindings that
		// handed them out, or they would outlive their instance.
		if err := c.deleteBindings(ctx, in); err != nil {
			return 0, err
		}
		in.Finalizers = slices.DeleteFunc(in.Finalizers, func(f string) bool { return f == Finalizer })
		if _, err := c.orders.ServiceInstances(namespace).Update(ctx, in, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("removing the finalizer: %w", err)
		}
	}
	return res.RequeueAfter, nil
}

// DescribeUndo says how far removing an order's workload is, for people.
func DescribeUndo(in *brokerv1.ServiceInstance) string {
	steps := in.Status.Steps
	for i := len(steps) - 1; i >= 0; i-- {
		s := steps[i]
		if s.State == brokerv1.StepPending || s.State == brokerv1.StepCompensated {
			continue
		}
		d := fmt.Sprintf("undoing step %d of %d (%s)", i+1, len(steps), s.Name)
		if s.State == brokerv1.StepCompensating && s.Message != "" {
			d += ": " + s.Message
		}
		return d
	}
	return "nothing left to remove"
}
