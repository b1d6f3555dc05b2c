// Package saga runs an order as a saga: ordered, named, idempotent steps whose
// progress is persisted after every transition, so a restarted executor resumes
// where the last one stopped. A permanent error, the deadline or a cancellation
// (deprovision) turns the saga around: every step that may have made something
// is undone in reverse order. Deprovisioning a finished order takes the same path.
//
// The engine is level-triggered and holds no state between calls: Run is handed
// the persisted Progress, advances it as far as it can, and says when to call
// again. Waiting for other objects is the caller's watch's business; only
// backoff and the deadline produce a RequeueAfter.
package saga

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// Step is one named, idempotent action and its compensation.
type Step struct {
	Name string
	// Do makes the step's effect, or finds it made. It returns nil when the step
	// is complete, a Waiting error while it depends on something else, a
	// Permanent error when retrying cannot help, and any other error to be retried.
	Do func(ctx context.Context) error
	// Undo removes what Do made, or finds it gone. Nil for steps that make nothing.
	// Errors are retried with backoff until Undo succeeds; a Permanent error
	// gives up on this step (its message says NotUndone) and goes on with the rest.
	Undo func(ctx context.Context) error
}

// NotUndone starts the message of a step whose undo failed permanently.
const NotUndone = "not undone"

// Phase is where the whole saga is.
type Phase string

const (
	// Running: going forward.
	Running Phase = "Running"
	// Succeeded: every step is done.
	Succeeded Phase = "Succeeded"
	// Compensating: undoing, after a failure or a cancellation.
	Compensating Phase = "Compensating"
	// Failed: a step failed (or the deadline passed) and everything was undone.
	Failed Phase = "Failed"
	// Cancelled: cancelled (deprovisioned) and everything was undone.
	Cancelled Phase = "Cancelled"
)

// StepState is where one step is.
type StepState string

const (
	Pending     StepState = "Pending"
	InProgress  StepState = "Running"
	Done        StepState = "Done"
	StepFailed  StepState = "Failed"
	Undoing     StepState = "Compensating"
	Compensated StepState = "Compensated"
)

// StepProgress is the persisted progress of one step.
type StepProgress struct {
	Name  string
	State StepState
	// Attempts counts runs of Do that ended in an error; while the step is being
	// undone it counts failed runs of Undo instead (it drives the backoff).
	Attempts   int32
	Message    string
	StartedAt  time.Time
	FinishedAt time.Time
}

// Progress is everything the saga persists.
type Progress struct {
	Phase Phase
	Steps []StepProgress
	// Cancelled records a cancellation, so compensation ends in Cancelled, not Failed.
	Cancelled bool
	// Reason says why the saga turned around: the step that failed and why, or the
	// cancellation. Empty while running forward.
	Reason string
}

// Backoff is capped exponential backoff with jitter for transient errors.
type Backoff struct {
	Initial time.Duration
	Factor  float64
	Max     time.Duration
}

// DefaultBackoff starts at 1 s and doubles up to 2 minutes (broker notes §10).
var DefaultBackoff = Backoff{Initial: time.Second, Factor: 2, Max: 2 * time.Minute}

// Delay returns the wait before retry number attempts (1 for the first retry):
// a uniformly random duration in [d/2, d], d = Initial*Factor^(attempts-1)
// capped at Max. The jitter keeps many failing orders from retrying in step.
func (b Backoff) Delay(attempts int32, random func() float64) time.Duration {
	d := float64(b.Initial)
	for i := int32(1); i < attempts && d < float64(b.Max); i++ {
		d *= b.Factor
	}
	d = min(d, float64(b.Max))
	return time.Duration(d/2 + random()*d/2)
}

// Result says what the caller should do next.
type Result struct {
	// Finished is set once the saga reached Succeeded, Failed or Cancelled.
	Finished bool
	// RequeueAfter, when positive, is when Run should be called again even if no
	// watch event arrives: a retry's backoff or the deadline of a waiting step.
	RequeueAfter time.Duration
}

// Waiting is returned by a step that depends on something not yet there.
type Waiting struct{ Message string }

func (w *Waiting) Error() string { return w.Message }

// Wait returns a Waiting error with a message for people.
func Wait(format string, args ...any) error { return &Waiting{Message: fmt.Sprintf(format, args...)} }

type permanent struct{ err error }

func (p *permanent) Error() string { return p.err.Error() }
func (p *permanent) Unwrap() error { return p.err }

// Permanent marks err as one retrying cannot fix.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanent{err: err}
}

// IsPermanent reports whether err was marked Permanent.
func IsPermanent(err error) bool {
	var p *permanent
	return errors.As(err, &p)
}

