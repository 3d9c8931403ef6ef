package attach

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"
)

// journal records what steps and undos did, in order.
type journal struct {
	mu  sync.Mutex
	log []string
}

func (j *journal) add(s string) {
	j.mu.Lock()
	j.log = append(j.log, s)
	j.mu.Unlock()
}

func (j *journal) get() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.log)
}

// step is a step that notes its run and its undo, and fails with fail.
func (j *journal) step(name string, after []string, fail error) Step {
	return Step{Name: name, After: after, Code: 100 + uint(len(name)), Msg: "doing " + name,
		Do:   func(context.Context) error { j.add(name); return fail },
		Undo: func(context.Context) error { j.add("undo " + name); return nil }}
}

func TestRunnerPrerequisitesAndSuccess(t *testing.T) {
	j := &journal{}
	steps := []Step{
		j.step("a", nil, nil),
		j.step("b", []string{"a"}, nil),
		j.step("c", []string{"b"}, nil),
	}
	var r Runner
	res, err := r.Run(context.Background(), "test", steps)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"a", "b", "c"}, j.get()); d != "" {
		t.Errorf("steps (-want +got):\n%s", d)
	}
	var names []string
	for _, tm := range res.Timings {
		names = append(names, tm.Name)
		if tm.End < tm.Start || tm.Err != nil {
			t.Errorf("timing %+v", tm)
		}
	}
	if d := cmp.Diff([]string{"a", "b", "c"}, names); d != "" {
		t.Errorf("timings (-want +got):\n%s", d)
	}
	b, _ := res.Timing("b")
	c, _ := res.Timing("c")
	if c.Start < b.End {
		t.Errorf("c started at %v, before its prerequisite b ended at %v", c.Start, b.End)
	}
}

// Independent steps run at the same time: each waits for the other to
// have started.
func TestRunnerIndependentStepsRunConcurrently(t *testing.T) {
	aStarted, bStarted := make(chan struct{}), make(chan struct{})
	meet := func(mine, other chan struct{}) func(context.Context) error {
		return func(ctx context.Context) error {
			close(mine)
			select {
			case <-other:
				return nil
			case <-time.After(10 * time.Second):
				return errors.New("the other step never started")
			}
		}
	}
	steps := []Step{
		{Name: "a", Do: meet(aStarted, bStarted)},
		{Name: "b", Do: meet(bStarted, aStarted)},
		{Name: "c", After: []string{"a", "b"}, Do: func(context.Context) error { return nil }},
	}
	var r Runner
	if _, err := r.Run(context.Background(), "test", steps); err != nil {
		t.Fatal(err)
	}
}

// On a failure nothing more starts, the running steps finish, and every
// step that ran (the failed one too) is undone, last finished first.
func TestRunnerUndoesLastFirst(t *testing.T) {
	j := &journal{}
	injected := errors.New("injected")
	cFailed := make(chan struct{})
	c := j.step("c", []string{"b"}, injected)
	cDo := c.Do
	c.Do = func(ctx context.Context) error { defer close(cFailed); return cDo(ctx) }
	steps := []Step{
		j.step("a", nil, nil),
		j.step("b", []string{"a"}, nil),
		c,
		j.step("d", []string{"c"}, nil),
		// No undo; still running when c fails, so it finishes last.
		{Name: "e", After: []string{"a"}, Do: func(context.Context) error { <-cFailed; j.add("e"); return nil }},
	}
	var r Runner
	res, err := r.Run(context.Background(), "test", steps)
	var te *types.Error
	if !errors.As(err, &te) || te.Code != 101 || te.Msg != "doing c" || te.Details != "injected" {
		t.Fatalf("error %#v, want step c's", err)
	}
	got := j.get()
	if i := slices.Index(got, "e"); i < 0 || !slices.Contains(got[i:], "undo c") {
		t.Errorf("undo began before the running step e finished: %v", got)
	}
	var undos []string
	for _, s := range got {
		if strings.HasPrefix(s, "undo ") {
			undos = append(undos, s)
		}
	}
	if d := cmp.Diff([]string{"undo c", "undo b", "undo a"}, undos); d != "" {
		t.Errorf("undos (-want +got):\n%s", d)
	}
	if slices.Contains(got, "d") {
		t.Error("d ran after its prerequisite failed")
	}
	if _, ok := res.Timing("d"); ok {
		t.Error("a timing for d, which did not run")
	}
	if tm, _ := res.Timing("c"); !errors.Is(tm.Err, injected) {
		t.Errorf("c's timing carries %v", tm.Err)
	}
}

