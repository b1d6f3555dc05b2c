package saga_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"mizar.dev/pkg/broker/saga"
)

// world is what the steps act on: named resources, how often each was created
// and deleted, and the calls made, in order.
type world struct {
	exists  map[string]bool
	creates map[string]int
	deletes map[string]int
	calls   []string
	ready   bool
	// failures makes the next n calls of a step ("do:name" / "undo:name") fail with err.
	failures map[string]int
	err      error
}

func newWorld() *world {
	return &world{exists: map[string]bool{}, creates: map[string]int{}, deletes: map[string]int{}, failures: map[string]int{}}
}

func (w *world) fail(call string) error {
	if w.failures[call] > 0 {
		w.failures[call]--
		return w.err
	}
	return nil
}

// ensure is an idempotent create step and its undo, as the fulfillment steps are.
func (w *world) ensure(name string) saga.Step {
	return saga.Step{
		Name: name,
		Do: func(context.Context) error {
			w.calls = append(w.calls, "do:"+name)
			if err := w.fail("do:" + name); err != nil {
				return err
			}
			if !w.exists[name] {
				w.exists[name] = true
				w.creates[name]++
			}
			return nil
		},
		Undo: func(context.Context) error {
			w.calls = append(w.calls, "undo:"+name)
			if err := w.fail("undo:" + name); err != nil {
				return err
			}
			if w.exists[name] {
				delete(w.exists, name)
				w.deletes[name]++
			}
			return nil
		},
	}
}

func (w *world) steps() []saga.Step {
	return []saga.Step{
		{Name: "ValidatingOrder", Do: func(context.Context) error {
			w.calls = append(w.calls, "do:ValidatingOrder")
			return w.fail("do:ValidatingOrder")
		}},
		w.ensure("CreatingSecret"),
		w.ensure("CreatingService"),
		w.ensure("CreatingStatefulSet"),
		{Name: "WaitingForReplicas", Do: func(context.Context) error {
			w.calls = append(w.calls, "do:WaitingForReplicas")
			if err := w.fail("do:WaitingForReplicas"); err != nil {
				return err
			}
			if !w.ready {
				return saga.Wait("0/3 replicas ready")
			}
			return nil
		}},
	}
}

// clock is a manual clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// store keeps the last persisted progress as a deep copy, and can crash (fail a
// persist) at a given call.
type store struct {
	saved   saga.Progress
	calls   int
	crashAt int
}

var errCrash = errors.New("executor crashed")

func (s *store) persist(_ context.Context, p *saga.Progress) error {
	s.calls++
	if s.calls == s.crashAt {
		return errCrash
	}
	s.saved = clone(p)
	return nil
}

func clone(p *saga.Progress) saga.Progress {
	c := *p
	c.Steps = slices.Clone(p.Steps)
	return c
}

func newSaga(w *world, st *store, c *clock) *saga.Saga {
	return &saga.Saga{Steps: w.steps(), Persist: st.persist, Now: c.now, Random: func() float64 { return 0.5 }}
}

func states(p *saga.Progress) string {
	var out []string
	for _, s := range p.Steps {
		out = append(out, string(s.State))
	}
	return strings.Join(out, ",")
}

func TestStepsRunInOrderAndPersistEachTransition(t *testing.T) {
	w, st, c := newWorld(), &store{}, &clock{t: time.Unix(1000, 0)}
	w.ready = true
	p := &saga.Progress{}
	r, err := newSaga(w, st, c).Run(context.Background(), p)
	if err != nil || !r.Finished || p.Phase != saga.Succeeded {
		t.Fatalf("Run = %+v, %v; phase %s", r, err, p.Phase)
	}
	want := []string{"do:ValidatingOrder", "do:CreatingSecret", "do:CreatingService", "do:CreatingStatefulSet", "do:WaitingForReplicas"}
	if !slices.Equal(w.calls, want) {
		t.Errorf("calls %q, want %q", w.calls, want)
	}
	// init + (Running, Done) per step + Succeeded.
	if st.calls != 1+2*5+1 {
		t.Errorf("persisted %d times, want %d", st.calls, 1+2*5+1)
	}
	if got := states(&st.saved); got != "Done,Done,Done,Done,Done" || st.saved.Phase != saga.Succeeded {
		t.Errorf("persisted %s %s", st.saved.Phase, got)
	}
	// A finished saga is left alone.
	w.calls = nil
	if r, err := newSaga(w, st, c).Run(context.Background(), p); err != nil || !r.Finished || len(w.calls) != 0 {
		t.Errorf("re-running a finished saga: %+v, %v, calls %q", r, err, w.calls)
	}
}

