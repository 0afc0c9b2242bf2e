package weft_test

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"weft.dev/weft"
)

// The step counter of num_steps_per_communication (docs/optim.md). It is
// plain data: every rank runs the same checks, with no communication.

// mustCounter(t)(weft.NewStepCounter(...)) fails the test on an error and closes the
// counter at the end of the test.
func mustCounter(t *testing.T) func(*weft.StepCounter, error) *weft.StepCounter {
	return func(c *weft.StepCounter, err error) *weft.StepCounter {
		t.Helper()
		must(t, err, "NewStepCounter")
		t.Cleanup(c.Close)
		return c
	}
}

// runPattern runs pattern (F: a counted computation of unit 0, S / s: a step expected to
// communicate / not, ' ': nothing) through c and returns the 1-based numbers of the
// computations that came back ComputationMisuse.
func runPattern(t *testing.T, c *weft.StepCounter, pattern string) []int {
	t.Helper()
	misuses := []int{}
	f := 0
	for i, ch := range pattern {
		switch ch {
		case ' ':
		case 'F':
			f++
			e, err := c.Computation(0, true)
			must(t, err, fmt.Sprintf("%q: computation %d", pattern, f))
			if e == weft.ComputationIgnored {
				t.Fatalf("%q: computation %d was ignored", pattern, f)
			}
			if e == weft.ComputationMisuse {
				misuses = append(misuses, f)
			}
		default:
			communicate, err := c.Step()
			must(t, err, fmt.Sprintf("%q: step at %d", pattern, i))
			if communicate != (ch == 'S') {
				t.Fatalf("%q: position %d: expected an %c, the step returned communicate = %v",
					pattern, i, ch, communicate)
			}
		}
	}
	return misuses
}

func expectCountdown(t *testing.T, c *weft.StepCounter, unit int, want int64) {
	t.Helper()
	got, err := c.Countdown(unit)
	if err != nil || got != want {
		t.Errorf("Countdown(%d) = %d, %v; want %d", unit, got, err, want)
	}
}

func expectEvent(t *testing.T, c *weft.StepCounter, unit int, counted bool, want weft.ComputationEvent) {
	t.Helper()
	got, err := c.Computation(unit, counted)
	if err != nil || got != want {
		t.Errorf("Computation(%d, %v) = %v, %v; want %v", unit, counted, got, err, want)
	}
}

func expectStep(t *testing.T, c *weft.StepCounter, want bool) {
	t.Helper()
	got, err := c.Step()
	if err != nil || got != want {
		t.Errorf("Step() = %v, %v; want %v", got, err, want)
	}
}

func TestStepCounterAdmissiblePatterns(t *testing.T) {
	// The design's admissible patterns with J = 3, a few rounds in a row, and the drifting
	// case (4 mini-batches per batch, a step after each), which is silent by design.
	for _, p := range []string{"FFFS", "FsFsFS", "FFsFS", "FsFFS", "FFFS FFFS",
		"FsFsFS FFsFS", "FsFsFSFs FsFSFsFs"} {
		c := mustCounter(t)(weft.NewStepCounter(3, weft.CountForward, 1))
		if m := runPattern(t, c, p); len(m) != 0 {
			t.Errorf("%q: misuse at computations %v", p, m)
		}
		if w := c.MisuseWarning(); w != "" {
			t.Errorf("%q: MisuseWarning() = %q", p, w)
		}
	}
}

func TestStepCounterMisuseWarnsAtTheFourthComputation(t *testing.T) {
	for _, k := range []struct {
		pattern string
		misuses []int
	}{{"FFFFS", []int{4}}, {"FFsFFS", []int{4}}, {"FFFFFS", []int{4, 5}},
		{"FFFFS FFFS", []int{4}}} {
		c := mustCounter(t)(weft.NewStepCounter(3, weft.CountForward, 1))
		if m := runPattern(t, c, k.pattern); !reflect.DeepEqual(m, k.misuses) {
			t.Errorf("%q: misuses at computations %v, want %v", k.pattern, m, k.misuses)
		}
		// The warning is the last misuse's.
		last := k.misuses[len(k.misuses)-1]
		w := c.MisuseWarning()
		for _, part := range []string{"num_steps_per_communication", "does not matter",
			fmt.Sprintf("forward computation just counted is number %d", last)} {
			if !strings.Contains(w, part) {
				t.Errorf("%q: MisuseWarning() lacks %q: %q", k.pattern, part, w)
			}
		}
		if strings.Contains(w, "backward") {
			t.Errorf("%q: a forward counter's warning names backward: %q", k.pattern, w)
		}
	}
}

