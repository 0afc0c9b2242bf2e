package weft

import (
	"errors"
	"fmt"
	"runtime"

	"weft.dev/weft/internal/callorder"
	"weft.dev/weft/internal/cweft"
)

// Status is a weft status code; the values are those of weft_status in weft.h.
type Status int

// The status codes of the C ABI (explicit values: they never change).
const (
	OK                 Status = 0
	InvalidArgument    Status = 1  // bad shape, dtype, rank, weight, name, option
	FailedPrecondition Status = 2  // not initialized, ops in flight, mismatched ranks
	NotFound           Status = 3  // no such window or named object
	OutOfRange         Status = 4  // a buffer is too small
	Unimplemented      Status = 5  // not supported by this build or device
	DeadlineExceeded   Status = 6  // a stall passed WEFT_STALL_TIMEOUT_SECONDS
	Aborted            Status = 7  // the op was abandoned (shutdown, a peer failed)
	Unavailable        Status = 8  // a peer or transport is unreachable
	ResourceExhausted  Status = 9  // out of memory
	Internal           Status = 10 // a bug in weft or in the library below it
	Unknown            Status = 11
)

// String is the generic text of the status ("invalid argument"), from the library.
func (s Status) String() string {
	return cweft.Weft_status_string(cweft.Enum_SS_weft_status(s))
}

// Error is a failed weft call: its status and the library's message (what was expected and
// what was found). Compare with errors.Is against the Err* sentinels, or use StatusOf.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "weft: " + e.Status.String()
	}
	return "weft: " + e.Status.String() + ": " + e.Message
}

// Is makes errors.Is(err, ErrInvalidArgument) (and the other sentinels) match any *Error of
// that status. A target with a message matches only the same status and message.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Status == e.Status && (t.Message == "" || t.Message == e.Message)
}

// Sentinels for errors.Is, one per status.
var (
	ErrInvalidArgument    = &Error{Status: InvalidArgument}
	ErrFailedPrecondition = &Error{Status: FailedPrecondition}
	ErrNotFound           = &Error{Status: NotFound}
	ErrOutOfRange         = &Error{Status: OutOfRange}
	ErrUnimplemented      = &Error{Status: Unimplemented}
	ErrDeadlineExceeded   = &Error{Status: DeadlineExceeded}
	ErrAborted            = &Error{Status: Aborted}
	ErrUnavailable        = &Error{Status: Unavailable}
	ErrResourceExhausted  = &Error{Status: ResourceExhausted}
	ErrInternal           = &Error{Status: Internal}
	ErrUnknown            = &Error{Status: Unknown}
)

// StatusOf returns OK for nil, the status of a *Error anywhere in err's chain, and Unknown
// for any other error.
func StatusOf(err error) Status {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return Unknown
}

type cstatus = cweft.Enum_SS_weft_status

// call runs one C ABI call and turns a failure into an *Error. weft_last_error() is
// thread-local in C and Go moves goroutines between threads at any call, so the goroutine
// stays on its thread from the call until the message has been read.
func call(f func() cstatus) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if st := Status(f()); st != OK {
		return &Error{Status: st, Message: cweft.Weft_last_error()}
	}
	return nil
}

// Unnamed ops are matched across ranks by their order on the thread that called weft_init
// (the C library refuses them from any other thread, where the order could differ across
// ranks). Go moves goroutines between threads at will, so Init and every unnamed op run
// through package internal/callorder (shared with package trainer): one at a time, each
// locked to its thread after claiming the order for it. Several goroutines issuing unnamed
// ops at once still get an arbitrary order: name those ops.
func onInitThread(f func() error) error { return callorder.Run(f) }

// ordered is call for an op: on the Init thread when the op is unnamed ("").
func ordered(name string, f func() cstatus) error {
	if name != "" {
		return call(f)
	}
	return onInitThread(func() error { return call(f) })
}

// invalid is an InvalidArgument error found by the binding itself, before any C call.
func invalid(format string, args ...any) error {
	return &Error{Status: InvalidArgument, Message: fmt.Sprintf(format, args...)}
}
