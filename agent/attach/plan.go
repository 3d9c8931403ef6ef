// Package attach owns the shape of a CNI request in the agent: a plan of
// named steps, each with its prerequisites, its CNI error code and an
// optional undo, and the one small runner that carries a plan out. It also
// declares the narrow interfaces the agent's CNI handler works through
// (addresses, endpoints, host routes, the policy gate and the
// advertisement gate), so that each side effect of ADD, DEL, CHECK and GC
// has one seam that tests can replace.
//
// The runner starts every step whose prerequisites have succeeded, so
// independent steps run concurrently (the veth pair is made while IPAM
// assigns the address). When a step fails it starts no further step, waits
// for the running ones, and undoes every step that ran, last finished
// first, under a fresh deadline: the request's own may be what failed.
package attach

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/types"
)

// UndoTimeout bounds the undo of a failed plan. It runs on a context of its
// own, detached from the request's cancellation.
const UndoTimeout = 10 * time.Second

// Step is one step of a plan.
type Step struct {
	// Name identifies the step in prerequisites, fault injection, timings
	// and errors. Unique within a plan.
	Name string
	// After lists the steps that must have succeeded before this one
	// starts. They must come earlier in the plan.
	After []string
	// Code is the CNI error code of the step's failure, and Msg the
	// message (both unused when Do returns a *types.Error, which is
	// passed on as it is).
	Code uint
	Msg  string
	// Do carries the step out.
	Do func(ctx context.Context) error
	// Undo, when set, reverses what Do did. It runs for a step that
	// succeeded and for one that failed, since a failed step may have done
	// part of its work (a write that timed out may have committed): it must
	// undo only what its step did, and treat what is not there as done.
	Undo func(ctx context.Context) error
	// Detached steps are only waited on: a wait that is pointless once
	// the plan has failed. Their context is cancelled when another step
	// fails, and their failure fails the plan like any other.
	Detached bool
}

// Timing is when a step ran, relative to the start of the plan.
type Timing struct {
	Name       string
	Start, End time.Duration
	Err        error
}

// Took is how long the step ran.
func (t Timing) Took() time.Duration { return t.End - t.Start }

// Runner carries out plans. The zero value is ready to use.
type Runner struct {
	// Fault, when set, is called with a step's name after the step
	// succeeded; an error fails the step there (tests inject failures by
	// step name; the step's undo then runs).
	Fault func(step string) error
	// Observe, when set, is told of every step that ran (metrics).
	Observe func(plan string, t Timing)
	// Panicked, when set, is told of a panic in a step's Do or Undo, with
	// its stack (the agent logs it and stops reporting itself live: state
	// a panic left half-changed is re-read by a restart). The step fails
	// with ErrInternal and the plan is undone as after any failure.
	Panicked func(plan, step string, value any, stack []byte)
}

// Result is what a run of a plan did.
type Result struct {
	// Timings of the steps that ran, in the plan's order.
	Timings []Timing
	// UndoErr is what the undo of a failed plan could not reverse.
	UndoErr error
}

// Timing returns the timing of the named step, and false when it did not run.
func (r *Result) Timing(name string) (Timing, bool) {
	for _, t := range r.Timings {
		if t.Name == name {
			return t, true
		}
	}
	return Timing{}, false
}

// Run carries out the plan named plan. It returns the error of the first
// failed step in the plan's order, as a *types.Error carrying the step's
// code, after undoing every step that ran; nil when every step succeeded.
// A plan whose steps are inconsistent (an unknown or later prerequisite, a
// repeated name) is a programming error and fails without running.
func (r *Runner) Run(ctx context.Context, plan string, steps []Step) (Result, error) {
	if err := validate(steps); err != nil {
		return Result{}, &types.Error{Code: types.ErrInternal, Msg: "plan " + plan, Details: err.Error()}
	}
	x := newRun(ctx, r, plan, steps)
	x.run()
	res := Result{}
	var failed *stepState
	for _, s := range x.states {
		if s.ran {
			res.Timings = append(res.Timings, s.timing)
			if r.Observe != nil {
				r.Observe(plan, s.timing)
			}
		}
		if s.timing.Err != nil && failed == nil {
			failed = s
		}
	}
	if failed == nil {
		return res, nil
	}
	res.UndoErr = x.undo(ctx)
	return res, stepError(failed.step, failed.timing.Err)
}

// RunAll carries out a plan in which no failure stops another step: every
// step whose prerequisites succeeded runs, nothing is undone, and the error
// joins every failure (DEL and GC keep going, so that a retry has less
// left to do).
func (r *Runner) RunAll(ctx context.Context, plan string, steps []Step) (Result, error) {
	if err := validate(steps); err != nil {
		return Result{}, &types.Error{Code: types.ErrInternal, Msg: "plan " + plan, Details: err.Error()}
	}
	x := newRun(ctx, r, plan, steps)
	x.keepGoing = true
	x.run()
	var res Result
	var errs []error
	for _, s := range x.states {
		if s.ran {
			res.Timings = append(res.Timings, s.timing)
			if r.Observe != nil {
				r.Observe(plan, s.timing)
			}
		}
		if s.timing.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.step.Name, s.timing.Err))
		}
	}
	return res, errors.Join(errs...)
}