// Saga is one order's steps and how to run them.
type Saga struct {
	Steps []Step
	// Deadline bounds the forward path; zero means none. Compensation is not bounded.
	Deadline time.Time
	Backoff  Backoff
	// Persist stores the progress; Run calls it after every transition and stops
	// at its first error (the caller retries; every step is idempotent).
	Persist func(ctx context.Context, p *Progress) error
	// Now and Random are replaceable for tests.
	Now    func() time.Time
	Random func() float64
	// Observe, when set, is told of every step outcome (after it is
	// persisted or not: it must not block), for logs and Events.
	Observe func(StepOutcome)
}

// Outcomes of one attempt at a step, as StepOutcome.Outcome and the label of
// mizar_saga_steps_total.
const (
	OutcomeDone        = "done"
	OutcomeWaiting     = "waiting"
	OutcomeRetrying    = "retrying"
	OutcomeFailed      = "failed"
	OutcomeUndone      = "undone"
	OutcomeUndoRetry   = "undo_retrying"
	OutcomeNotUndone   = "not_undone"
	OutcomeDeadlineHit = "deadline"
)

// StepOutcome is one attempt at a step (forward or undo) and how it ended.
type StepOutcome struct {
	Step     string
	Index    int // 0-based
	Of       int
	Outcome  string
	Attempts int32
	Err      error
	// RetryIn is the backoff before the next attempt (retrying outcomes).
	RetryIn time.Duration
}

var (
	stepsTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Name:           "mizar_saga_steps_total",
		Help:           "Attempts at saga steps (forward and undo), by step and outcome (done, waiting, retrying, failed, deadline, undone, undo_retrying, not_undone).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"step", "outcome"})
	registerOnce sync.Once
)

// observe counts an outcome and tells Observe.
func (s *Saga) observe(p *Progress, i int, outcome string, err error, retryIn time.Duration) {
	registerOnce.Do(func() { legacyregistry.MustRegister(stepsTotal) })
	sp := p.Steps[i]
	stepsTotal.WithLabelValues(sp.Name, outcome).Inc()
	if s.Observe != nil {
		s.Observe(StepOutcome{Step: sp.Name, Index: i, Of: len(p.Steps), Outcome: outcome, Attempts: sp.Attempts, Err: err, RetryIn: retryIn})
	}
}

func (s *Saga) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Saga) random() float64 {
	if s.Random != nil {
		return s.Random()
	}
	return rand.Float64()
}

func (s *Saga) backoff() Backoff {
	if s.Backoff.Initial <= 0 {
		return DefaultBackoff
	}
	return s.Backoff
}

// Cancel turns a running or finished saga around (deprovision): Run then undoes
// every step that may have made something. Cancelling twice changes nothing.
func Cancel(p *Progress, reason string) {
	if p.Cancelled {
		return
	}
	p.Cancelled = true
	switch p.Phase {
	case "", Running, Succeeded:
		p.Phase = Compensating
		p.Reason = reason
	case Failed:
		// Already undone; what remains is to say so.
		p.Phase = Cancelled
	}
}

// Run advances p as far as it can.
func (s *Saga) Run(ctx context.Context, p *Progress) (Result, error) {
	if err := s.start(ctx, p); err != nil {
		return Result{}, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		var (
			r    Result
			next bool
			err  error
		)
		switch p.Phase {
		case Running:
			r, next, err = s.forward(ctx, p)
		case Compensating:
			r, next, err = s.compensate(ctx, p)
		case Succeeded, Failed, Cancelled:
			return Result{Finished: true}, nil
		default:
			return Result{}, fmt.Errorf("saga: unknown phase %q", p.Phase)
		}
		if err != nil || !next {
			return r, err
		}
	}
}

// start initializes a new saga's progress, or checks a persisted one against the steps.
func (s *Saga) start(ctx context.Context, p *Progress) error {
	if p.Phase == "" || (p.Phase == Compensating && len(p.Steps) == 0) {
		p.Steps = make([]StepProgress, len(s.Steps))
		for i, st := range s.Steps {
			p.Steps[i] = StepProgress{Name: st.Name, State: Pending}
		}
		if p.Phase == "" {
			p.Phase = Running
		}
		return s.persist(ctx, p)
	}
	if len(p.Steps) != len(s.Steps) {
		return fmt.Errorf("saga: persisted progress has %d steps, the saga %d", len(p.Steps), len(s.Steps))
	}
	for i := range s.Steps {
		if p.Steps[i].Name != s.Steps[i].Name {
			return fmt.Errorf("saga: persisted step %d is %q, the saga's is %q", i+1, p.Steps[i].Name, s.Steps[i].Name)
		}
	}
	return nil
}

func (s *Saga) persist(ctx context.Context, p *Progress) error {
	if s.Persist == nil {
		return nil
	}
	if err := s.Persist(ctx, p); err != nil {
		return fmt.Errorf("saga: persisting progress: %w", err)
	}
	return nil
}