func TestStepCounterCountdownAndCounts(t *testing.T) {
	c := mustCounter(t)(weft.NewStepCounter(3, weft.CountForward, 1))
	if j := c.StepsPerCommunication(); j != 3 {
		t.Errorf("StepsPerCommunication() = %d, want 3", j)
	}
	expectCountdown(t, c, 0, 3)
	if total, since := c.Computations(); total != 0 || since != 0 {
		t.Errorf("Computations() = %d, %d before any", total, since)
	}
	expectEvent(t, c, 0, true, weft.ComputationCounted)
	expectCountdown(t, c, 0, 2)
	expectEvent(t, c, 0, false, weft.ComputationIgnored) // under no-grad: nothing changes
	expectEvent(t, c, 0, true, weft.ComputationCounted)
	expectCountdown(t, c, 0, 1)
	expectStep(t, c, false)
	expectCountdown(t, c, 0, 1) // a local step does not reset
	expectEvent(t, c, 0, true, weft.ComputationCommunicate)
	expectCountdown(t, c, 0, 0)
	if total, since := c.Computations(); total != 3 || since != 3 {
		t.Errorf("Computations() = %d, %d; want 3, 3", total, since)
	}
	expectEvent(t, c, 0, false, weft.ComputationIgnored) // no misuse either
	expectStep(t, c, true)
	expectCountdown(t, c, 0, 3)
	if total, since := c.Computations(); total != 3 || since != 0 {
		t.Errorf("Computations() after the S = %d, %d; want 3, 0", total, since)
	}
	// Past the countdown, it stays at 0.
	runPattern(t, c, "FFFFF")
	expectCountdown(t, c, 0, 0)
	runPattern(t, c, "S")
}

func TestStepCounterChangingJ(t *testing.T) {
	c := mustCounter(t)(weft.NewStepCounter(3, weft.CountForward, 1))
	must(t, c.SetStepsPerCommunication(2), "SetStepsPerCommunication(2)") // nothing counted: at once
	if j := c.StepsPerCommunication(); j != 2 {
		t.Errorf("StepsPerCommunication() = %d, want 2", j)
	}
	runPattern(t, c, "FFS F")
	must(t, c.SetStepsPerCommunication(1), "SetStepsPerCommunication(1)") // mid-round: next S
	if j := c.StepsPerCommunication(); j != 2 {
		t.Errorf("StepsPerCommunication() mid-round = %d, want 2", j)
	}
	if m := runPattern(t, c, "sFS FS FS"); len(m) != 0 {
		t.Errorf("misuses %v", m)
	}
	if j := c.StepsPerCommunication(); j != 1 {
		t.Errorf("StepsPerCommunication() = %d, want 1", j)
	}
	expectStatus(t, "SetStepsPerCommunication(0)", c.SetStepsPerCommunication(0),
		weft.InvalidArgument, "num_steps_per_communication must be at least 1, got 0")
	if j := c.StepsPerCommunication(); j != 1 {
		t.Errorf("StepsPerCommunication() after a refused change = %d, want 1", j)
	}
}

func TestStepCounterStepBeforeAnyComputation(t *testing.T) {
	for _, kind := range []weft.CountKind{weft.CountForward, weft.CountBackward} {
		c := mustCounter(t)(weft.NewStepCounter(1, kind, 1))
		expectEvent(t, c, 0, false, weft.ComputationIgnored) // under no-grad: still nothing
		communicate, err := c.Step()
		expectStatus(t, kind.String()+": Step before any computation", err,
			weft.FailedPrecondition, "before any counted "+kind.String()+" computation")
		if communicate {
			t.Errorf("%v: a failed Step says communicate", kind)
		}
		// Once something was counted, a step with nothing new is a plain local step.
		runPattern(t, c, "FSs")
	}
}

func TestStepCounterBadArguments(t *testing.T) {
	_, err := weft.NewStepCounter(0, weft.CountForward, 1)
	expectStatus(t, "NewStepCounter with J = 0", err, weft.InvalidArgument,
		"num_steps_per_communication must be at least 1, got 0")
	_, err = weft.NewStepCounter(-2, weft.CountBackward, 1)
	expectStatus(t, "NewStepCounter with J = -2", err, weft.InvalidArgument, "got -2")
	_, err = weft.NewStepCounter(3, weft.CountForward, 0)
	expectStatus(t, "NewStepCounter with 0 units", err, weft.InvalidArgument, "at least one unit")
	_, err = weft.NewStepCounter(3, weft.CountKind(7), 1)
	expectStatus(t, "NewStepCounter counting kind 7", err, weft.InvalidArgument,
		"WEFT_COUNT_FORWARD or WEFT_COUNT_BACKWARD")
	_, err = weft.NewStepCounter(3, weft.CountForward, math.MaxInt32+2)
	expectStatus(t, "NewStepCounter with too many units", err, weft.InvalidArgument, "C int")

	c := mustCounter(t)(weft.NewStepCounter(2, weft.CountBackward, 2))
	for _, unit := range []int{2, -1, 1 << 32} { // 1 << 32 would wrap to unit 0 in C
		_, err = c.Computation(unit, true)
		expectStatus(t, fmt.Sprintf("Computation(%d)", unit), err, weft.InvalidArgument,
			"out of range")
		_, err = c.Countdown(unit)
		expectStatus(t, fmt.Sprintf("Countdown(%d)", unit), err, weft.InvalidArgument,
			"out of range")
	}
	expectCountdown(t, c, 0, 2)
	if total, _ := c.Computations(); total != 0 {
		t.Errorf("a refused computation was counted: %d", total)
	}
}

