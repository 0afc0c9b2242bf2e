package weft

import (
	"runtime"
	"sync"
	"unsafe"

	"weft.dev/weft/internal/cweft"
)

type reqHandle = cweft.SwigcptrStruct_SS_weft_request

// Request is a nonblocking op in flight.
//
// cgo forbids C from keeping a pointer to Go memory after a call returns, and a nonblocking
// op uses its buffers until it completes. So the op runs on C memory: the input is copied
// there when the op starts (the caller may reuse its input slice at once), and the result
// is copied into the caller's output slice when Wait (or a Poll that sees completion)
// returns. The output slice must not be used until then.
//
// Wait or Poll release the C resources once the op has completed; Free gives up on the
// result early (the op still completes on every rank, and its C memory is freed after
// that). A finalizer calls Free for a Request that is dropped. The methods may be called
// from several goroutines.
type Request struct {
	mu     sync.Mutex
	h      reqHandle      // 0 once released
	buf    unsafe.Pointer // C memory the op reads and writes; nil for none
	finish func(h reqHandle) error
	done   bool // completed; err is its outcome
	err    error
	freed  bool
}

func newRequest(h reqHandle, buf unsafe.Pointer, finish func(reqHandle) error) *Request {
	r := &Request{h: h, buf: buf, finish: finish}
	runtime.SetFinalizer(r, (*Request).Free)
	return r
}

// Poll reports whether the op has completed; once it has, err is the op's outcome (nil on
// success, with the output written) and later calls return the same.
func (r *Request) Poll() (done bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return true, r.err
	}
	if r.freed {
		return false, errFreed("Poll")
	}
	var flag int32
	if err := call(func() cstatus { return cweft.Weft_request_poll(&flag, r.h) }); err != nil {
		return false, err
	}
	if flag == 0 {
		return false, nil
	}
	r.complete()
	return true, r.err
}

// Wait blocks until the op has completed and returns its outcome; waiting again returns
// the same.
func (r *Request) Wait() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return r.err
	}
	if r.freed {
		return errFreed("Wait")
	}
	r.complete()
	return r.err
}

// complete waits for the op (at once if it is done), delivers its result and releases
// everything. Holds r.mu.
func (r *Request) complete() {
	h := r.h
	err := call(func() cstatus { return cweft.Weft_request_wait(h) })
	if err == nil && r.finish != nil {
		err = r.finish(h)
	}
	// The op has completed: the engine is done with the buffers.
	cweft.Weft_request_free(h)
	if r.buf != nil {
		cweft.Weftgo_free(r.buf)
	}
	r.h, r.buf, r.finish = 0, nil, nil
	r.done, r.err = true, err
	runtime.SetFinalizer(r, nil)
}

// Free releases the request without waiting. If the op has not completed, its result is
// dropped (the output slice is never written) and Wait/Poll then fail; the op itself still
// runs to completion on every rank. Freeing twice, or after completion, does nothing.
func (r *Request) Free() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done || r.freed {
		return
	}
	if r.buf != nil {
		buf := r.buf
		// The engine frees buf once the op has completed and the handle is gone.
		err := call(func() cstatus { return cweft.Weftgo_request_free_after_completion(r.h, buf) })
		if err != nil {
			// Cannot hand it over: wait, so that freeing it cannot pull memory from under the
			// engine.
			h := r.h
			_ = call(func() cstatus { return cweft.Weft_request_wait(h) })
			cweft.Weftgo_free(buf)
		}
	}
	cweft.Weft_request_free(r.h)
	r.h, r.buf, r.finish = 0, nil, nil
	r.freed = true
	runtime.SetFinalizer(r, nil)
}

func errFreed(method string) error {
	return &Error{Status: FailedPrecondition,
		Message: "weft.Request." + method + ": the request was freed before it completed"}
}

// GatherRequest is a nonblocking allgather: a Request whose Result is the gathered slice.
type GatherRequest[T Element] struct {
	*Request
	result *[]T // set when the op completes
}

// Result waits for the op and returns the gathered slice.
func (g *GatherRequest[T]) Result() ([]T, error) {
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return *g.result, nil
}

// RecvRequest is a nonblocking RecvAny: a Request whose Result is the received slice and
// the sender's shape.
type RecvRequest[T Element] struct {
	*Request
	result *received[T] // set when the op completes
}

type received[T Element] struct {
	data  []T
	shape []int64
}

// Result waits for the op and returns the received slice and its shape.
func (r *RecvRequest[T]) Result() ([]T, []int64, error) {
	if err := r.Wait(); err != nil {
		return nil, nil, err
	}
	return r.result.data, r.result.shape, nil
}