// forward runs the first step that is not done. next says whether to go on at once.
func (s *Saga) forward(ctx context.Context, p *Progress) (Result, bool, error) {
	i := 0
	for i < len(p.Steps) && p.Steps[i].State == Done {
		i++
	}
	if i == len(p.Steps) {
		p.Phase = Succeeded
		return Result{Finished: true}, false, s.persist(ctx, p)
	}
	sp, now := &p.Steps[i], s.now()
	if !s.Deadline.IsZero() && !now.Before(s.Deadline) {
		err := fmt.Errorf("deadline %s passed", s.Deadline.UTC().Format(time.RFC3339))
		s.fail(p, i, now, err)
		s.observe(p, i, OutcomeDeadlineHit, err, 0)
		return Result{}, true, s.persist(ctx, p)
	}
	if sp.State != InProgress {
		sp.State, sp.StartedAt = InProgress, now
		if err := s.persist(ctx, p); err != nil {
			return Result{}, false, err
		}
	}
	err := s.Steps[i].Do(ctx)
	now = s.now()
	var w *Waiting
	switch {
	case err == nil:
		sp.State, sp.FinishedAt, sp.Message = Done, now, ""
		s.observe(p, i, OutcomeDone, nil, 0)
		return Result{}, true, s.persist(ctx, p)
	case errors.As(err, &w):
		// Woken by the caller's watch; the deadline is the only timer.
		r := Result{RequeueAfter: s.untilDeadline(now)}
		if sp.Message == w.Message {
			return r, false, nil
		}
		sp.Message = w.Message
		s.observe(p, i, OutcomeWaiting, err, 0)
		return r, false, s.persist(ctx, p)
	case IsPermanent(err):
		sp.Attempts++
		s.fail(p, i, now, err)
		s.observe(p, i, OutcomeFailed, err, 0)
		return Result{}, true, s.persist(ctx, p)
	default:
		sp.Attempts++
		sp.Message = fmt.Sprintf("attempt %d failed, retrying: %v", sp.Attempts, err)
		delay := s.backoff().Delay(sp.Attempts, s.random)
		if d := s.untilDeadline(now); d > 0 && d < delay {
			delay = d
		}
		s.observe(p, i, OutcomeRetrying, err, delay)
		return Result{RequeueAfter: delay}, false, s.persist(ctx, p)
	}
}

func (s *Saga) untilDeadline(now time.Time) time.Duration {
	if s.Deadline.IsZero() {
		return 0
	}
	return max(s.Deadline.Sub(now), time.Millisecond)
}

// fail marks step i failed and turns the saga around.
func (s *Saga) fail(p *Progress, i int, now time.Time, err error) {
	sp := &p.Steps[i]
	sp.State, sp.FinishedAt, sp.Message = StepFailed, now, err.Error()
	p.Phase = Compensating
	p.Reason = fmt.Sprintf("step %d of %d (%s) failed: %v", i+1, len(p.Steps), sp.Name, err)
}

// compensate undoes the last step that may have made something.
func (s *Saga) compensate(ctx context.Context, p *Progress) (Result, bool, error) {
	i := len(p.Steps) - 1
	for i >= 0 && (p.Steps[i].State == Pending || p.Steps[i].State == Compensated) {
		i--
	}
	if i < 0 {
		if p.Cancelled {
			p.Phase = Cancelled
		} else {
			p.Phase = Failed
		}
		return Result{Finished: true}, false, s.persist(ctx, p)
	}
	sp := &p.Steps[i]
	if sp.State != InProgress && sp.State != StepFailed && sp.State != Done && sp.State != Undoing {
		return Result{}, false, fmt.Errorf("saga: step %s in unknown state %q", sp.Name, sp.State)
	}
	undo := s.Steps[i].Undo
	var err error
	if undo != nil {
		err = undo(ctx)
	}
	now := s.now()
	if err == nil {
		// A failed step keeps its error in the message; the state says it was undone.
		if sp.State != StepFailed {
			sp.Message = ""
		}
		sp.State, sp.FinishedAt = Compensated, now
		s.observe(p, i, OutcomeUndone, nil, 0)
		return Result{}, true, s.persist(ctx, p)
	}
	if IsPermanent(err) {
		// Retrying cannot help (e.g. the permission to delete is gone): say what
		// was left behind and go on undoing the rest, so the order still ends.
		sp.State, sp.FinishedAt = Compensated, now
		sp.Message = fmt.Sprintf("%s: %v", NotUndone, err)
		s.observe(p, i, OutcomeNotUndone, err, 0)
		return Result{}, true, s.persist(ctx, p)
	}
	// Compensation must converge: other errors are retried with backoff.
	if sp.State != Undoing {
		// The forward attempts no longer drive anything; count the undo's.
		sp.State, sp.Attempts = Undoing, 0
	}
	sp.Attempts++
	sp.Message = fmt.Sprintf("undoing, attempt %d failed, retrying: %v", sp.Attempts, err)
	delay := s.backoff().Delay(sp.Attempts, s.random)
	s.observe(p, i, OutcomeUndoRetry, err, delay)
	return Result{RequeueAfter: delay}, false, s.persist(ctx, p)
}