func stepError(s *Step, err error) error {
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	msg := s.Msg
	if msg == "" {
		msg = s.Name
	}
	return &types.Error{Code: s.Code, Msg: msg, Details: err.Error()}
}

func validate(steps []Step) error {
	seen := map[string]bool{}
	for _, s := range steps {
		if s.Name == "" || s.Do == nil {
			return fmt.Errorf("a step without a name or without Do")
		}
		if seen[s.Name] {
			return fmt.Errorf("step %s declared twice", s.Name)
		}
		for _, p := range s.After {
			if !seen[p] {
				return fmt.Errorf("step %s: prerequisite %s is not an earlier step", s.Name, p)
			}
		}
		seen[s.Name] = true
	}
	return nil
}

type stepState struct {
	step    *Step
	pending int // prerequisites not yet succeeded
	next    []*stepState
	ran     bool
	timing  Timing
	order   int // finish order, for the undo
}

// run is one run of a plan.
type run struct {
	r         *Runner
	ctx       context.Context
	detached  context.Context
	abort     context.CancelFunc
	plan      string
	start     time.Time
	keepGoing bool
	states    []*stepState

	mu       sync.Mutex
	failed   bool
	finished int
	wg       sync.WaitGroup
}

func newRun(ctx context.Context, r *Runner, plan string, steps []Step) *run {
	x := &run{r: r, ctx: ctx, plan: plan, start: time.Now()}
	x.detached, x.abort = context.WithCancel(ctx)
	byName := map[string]*stepState{}
	for i := range steps {
		s := &stepState{step: &steps[i], pending: len(steps[i].After)}
		for _, p := range steps[i].After {
			byName[p].next = append(byName[p].next, s)
		}
		byName[s.step.Name] = s
		x.states = append(x.states, s)
	}
	return x
}

// run starts the steps without prerequisites and waits for the plan. The
// first of them runs in the caller's goroutine, the others each in one of
// their own, in the plan's order but for the second, started last: Go's
// scheduler runs the goroutine started last next on this thread, then the
// others in the order they were started. So when the first step waits
// (an etcd request sent) the second starts at once, then the third,
// rather than whenever an idle CPU wakes to take them, which on a virtual
// machine at rest can take a millisecond. A plan lists its steps without
// prerequisites longest path first.
func (x *run) run() {
	defer x.abort()
	var ready []*stepState
	x.mu.Lock()
	for _, s := range x.states {
		if s.pending == 0 {
			s.ran = true
			ready = append(ready, s)
		}
	}
	x.wg.Add(len(ready))
	x.mu.Unlock()
	for i := 2; i < len(ready); i++ {
		go x.do(ready[i])
	}
	if len(ready) > 1 {
		go x.do(ready[1])
	}
	if len(ready) > 0 {
		x.do(ready[0])
	}
	x.wg.Wait()
}

func (x *run) startLocked(s *stepState) {
	s.ran = true
	x.wg.Add(1)
	go x.do(s)
}

func (x *run) do(s *stepState) {
	defer x.wg.Done()
	ctx := x.ctx
	if s.step.Detached {
		ctx = x.detached
	}
	begin := time.Since(x.start)
	err := x.safely(s.step.Name, func() error {
		if err := s.step.Do(ctx); err != nil || x.r.Fault == nil {
			return err
		}
		return x.r.Fault(s.step.Name)
	})
	end := time.Since(x.start)
	x.mu.Lock()
	defer x.mu.Unlock()
	s.timing = Timing{Name: s.step.Name, Start: begin, End: end, Err: err}
	x.finished++
	s.order = x.finished
	if err != nil {
		if !x.keepGoing {
			x.failed = true
			x.abort()
		}
		return
	}
	if x.failed {
		return
	}
	for _, n := range s.next {
		if n.pending--; n.pending == 0 {
			x.startLocked(n)
		}
	}
}

// safely runs a step's Do or Undo; a panic is its failure, an
// ErrInternal naming the step and the panic (Runner.Panicked gets the
// stack), so that the steps that ran are undone as after any other
// failure: the first step runs in the caller's goroutine, whose panic
// would otherwise leave the others' work behind, and a step in a
// goroutine of its own would take the agent down with every pod's ADD in
// flight.
func (x *run) safely(step string, f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if x.r.Panicked != nil {
				x.r.Panicked(x.plan, step, p, debug.Stack())
			}
			err = &types.Error{Code: types.ErrInternal, Msg: "step " + step + " panicked", Details: fmt.Sprint(p)}
		}
	}()
	return f()
}

// undo reverses every step that ran, last finished first, and keeps going
// after a failure.
func (x *run) undo(ctx context.Context) error {
	var ran []*stepState
	for _, s := range x.states {
		if s.ran && s.step.Undo != nil {
			ran = append(ran, s)
		}
	}
	slices.SortFunc(ran, func(a, b *stepState) int { return b.order - a.order })
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), UndoTimeout)
	defer cancel()
	var errs []error
	for _, s := range ran {
		if err := x.safely("undo "+s.step.Name, func() error { return s.step.Undo(uctx) }); err != nil {
			errs = append(errs, fmt.Errorf("undoing %s: %w", s.step.Name, err))
		}
	}
	return errors.Join(errs...)
}
