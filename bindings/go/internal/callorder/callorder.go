// Package initthread runs functions on the one OS thread weft.Init ran on. The C library
// matches unnamed ops across ranks by their order on that thread and refuses them from any
// other; Go moves goroutines between threads at will, so package weft (Init and every
// unnamed op) and package weft/trainer (whose calls contain unnamed ops) send them all
// here, in the order their callers arrive.
package initthread

import "runtime"

var work = make(chan func())

func init() {
	go func() {
		runtime.LockOSThread() // for the life of the process
		for f := range work {
			f()
		}
	}()
}

// Run runs f on the init thread and returns its result.
func Run(f func() error) error {
	done := make(chan error, 1)
	work <- func() { done <- f() }
	return <-done
}