// A step that panics fails like any other, in the caller's goroutine (the
// first step) or in one of its own: the steps that ran are undone (an
// undo that panics too does not stop the others), the error is
// ErrInternal naming the step and the panic, and Panicked gets the stack.
func TestRunnerPanicIsAFailure(t *testing.T) {
	for _, first := range []bool{true, false} {
		j := &journal{}
		boom := Step{Name: "boom", Code: 150, Msg: "booming", Do: func(context.Context) error { panic("kaboom") },
			Undo: func(context.Context) error { j.add("undo boom"); panic("undo kaboom") }}
		var steps []Step
		if first {
			steps = []Step{boom, j.step("a", nil, nil)}
		} else {
			boom.After = []string{"a"}
			steps = []Step{j.step("a", nil, nil), boom}
		}
		var panics []string
		var mu sync.Mutex
		r := Runner{Panicked: func(plan, step string, v any, stack []byte) {
			mu.Lock()
			defer mu.Unlock()
			panics = append(panics, fmt.Sprintf("%s/%s: %v", plan, step, v))
			if !strings.Contains(string(stack), "plan_test.go") {
				t.Errorf("stack of %s lacks the panicking function:\n%s", step, stack)
			}
		}}
		res, err := r.Run(context.Background(), "test", steps)
		var te *types.Error
		if !errors.As(err, &te) || te.Code != types.ErrInternal || te.Msg != "step boom panicked" || te.Details != "kaboom" {
			t.Fatalf("first=%v: error %#v, want ErrInternal naming boom's panic", first, err)
		}
		if got := j.get(); !slices.Contains(got, "undo a") || !slices.Contains(got, "undo boom") {
			t.Errorf("first=%v: journal %v, want a and the panicking step undone", first, got)
		}
		if res.UndoErr == nil || !strings.Contains(res.UndoErr.Error(), "undo kaboom") {
			t.Errorf("first=%v: undo error %v, want the undo's panic", first, res.UndoErr)
		}
		if d := cmp.Diff([]string{"test/boom: kaboom", "test/undo boom: undo kaboom"}, panics); d != "" {
			t.Errorf("first=%v: Panicked (-want +got):\n%s", first, d)
		}
	}
}

// The failure reported is that of the earliest failed step in the plan,
// whatever order they failed in; a *types.Error a step returns is kept.
func TestRunnerErrorOfFirstFailedStepInPlanOrder(t *testing.T) {
	own := &types.Error{Code: types.ErrInvalidNetworkConfig, Msg: "its own"}
	release := make(chan struct{})
	steps := []Step{
		{Name: "first", Code: 100, Do: func(context.Context) error { <-release; return own }},
		{Name: "second", Code: 101, Do: func(context.Context) error { defer close(release); return errors.New("second") }},
	}
	var r Runner
	_, err := r.Run(context.Background(), "test", steps)
	if err != own {
		t.Fatalf("error %v, want the first step's own", err)
	}
}

