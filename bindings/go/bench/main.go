// The Go side of bench/run_binding_bench.sh: the per-call time of weft.Allreduce and
// weft.NeighborAllreduce from Go on float32 slices, with the protocol of
// bench/binding_bench.cc (20 warm-up calls; 5 repetitions of K calls; a repetition's time
// is the slowest rank's mean; the median of the 5 is reported as a "BENCH" line).
package main

import (
	"fmt"
	"os"
	"sort"
	"time"

	"weft.dev/weft"
)

const (
	warmup      = 20
	repetitions = 5
)

func callsFor(bytes int) int {
	if bytes >= 16<<20 {
		return 20
	}
	if bytes >= 1<<20 {
		return 200
	}
	return 2000
}

func must(err error) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "binding bench (go), rank %d: %v\n", weft.Rank(), err)
		os.Exit(1)
	}
}

func medianMicros(bytes int, op func() error) float64 {
	for i := 0; i < warmup; i++ {
		must(op())
	}
	calls := callsFor(bytes)
	reps := make([]float64, 0, repetitions)
	for rep := 0; rep < repetitions; rep++ {
		must(weft.Barrier())
		start := time.Now()
		for i := 0; i < calls; i++ {
			must(op())
		}
		us := float64(time.Since(start).Nanoseconds()) / 1e3 / float64(calls)
		all, err := weft.Allgather([]float64{us})
		must(err)
		slowest := all[0]
		for _, v := range all {
			if v > slowest {
				slowest = v
			}
		}
		reps = append(reps, slowest)
	}
	sort.Float64s(reps)
	return reps[len(reps)/2]
}

func main() {
	must(weft.Init())
	for _, opName := range []string{"allreduce", "neighbor_allreduce"} {
		for _, bytes := range []int{4, 4096, 1 << 20, 16 << 20} {
			in := make([]float32, bytes/4)
			out := make([]float32, bytes/4)
			for i := range in {
				in[i] = 1
			}
			op := func() error { return weft.Allreduce(in, out) }
			if opName == "neighbor_allreduce" {
				op = func() error { return weft.NeighborAllreduce(in, out) }
			}
			us := medianMicros(bytes, op)
			if weft.Rank() == 0 {
				fmt.Printf("BENCH lang=go input=[]float32 op=%s bytes=%d us=%.2f\n", opName, bytes, us)
			}
		}
	}
	must(weft.Shutdown())
	must(weft.Finalize())
}