func TestStepCounterUnitsCountDownSeparately(t *testing.T) {
	// Three parameters, backward counting, J = 2.
	c := mustCounter(t)(weft.NewStepCounter(2, weft.CountBackward, 3))
	for _, u := range []int{2, 1, 0} {
		expectEvent(t, c, u, true, weft.ComputationCounted)
	}
	expectStep(t, c, false)
	for _, u := range []int{2, 1} {
		expectEvent(t, c, u, true, weft.ComputationCommunicate)
	}
	expectCountdown(t, c, 1, 0)
	expectCountdown(t, c, 0, 1)
	expectEvent(t, c, 0, true, weft.ComputationCommunicate)
	if w := c.MisuseWarning(); w != "" {
		t.Errorf("MisuseWarning() before any misuse = %q", w)
	}
	// A third pass before the step: one warning for the pass, from the first unit that
	// sees it.
	expectEvent(t, c, 1, true, weft.ComputationMisuse)
	expectEvent(t, c, 0, true, weft.ComputationCounted)
	expectEvent(t, c, 2, true, weft.ComputationCounted)
	w := c.MisuseWarning()
	for _, part := range []string{"backward computation just counted is number 3",
		"expected a step() after 2 counted backward computations", "num_steps_per_communication"} {
		if !strings.Contains(w, part) {
			t.Errorf("MisuseWarning() lacks %q: %q", part, w)
		}
	}
	if strings.Contains(w, "forward") {
		t.Errorf("a backward counter's warning names forward: %q", w)
	}
	// A fourth pass warns again.
	expectEvent(t, c, 2, true, weft.ComputationMisuse)
	if total, since := c.Computations(); total != 4 || since != 4 {
		t.Errorf("Computations() = %d, %d; want 4, 4", total, since)
	}
	expectStep(t, c, true)
	for u := 0; u < 3; u++ {
		expectCountdown(t, c, u, 2)
	}
	// A unit that never reaches 0 (an unused parameter) does not hold back the S.
	expectEvent(t, c, 0, true, weft.ComputationCounted)
	expectEvent(t, c, 0, true, weft.ComputationCommunicate)
	expectCountdown(t, c, 1, 2)
	expectStep(t, c, true)
}

func TestStepCounterClose(t *testing.T) {
	c, err := weft.NewStepCounter(2, weft.CountForward, 1)
	must(t, err, "NewStepCounter")
	runPattern(t, c, "FF")
	c.Close()
	c.Close()
	_, err = c.Computation(0, true)
	expectStatus(t, "Computation after Close", err, weft.FailedPrecondition, "closed")
	_, err = c.Step()
	expectStatus(t, "Step after Close", err, weft.FailedPrecondition, "closed")
	expectStatus(t, "SetStepsPerCommunication after Close", c.SetStepsPerCommunication(3),
		weft.FailedPrecondition, "closed")
	_, err = c.Countdown(0)
	expectStatus(t, "Countdown after Close", err, weft.FailedPrecondition, "closed")
	if j := c.StepsPerCommunication(); j != 0 {
		t.Errorf("StepsPerCommunication() after Close = %d", j)
	}
	if total, since := c.Computations(); total != 0 || since != 0 {
		t.Errorf("Computations() after Close = %d, %d", total, since)
	}
	if w := c.MisuseWarning(); w != "" {
		t.Errorf("MisuseWarning() after Close = %q", w)
	}
	var none *weft.StepCounter
	none.Close()
	_, err = none.Step()
	expectStatus(t, "Step on a nil counter", err, weft.FailedPrecondition, "closed")
}

func TestStepCounterNames(t *testing.T) {
	for _, k := range []struct {
		got, want string
	}{
		{weft.CountForward.String(), "forward"},
		{weft.CountBackward.String(), "backward"},
		{weft.CountKind(5).String(), "CountKind(5)"},
		{weft.ComputationIgnored.String(), "ignored"},
		{weft.ComputationCounted.String(), "counted"},
		{weft.ComputationCommunicate.String(), "communicate"},
		{weft.ComputationMisuse.String(), "misuse"},
		{weft.ComputationEvent(9).String(), "ComputationEvent(9)"},
	} {
		if k.got != k.want {
			t.Errorf("String() = %q, want %q", k.got, k.want)
		}
	}
}
