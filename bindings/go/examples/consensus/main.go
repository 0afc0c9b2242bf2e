// Command consensus shows decentralized averaging with weft: every rank starts with its own
// vector and, instead of a global allreduce, repeatedly averages with a few neighbors. All
// ranks approach the global mean (computed once with Allreduce for comparison):
//
//   - static: NeighborAllreduce over the default exponential graph, every step;
//   - dynamic: one peer per step from OnePeerSchedule (send to one rank, receive from one),
//     which on 2^k ranks reaches the exact mean in k steps.
//
// Run it under Open MPI (README.md has the build flags):
//
//	mpirun -np 4 ./consensus -steps 12
//
// It exits with status 1 if the ranks have not agreed on the mean to within -tolerance.
package main

import (
	"flag"
	"fmt"
	"math"
	"os"

	"weft.dev/weft"
)

func main() {
	steps := flag.Int("steps", 12, "averaging steps of each kind")
	tolerance := flag.Float64("tolerance", 1e-3, "largest distance from the mean accepted at the end")
	flag.Parse()
	if err := weft.Init(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := run(*steps, *tolerance); err != nil {
		// Ending without Shutdown: mpirun then stops the other ranks too.
		fmt.Fprintf(os.Stderr, "rank %d: %v\n", weft.Rank(), err)
		os.Exit(1)
	}
	if err := weft.Shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// MPI must be finalized before main returns (see weft.Finalize).
	if err := weft.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(steps int, tolerance float64) error {
	rank, size := weft.Rank(), weft.Size()
	start := []float64{float64(rank), float64(rank * rank), -float64(rank)}
	mean := make([]float64, len(start))
	if err := weft.Allreduce(start, mean, weft.AllreduceOptions{Name: "mean"}); err != nil {
		return err
	}

	// Static topology: the default exponential graph's weights.
	x := append([]float64(nil), start...)
	report := func(kind string, step int) (float64, error) {
		dist, err := worstDistance(x, mean)
		if err == nil && rank == 0 {
			fmt.Printf("%-8s step %2d  max |x - mean| over ranks = %.3g\n", kind, step, dist)
		}
		return dist, err
	}
	if rank == 0 {
		fmt.Printf("%d ranks, mean %v\n", size, mean)
	}
	var dist float64
	for step := 1; step <= steps; step++ {
		if err := weft.NeighborAllreduce(x, x, weft.NeighborAllreduceOptions{Name: "static"}); err != nil {
			return err
		}
		var err error
		if dist, err = report("static", step); err != nil {
			return err
		}
	}
	if dist > tolerance {
		return fmt.Errorf("static averaging ended %.3g from the mean", dist)
	}

	// Dynamic topology: one peer per step, weights 1/2 (every rank receives from exactly one
	// rank at each step of this schedule).
	topo, err := weft.ExponentialTwoGraph(size)
	if err != nil {
		return err
	}
	defer topo.Close()
	schedule, err := weft.OnePeerSchedule(topo, rank)
	if err != nil {
		return err
	}
	defer schedule.Close()
	x = append(x[:0], start...)
	for step := 1; step <= steps; step++ {
		send, recv, err := schedule.Next()
		if err != nil {
			return err
		}
		opts := weft.NeighborAllreduceOptions{
			Weights:    &weft.Weights{Self: 1, Src: map[int]float64{}},
			DstWeights: map[int]float64{},
			Name:       "dynamic",
		}
		if len(recv) > 0 {
			opts.Weights.Self = 1 / float64(len(recv)+1)
		}
		for _, j := range recv {
			opts.Weights.Src[j] = opts.Weights.Self
		}
		for _, j := range send {
			opts.DstWeights[j] = 1
		}
		if err := weft.NeighborAllreduce(x, x, opts); err != nil {
			return err
		}
		if dist, err = report("dynamic", step); err != nil {
			return err
		}
	}
	if dist > tolerance {
		return fmt.Errorf("dynamic averaging ended %.3g from the mean", dist)
	}
	return nil
}

// worstDistance is the largest |x_i - mean_i| over all ranks and elements.
func worstDistance(x, mean []float64) (float64, error) {
	local := 0.0
	for i := range x {
		local = math.Max(local, math.Abs(x[i]-mean[i]))
	}
	all, err := weft.Allgather([]float64{local}, weft.AllgatherOptions{Name: "distance"})
	if err != nil {
		return 0, err
	}
	worst := 0.0
	for _, d := range all {
		worst = math.Max(worst, d)
	}
	return worst, nil
}
