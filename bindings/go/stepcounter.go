package weft

import (
	"fmt"
	"runtime"

	"weft.dev/weft/internal/cconv"
	"weft.dev/weft/internal/cweft"
)

// ---- the step counter (num_steps_per_communication) --------------------------------------

// CountKind is what a StepCounter counts: the computations its optimizer sees.
type CountKind int

// The kinds of computation (the values of weft_count_kind in weft.h).
const (
	// CountForward: forward computations (adapt-with-combine, window and push-sum
	// optimizers).
	CountForward CountKind = 0
	// CountBackward: backward computations (adapt-then-combine, gradient allreduce), one unit
	// per parameter.
	CountBackward CountKind = 1
)

// String is "forward" or "backward".
func (k CountKind) String() string {
	switch k {
	case CountForward:
		return "forward"
	case CountBackward:
		return "backward"
	}
	return fmt.Sprintf("CountKind(%d)", int(k))
}

// ComputationEvent is what one computation did to a StepCounter.
type ComputationEvent int

// The events (the values of weft_computation_event in weft.h).
const (
	// ComputationIgnored: not counted (under no-grad, or no parameter requires grad).
	ComputationIgnored ComputationEvent = 0
	// ComputationCounted: counted; the countdown has not reached 0.
	ComputationCounted ComputationEvent = 1
	// ComputationCommunicate: counted, and it brought the countdown to 0: start the
	// communication now.
	ComputationCommunicate ComputationEvent = 2
	// ComputationMisuse: counted while the countdown was already 0 (no communicating Step
	// since J computations): warn the user with MisuseWarning.
	ComputationMisuse ComputationEvent = 3
)

// String is "ignored", "counted", "communicate" or "misuse".
func (e ComputationEvent) String() string {
	switch e {
	case ComputationIgnored:
		return "ignored"
	case ComputationCounted:
		return "counted"
	case ComputationCommunicate:
		return "communicate"
	case ComputationMisuse:
		return "misuse"
	}
	return fmt.Sprintf("ComputationEvent(%d)", int(e))
}

type stepCounterHandle = cweft.SwigcptrStruct_SS_weft_step_counter

// StepCounter is the state machine behind a distributed optimizer's
// num_steps_per_communication (J), the same one every language's optimizers use
// (weft_step_counter_* in weft.h): each counted computation brings a countdown from J
// towards 0, and the one that reaches 0 starts the communication; a Step after that
// communicates (waits, combines, and the countdown starts again from J), a Step before is a
// local update. A counted computation with the countdown already at 0 is a misuse, reported
// as ComputationMisuse with a warning for the user (MisuseWarning).
//
// Units: an optimizer that counts backward computations launches each parameter's
// communication as its gradient is ready, so it gives each parameter a unit; each unit
// counts down on its own, and a pass that finds units at 0 is one misuse, reported once.
//
// It is plain data (usable before Init) held in C memory: Close frees it (a finalizer does
// so if Close is forgotten). Not safe for concurrent use.
type StepCounter struct {
	h stepCounterHandle // 0 once closed
}

// NewStepCounter returns a counter that communicates every stepsPerCommunication (>= 1)
// counted computations of kind counts, over units (>= 1) units (1 for a forward-counting
// optimizer, the number of parameters for a backward-counting one).
func NewStepCounter(stepsPerCommunication int64, counts CountKind, units int) (*StepCounter, error) {
	if !cconv.FitsCInt(units) {
		return nil, invalid("weft.NewStepCounter: %d units do not fit a C int", units)
	}
	var h stepCounterHandle
	err := call(func() cstatus {
		return cweft.Weft_step_counter_create(&h, stepsPerCommunication,
			cweft.Enum_SS_weft_count_kind(counts), units)
	})
	if err != nil {
		return nil, err
	}
	c := &StepCounter{h: h}
	runtime.SetFinalizer(c, (*StepCounter).Close)
	return c, nil
}

// handle returns the C handle, or an error once closed. Callers keep c alive (KeepAlive)
// until their C call has returned, so that the finalizer cannot free it mid-call.
func (c *StepCounter) handle(method string) (stepCounterHandle, error) {
	if c == nil || c.h == 0 {
		return 0, &Error{Status: FailedPrecondition,
			Message: "weft.StepCounter." + method + ": the step counter was closed"}
	}
	return c.h, nil
}

// fitsCInt: a Go int passed as a C int would wrap (to another unit) if it did not.

// checkUnit rejects a unit that a C int cannot hold; weft checks the rest.
func checkUnit(method string, unit int) error {
	if !cconv.FitsCInt(unit) {
		return invalid("weft.StepCounter.%s: unit %d is out of range", method, unit)
	}
	return nil
}