func TestRunnerFaultByName(t *testing.T) {
	j := &journal{}
	injected := errors.New("injected at b")
	r := Runner{Fault: func(step string) error {
		if step == "b" {
			return injected
		}
		return nil
	}}
	var observed []string
	var mu sync.Mutex
	r.Observe = func(plan string, tm Timing) {
		mu.Lock()
		defer mu.Unlock()
		observed = append(observed, plan+"/"+tm.Name)
	}
	_, err := r.Run(context.Background(), "add", []Step{j.step("a", nil, nil), j.step("b", []string{"a"}, nil), j.step("c", []string{"b"}, nil)})
	var te *types.Error
	if !errors.As(err, &te) || te.Code != 101 || te.Details != injected.Error() {
		t.Fatalf("error %#v, want b's code with the injected failure", err)
	}
	if d := cmp.Diff([]string{"a", "b", "undo b", "undo a"}, j.get()); d != "" {
		t.Errorf("journal (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"add/a", "add/b"}, observed); d != "" {
		t.Errorf("observed (-want +got):\n%s", d)
	}
}

// The undo runs under a fresh deadline, detached from a request context
// that was cancelled (it may be what failed).
func TestRunnerUndoAfterCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var undoErr error
	var deadline time.Time
	steps := []Step{
		{Name: "a", Do: func(context.Context) error { return nil }, Undo: func(uctx context.Context) error {
			undoErr = uctx.Err()
			deadline, _ = uctx.Deadline()
			return errors.New("left something")
		}},
		{Name: "b", After: []string{"a"}, Code: 102, Do: func(ctx context.Context) error {
			cancel()
			return ctx.Err()
		}},
	}
	var r Runner
	res, err := r.Run(ctx, "test", steps)
	var te *types.Error
	if !errors.As(err, &te) || te.Code != 102 {
		t.Fatalf("error %#v, want b's", err)
	}
	if undoErr != nil {
		t.Errorf("the undo's context was done: %v", undoErr)
	}
	if time.Until(deadline) <= 0 || time.Until(deadline) > UndoTimeout {
		t.Errorf("undo deadline %v, want within %v", deadline, UndoTimeout)
	}
	if res.UndoErr == nil || !strings.Contains(res.UndoErr.Error(), "undoing a: left something") {
		t.Errorf("undo error %v", res.UndoErr)
	}
}

// A detached step (a wait) is cancelled when another step fails.
func TestRunnerDetachedCancelledOnFailure(t *testing.T) {
	steps := []Step{
		{Name: "wait", Detached: true, Do: func(ctx context.Context) error {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(10 * time.Second):
				return errors.New("not cancelled")
			}
		}},
		{Name: "fail", Code: 100, Do: func(context.Context) error { return errors.New("failed") }},
	}
	var r Runner
	res, err := r.Run(context.Background(), "test", steps)
	if err == nil {
		t.Fatal("no error")
	}
	if tm, _ := res.Timing("wait"); tm.Err != nil {
		t.Errorf("wait: %v", tm.Err)
	}
}

func TestRunAllKeepsGoing(t *testing.T) {
	j := &journal{}
	steps := []Step{
		j.step("read", nil, nil),
		j.step("x", []string{"read"}, errors.New("x failed")),
		j.step("y", []string{"read"}, errors.New("y failed")),
		j.step("z", []string{"read"}, nil),
		j.step("after-x", []string{"x"}, nil),
	}
	var r Runner
	_, err := r.RunAll(context.Background(), "del", steps)
	if err == nil || !strings.Contains(err.Error(), "x: x failed") || !strings.Contains(err.Error(), "y: y failed") {
		t.Fatalf("error %v, want both failures", err)
	}
	got := j.get()
	slices.Sort(got)
	if d := cmp.Diff([]string{"read", "x", "y", "z"}, got); d != "" {
		t.Errorf("journal (-want +got):\n%s", d)
	}
}

func TestRunnerRejectsBadPlans(t *testing.T) {
	nop := func(context.Context) error { return nil }
	for name, steps := range map[string][]Step{
		"unknown prerequisite": {{Name: "a", After: []string{"b"}, Do: nop}},
		"later prerequisite":   {{Name: "a", After: []string{"b"}, Do: nop}, {Name: "b", Do: nop}},
		"twice":                {{Name: "a", Do: nop}, {Name: "a", Do: nop}},
		"no Do":                {{Name: "a"}},
	} {
		var r Runner
		if _, err := r.Run(context.Background(), "test", steps); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
