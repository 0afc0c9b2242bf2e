// Package callorder runs weft's unnamed ops one at a time, each from the OS thread that
// holds the C library's call order. The library matches unnamed ops across ranks by their
// order on one thread (weft_init's) and refuses them from any other; goroutines move
// between threads at will, so before each unnamed op the package locks the goroutine to
// its thread and claims the order for that thread (weft_comm_claim_call_order), under one
// mutex so that no two unnamed ops run at once. Package weft (Init and every unnamed op)
// and package weft/trainer (whose calls contain unnamed ops) both go through Run.
package callorder

import (
	"runtime"
	"sync"

	"weft.dev/weft/internal/cweft"
)

var mu sync.Mutex

// Run runs f as described above and returns its result. Callers that reach it
// concurrently run in the order they get the mutex, which can differ across ranks.
func Run(f func() error) error {
	mu.Lock()
	defer mu.Unlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cweft.Weft_comm_claim_call_order() // before weft_init it does nothing
	return f()
}