// Computation records that a computation of unit finished. counted is false for one under
// no-grad, or of a model none of whose parameters requires grad: it changes nothing
// (ComputationIgnored). On ComputationCommunicate the optimizer starts communicating the
// unit; on ComputationMisuse it warns with MisuseWarning. A unit out of range is
// InvalidArgument.
func (c *StepCounter) Computation(unit int, counted bool) (ComputationEvent, error) {
	defer runtime.KeepAlive(c)
	h, err := c.handle("Computation")
	if err != nil {
		return ComputationIgnored, err
	}
	if err := checkUnit("Computation", unit); err != nil {
		return ComputationIgnored, err
	}
	var event int32
	err = call(func() cstatus {
		return cweft.Weft_step_counter_computation(&event, h, unit, cconv.Bool(counted))
	})
	if err != nil {
		return ComputationIgnored, err
	}
	return ComputationEvent(event), nil
}

// Step records a step of the optimizer. communicate is true for a communicating step (some
// unit reached 0 since the last one: wait for what was launched, launch the units still
// counting, combine; the countdowns start again from J), false for a local one. Before any
// counted computation it is a FailedPrecondition error: the optimizer is not seeing the
// model's computations.
func (c *StepCounter) Step() (communicate bool, err error) {
	defer runtime.KeepAlive(c)
	h, err := c.handle("Step")
	if err != nil {
		return false, err
	}
	var result int32
	if err := call(func() cstatus { return cweft.Weft_step_counter_step(&result, h) }); err != nil {
		return false, err
	}
	return result != 0, nil
}

// SetStepsPerCommunication changes J (>= 1). It takes effect at once when no computation was
// counted since the last communicating step, else at the next one.
func (c *StepCounter) SetStepsPerCommunication(stepsPerCommunication int64) error {
	defer runtime.KeepAlive(c)
	h, err := c.handle("SetStepsPerCommunication")
	if err != nil {
		return err
	}
	return call(func() cstatus {
		return cweft.Weft_step_counter_set_steps_per_communication(h, stepsPerCommunication)
	})
}

// StepsPerCommunication is J in force (0 once closed). A change made mid-round shows from
// the next communicating step.
func (c *StepCounter) StepsPerCommunication() int64 {
	defer runtime.KeepAlive(c)
	h, err := c.handle("StepsPerCommunication")
	if err != nil {
		return 0
	}
	var j int64
	if call(func() cstatus { return cweft.Weft_step_counter_steps_per_communication(&j, h) }) != nil {
		return 0
	}
	return j
}

// Countdown is J minus the unit's counted computations since the last communicating step,
// floored at 0 (0: the unit's communication was launched). A unit out of range is
// InvalidArgument.
func (c *StepCounter) Countdown(unit int) (int64, error) {
	defer runtime.KeepAlive(c)
	h, err := c.handle("Countdown")
	if err != nil {
		return 0, err
	}
	if err := checkUnit("Countdown", unit); err != nil {
		return 0, err
	}
	var countdown int64
	err = call(func() cstatus { return cweft.Weft_step_counter_countdown(&countdown, h, unit) })
	return countdown, err
}

// Computations are the counted computations (passes over the units) since the counter was
// made and since the last communicating step (both 0 once closed).
func (c *StepCounter) Computations() (total, sinceCommunication int64) {
	defer runtime.KeepAlive(c)
	h, err := c.handle("Computations")
	if err != nil {
		return 0, 0
	}
	if call(func() cstatus {
		return cweft.Weft_step_counter_computations(&total, &sinceCommunication, h)
	}) != nil {
		return 0, 0
	}
	return total, sinceCommunication
}

// MisuseWarning is the warning for the last ComputationMisuse, in words a user understands
// (what was expected, and that num_steps_per_communication is the knob); "" before any
// misuse and once closed.
func (c *StepCounter) MisuseWarning() string {
	defer runtime.KeepAlive(c)
	h, err := c.handle("MisuseWarning")
	if err != nil {
		return ""
	}
	// The C string lives until the next weft call on this thread: stay on the thread until
	// it is copied, so that no other goroutine's call can come in between.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return cweft.Weft_step_counter_misuse_warning(h)
}

// Close frees the counter; later calls on it fail (or return zero values). Closing twice is
// fine.
func (c *StepCounter) Close() {
	if c == nil || c.h == 0 {
		return
	}
	cweft.Weft_step_counter_destroy(c.h)
	c.h = 0
	runtime.SetFinalizer(c, nil)
}