// TestResumeAfterCrashAtEveryStep crashes the executor at every persist of a
// clean run (so also between a step's effect and its record) and resumes from
// what was stored: the saga ends Succeeded and nothing is ever created twice.
func TestResumeAfterCrashAtEveryStep(t *testing.T) {
	clean := &store{}
	w := newWorld()
	w.ready = true
	if _, err := newSaga(w, clean, &clock{}).Run(context.Background(), &saga.Progress{}); err != nil {
		t.Fatal(err)
	}
	for crash := 1; crash <= clean.calls; crash++ {
		t.Run(fmt.Sprintf("crash at persist %d", crash), func(t *testing.T) {
			w, st, c := newWorld(), &store{crashAt: crash}, &clock{t: time.Unix(1000, 0)}
			w.ready = true
			_, err := newSaga(w, st, c).Run(context.Background(), &saga.Progress{})
			if !errors.Is(err, errCrash) {
				t.Fatalf("first run: %v, want the crash", err)
			}
			// A new executor starts from the stored progress (none if the first write failed).
			resumed := clone(&st.saved)
			r, err := newSaga(w, st, c).Run(context.Background(), &resumed)
			if err != nil || !r.Finished || resumed.Phase != saga.Succeeded {
				t.Fatalf("resumed run: %+v, %v, phase %s", r, err, resumed.Phase)
			}
			for _, name := range []string{"CreatingSecret", "CreatingService", "CreatingStatefulSet"} {
				if w.creates[name] != 1 || !w.exists[name] {
					t.Errorf("%s created %d times (exists %v), want exactly once", name, w.creates[name], w.exists[name])
				}
			}
		})
	}
}

// TestResumeCompensationAfterCrash crashes at every persist of a failing run:
// the resumed executor still removes everything, each thing once.
func TestResumeCompensationAfterCrash(t *testing.T) {
	setup := func() *world {
		w := newWorld()
		w.err = saga.Permanent(errors.New("forbidden: statefulsets in namespace team"))
		w.failures["do:WaitingForReplicas"] = 1
		w.ready = true
		return w
	}
	clean := &store{}
	if _, err := newSaga(setup(), clean, &clock{}).Run(context.Background(), &saga.Progress{}); err != nil {
		t.Fatal(err)
	}
	for crash := 1; crash <= clean.calls; crash++ {
		t.Run(fmt.Sprintf("crash at persist %d", crash), func(t *testing.T) {
			w, st, c := setup(), &store{crashAt: crash}, &clock{}
			if _, err := newSaga(w, st, c).Run(context.Background(), &saga.Progress{}); !errors.Is(err, errCrash) {
				t.Fatalf("first run: %v, want the crash", err)
			}
			resumed := clone(&st.saved)
			r, err := newSaga(w, st, c).Run(context.Background(), &resumed)
			if err != nil || !r.Finished {
				t.Fatalf("resumed run: %+v, %v", r, err)
			}
			// A crash before the failure was recorded re-runs the step, which now passes.
			if resumed.Phase != saga.Failed && resumed.Phase != saga.Succeeded {
				t.Fatalf("phase %s", resumed.Phase)
			}
			for _, name := range []string{"CreatingSecret", "CreatingService", "CreatingStatefulSet"} {
				if w.creates[name] != 1 {
					t.Errorf("%s created %d times", name, w.creates[name])
				}
				if resumed.Phase == saga.Failed && (w.exists[name] || w.deletes[name] != 1) {
					t.Errorf("%s exists=%v, deleted %d times after compensation", name, w.exists[name], w.deletes[name])
				}
			}
		})
	}
}

func TestTransientErrorsRetryWithCappedJitteredBackoff(t *testing.T) {
	w, st, c := newWorld(), &store{}, &clock{t: time.Unix(1000, 0)}
	w.ready = true
	w.err = errors.New("etcdserver: request timed out")
	w.failures["do:CreatingService"] = 4
	s := newSaga(w, st, c)
	s.Backoff = saga.Backoff{Initial: time.Second, Factor: 2, Max: 5 * time.Second}
	p := &saga.Progress{}
	var delays []time.Duration
	for i := 0; i < 10; i++ {
		r, err := s.Run(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		if r.Finished {
			break
		}
		delays = append(delays, r.RequeueAfter)
		c.t = c.t.Add(r.RequeueAfter)
	}
	// Random is 0.5: three quarters of 1 s, 2 s, 4 s, then the 5 s cap.
	want := []time.Duration{750 * time.Millisecond, 1500 * time.Millisecond, 3 * time.Second, 3750 * time.Millisecond}
	if !slices.Equal(delays, want) {
		t.Errorf("delays %v, want %v", delays, want)
	}
	if p.Phase != saga.Succeeded || p.Steps[2].Attempts != 4 || w.creates["CreatingService"] != 1 {
		t.Errorf("phase %s, attempts %d, creates %d", p.Phase, p.Steps[2].Attempts, w.creates["CreatingService"])
	}
	if st.saved.Steps[2].Attempts != 4 {
		t.Errorf("attempts are not persisted: %+v", st.saved.Steps[2])
	}
}

func TestBackoffBounds(t *testing.T) {
	b := saga.Backoff{Initial: time.Second, Factor: 2, Max: time.Minute}
	for attempts := int32(1); attempts <= 40; attempts++ {
		d := min(time.Second<<(attempts-1), time.Minute)
		if attempts > 30 {
			d = time.Minute
		}
		lo, hi := b.Delay(attempts, func() float64 { return 0 }), b.Delay(attempts, func() float64 { return 0.999999999 })
		if lo != d/2 || hi < d-time.Millisecond || hi > d {
			t.Errorf("attempt %d: delay in [%v, %v], want [%v, %v]", attempts, lo, hi, d/2, d)
		}
	}
}

func TestDeadlineFailsAndCompensatesInReverse(t *testing.T) {
	w, st, c := newWorld(), &store{}, &clock{t: time.Unix(1000, 0)}
	s := newSaga(w, st, c)
	s.Deadline = c.t.Add(10 * time.Minute)
	p := &saga.Progress{}
	r, err := s.Run(context.Background(), p)
	if err != nil || r.Finished {
		t.Fatalf("Run = %+v, %v", r, err)
	}
	// Waiting on the replicas: the deadline is the only timer.
	if r.RequeueAfter != 10*time.Minute || p.Steps[4].Message != "0/3 replicas ready" || st.saved.Steps[4].Message != "0/3 replicas ready" {
		t.Errorf("waiting: %+v, step %+v", r, p.Steps[4])
	}
	c.t = c.t.Add(10 * time.Minute)
	w.calls = nil
	r, err = s.Run(context.Background(), p)
	if err != nil || !r.Finished || p.Phase != saga.Failed {
		t.Fatalf("after the deadline: %+v, %v, phase %s", r, err, p.Phase)
	}
	want := []string{"undo:CreatingStatefulSet", "undo:CreatingService", "undo:CreatingSecret"}
	if !slices.Equal(w.calls, want) {
		t.Errorf("calls %q, want %q", w.calls, want)
	}
	if got := states(p); got != "Compensated,Compensated,Compensated,Compensated,Compensated" {
		t.Errorf("states %s", got)
	}
	if !strings.Contains(p.Reason, "step 5 of 5 (WaitingForReplicas) failed: deadline") || !strings.Contains(p.Steps[4].Message, "deadline") {
		t.Errorf("reason %q, step message %q", p.Reason, p.Steps[4].Message)
	}
	if len(w.exists) != 0 {
		t.Errorf("left behind: %v", w.exists)
	}
}

func TestPermanentErrorCompensatesInReverseOrder(t *testing.T) {
	w, st, c := newWorld(), &store{}, &clock{}
	w.err = saga.Permanent(errors.New(`statefulsets.apps is forbidden: cannot create in namespace "team"`))
	w.failures["do:CreatingStatefulSet"] = 1
	p := &saga.Progress{}
	r, err := newSaga(w, st, c).Run(context.Background(), p)
	if err != nil || !r.Finished || p.Phase != saga.Failed {
		t.Fatalf("Run = %+v, %v, phase %s", r, err, p.Phase)
	}
	want := []string{"do:ValidatingOrder", "do:CreatingSecret", "do:CreatingService", "do:CreatingStatefulSet",
		"undo:CreatingStatefulSet", "undo:CreatingService", "undo:CreatingSecret"}
	if !slices.Equal(w.calls, want) {
		t.Errorf("calls %q, want %q", w.calls, want)
	}
	if got := states(p); got != "Compensated,Compensated,Compensated,Compensated,Pending" {
		t.Errorf("states %s (the step never started stays Pending)", got)
	}
	if !strings.Contains(p.Reason, "step 4 of 5 (CreatingStatefulSet) failed: statefulsets.apps is forbidden") {
		t.Errorf("reason %q", p.Reason)
	}
	if st.saved.Phase != saga.Failed || st.saved.Reason != p.Reason {
		t.Errorf("persisted %s %q", st.saved.Phase, st.saved.Reason)
	}
}

func TestUndoRetriesUntilItConverges(t *testing.T) {
	w, st, c := newWorld(), &store{}, &clock{}
	w.err = saga.Permanent(errors.New("bad image"))
	w.failures["do:WaitingForReplicas"] = 1
	p := &saga.Progress{}
	s := newSaga(w, st, c)
	// The undo of the Service fails twice, transiently.
	w.failures["undo:CreatingService"] = 2
	undoErr := errors.New("etcdserver: leader changed")
	orig := s.Steps[2].Undo
	s.Steps[2].Undo = func(ctx context.Context) error {
		if w.failures["undo:CreatingService"] > 0 {
			w.failures["undo:CreatingService"]--
			return undoErr
		}
		return orig(ctx)
	}
	r, err := s.Run(context.Background(), p)
	if err != nil || r.Finished || r.RequeueAfter != 750*time.Millisecond {
		t.Fatalf("first undo failure: %+v, %v", r, err)
	}
	if p.Steps[2].State != saga.Undoing || p.Steps[2].Attempts != 1 || p.Phase != saga.Compensating {
		t.Errorf("step %+v, phase %s", p.Steps[2], p.Phase)
	}
	if r, err = s.Run(context.Background(), p); err != nil || r.RequeueAfter != 1500*time.Millisecond {
		t.Fatalf("second undo failure: %+v, %v", r, err)
	}
	if r, err = s.Run(context.Background(), p); err != nil || !r.Finished || p.Phase != saga.Failed || len(w.exists) != 0 {
		t.Fatalf("converged: %+v, %v, phase %s, left %v", r, err, p.Phase, w.exists)
	}
}

func TestCancelStopsProvisioningAndCleansUp(t *testing.T) {
	w, st, c := newWorld(), &store{}, &clock{}
	p := &saga.Progress{}
	s := newSaga(w, st, c)
	if r, err := s.Run(context.Background(), p); err != nil || r.Finished {
		t.Fatalf("Run = %+v, %v", r, err)
	}
	saga.Cancel(p, "deprovision requested")
	saga.Cancel(p, "again")
	w.calls = nil
	r, err := s.Run(context.Background(), p)
	if err != nil || !r.Finished || p.Phase != saga.Cancelled || p.Reason != "deprovision requested" {
		t.Fatalf("Run = %+v, %v, phase %s, reason %q", r, err, p.Phase, p.Reason)
	}
	want := []string{"undo:CreatingStatefulSet", "undo:CreatingService", "undo:CreatingSecret"}
	if !slices.Equal(w.calls, want) || len(w.exists) != 0 {
		t.Errorf("calls %q (want %q), left %v", w.calls, want, w.exists)
	}

	// Deprovisioning a provisioned order takes the same path.
	w2, st2 := newWorld(), &store{}
	w2.ready = true
	p2 := &saga.Progress{}
	s2 := newSaga(w2, st2, c)
	if _, err := s2.Run(context.Background(), p2); err != nil || p2.Phase != saga.Succeeded {
		t.Fatal(err, p2.Phase)
	}
	saga.Cancel(p2, "deprovision requested")
	if r, err := s2.Run(context.Background(), p2); err != nil || !r.Finished || p2.Phase != saga.Cancelled || len(w2.exists) != 0 {
		t.Errorf("deprovision: %+v, %v, phase %s, left %v", r, err, p2.Phase, w2.exists)
	}

	// A cancelled order that never started has nothing to undo.
	p3 := &saga.Progress{}
	saga.Cancel(p3, "deprovision requested")
	w3 := newWorld()
	if r, err := newSaga(w3, &store{}, c).Run(context.Background(), p3); err != nil || !r.Finished || p3.Phase != saga.Cancelled || len(w3.calls) != 0 {
		t.Errorf("cancel before start: %+v, %v, phase %s, calls %q", r, err, p3.Phase, w3.calls)
	}
}

func TestCancelAfterFailureIsFinished(t *testing.T) {
	p := &saga.Progress{Phase: saga.Failed, Reason: "step 2 of 5 failed"}
	saga.Cancel(p, "deprovision requested")
	if p.Phase != saga.Cancelled || p.Reason != "step 2 of 5 failed" {
		t.Errorf("phase %s reason %q", p.Phase, p.Reason)
	}
}

func TestPersistedProgressMustMatchTheSteps(t *testing.T) {
	w := newWorld()
	p := &saga.Progress{Phase: saga.Running, Steps: []saga.StepProgress{{Name: "Other", State: saga.Done}}}
	if _, err := newSaga(w, &store{}, &clock{}).Run(context.Background(), p); err == nil || len(w.calls) != 0 {
		t.Errorf("mismatched progress: err %v, calls %q", err, w.calls)
	}
	p = &saga.Progress{Phase: "Sideways", Steps: clone(&saga.Progress{Steps: make([]saga.StepProgress, 5)}).Steps}
	for i, s := range w.steps() {
		p.Steps[i].Name = s.Name
	}
	if _, err := newSaga(w, &store{}, &clock{}).Run(context.Background(), p); err == nil {
		t.Error("unknown phase accepted")
	}
}

func TestPermanentUndoErrorIsRecordedAndCompensationGoesOn(t *testing.T) {
	w, st, c := newWorld(), &store{}, &clock{}
	w.err = saga.Permanent(errors.New(`secrets is forbidden: cannot delete in namespace "team"`))
	w.failures["do:WaitingForReplicas"] = 1
	w.failures["undo:CreatingService"] = 1
	p := &saga.Progress{}
	r, err := newSaga(w, st, c).Run(context.Background(), p)
	if err != nil || !r.Finished || p.Phase != saga.Failed {
		t.Fatalf("Run = %+v, %v, phase %s", r, err, p.Phase)
	}
	if s := p.Steps[2]; s.State != saga.Compensated || !strings.HasPrefix(s.Message, saga.NotUndone+": secrets is forbidden") {
		t.Errorf("service step %+v", s)
	}
	if !w.exists["CreatingService"] || w.exists["CreatingSecret"] || w.exists["CreatingStatefulSet"] {
		t.Errorf("left %v: only the Service should remain", w.exists)
	}
}
