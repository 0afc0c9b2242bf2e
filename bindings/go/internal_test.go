package weft

import (
	"runtime"
	"testing"
	"time"
	"unsafe"

	"weft.dev/weft/internal/cweft"
)

// cweft.RankWeight crosses into C as weftgo_rank_weight (weft.i checks the C side).
func TestRankWeightLayout(t *testing.T) {
	var p cweft.RankWeight
	if unsafe.Sizeof(p) != 16 || unsafe.Offsetof(p.Weight) != 8 {
		t.Fatalf("RankWeight: size %d, Weight at %d; weft.i expects 16 and 8",
			unsafe.Sizeof(p), unsafe.Offsetof(p.Weight))
	}
}

// cweft.RankVersion crosses into C as weftgo_rank_version (weft.i checks the C side).
func TestRankVersionLayout(t *testing.T) {
	var p cweft.RankVersion
	if unsafe.Sizeof(p) != 16 || unsafe.Offsetof(p.Version) != 8 {
		t.Fatalf("RankVersion: size %d, Version at %d; weft.i expects 16 and 8",
			unsafe.Sizeof(p), unsafe.Offsetof(p.Version))
	}
}

// The pipe structs cross into C by pointer as weft_pipe_freeze_options,
// weft_pipe_plan_options and weft_pipe_plan_info (weft.i checks the C side).
func TestPipeStructLayouts(t *testing.T) {
	var f cweft.PipeFreezeOptions
	if unsafe.Sizeof(f) != 24 || unsafe.Offsetof(f.Alpha) != 8 ||
		unsafe.Offsetof(f.GradientAware) != 16 || unsafe.Offsetof(f.FreezeLast) != 20 {
		t.Fatalf("PipeFreezeOptions: size %d, Alpha at %d; weft.i expects 24 and 8",
			unsafe.Sizeof(f), unsafe.Offsetof(f.Alpha))
	}
	var o cweft.PipePlanOptions
	if unsafe.Sizeof(o) != 32 || unsafe.Offsetof(o.Machines) != 4 ||
		unsafe.Offsetof(o.DevicesPerMachine) != 8 || unsafe.Offsetof(o.K0) != 12 ||
		unsafe.Offsetof(o.Lambda) != 16 || unsafe.Offsetof(o.Strategy) != 24 ||
		unsafe.Offsetof(o.MicroBatches) != 28 {
		t.Fatalf("PipePlanOptions: size %d, Lambda at %d; weft.i expects 32 and 16",
			unsafe.Sizeof(o), unsafe.Offsetof(o.Lambda))
	}
	var i cweft.PipePlanInfo
	if unsafe.Sizeof(i) != 40 || unsafe.Offsetof(i.World) != 20 || unsafe.Offsetof(i.M0) != 24 ||
		unsafe.Offsetof(i.MaxCost) != 32 {
		t.Fatalf("PipePlanInfo: size %d, M0 at %d; weft.i expects 40 and 24",
			unsafe.Sizeof(i), unsafe.Offsetof(i.M0))
	}
}

// The pipe enums of the Go API are the header's values.
func TestPipeEnumValuesMatchTheHeader(t *testing.T) {
	if int(StrategyOptimal) != int(cweft.WEFT_PIPE_STRATEGY_OPTIMAL) ||
		int(StrategyGreedy) != int(cweft.WEFT_PIPE_STRATEGY_GREEDY) ||
		int(StrategyEven) != int(cweft.WEFT_PIPE_STRATEGY_EVEN) ||
		int(ScheduleGPipe) != int(cweft.WEFT_PIPE_SCHEDULE_GPIPE) ||
		int(Schedule1F1B) != int(cweft.WEFT_PIPE_SCHEDULE_1F1B) {
		t.Fatal("the Strategy or ScheduleKind values differ from weft.h's")
	}
}

// The Status constants are the values of weft_status in the header SWIG read.
func TestStatusValuesMatchTheHeader(t *testing.T) {
	for _, c := range []struct {
		goValue Status
		cValue  cweft.Enum_SS_weft_status
	}{
		{OK, cweft.WEFT_OK},
		{InvalidArgument, cweft.WEFT_ERR_INVALID_ARGUMENT},
		{FailedPrecondition, cweft.WEFT_ERR_FAILED_PRECONDITION},
		{NotFound, cweft.WEFT_ERR_NOT_FOUND},
		{OutOfRange, cweft.WEFT_ERR_OUT_OF_RANGE},
		{Unimplemented, cweft.WEFT_ERR_UNIMPLEMENTED},
		{DeadlineExceeded, cweft.WEFT_ERR_DEADLINE_EXCEEDED},
		{Aborted, cweft.WEFT_ERR_ABORTED},
		{Unavailable, cweft.WEFT_ERR_UNAVAILABLE},
		{ResourceExhausted, cweft.WEFT_ERR_RESOURCE_EXHAUSTED},
		{Internal, cweft.WEFT_ERR_INTERNAL},
		{Unknown, cweft.WEFT_ERR_UNKNOWN},
	} {
		if int(c.goValue) != int(c.cValue) {
			t.Errorf("%v is %d in Go but %d in weft.h", c.goValue, int(c.goValue), int(c.cValue))
		}
	}
	if VersionNumber() != cweft.WEFT_VERSION_NUMBER {
		t.Errorf("the loaded library is %d, the header %d", VersionNumber(), cweft.WEFT_VERSION_NUMBER)
	}
}

// The step counter's CountKind and ComputationEvent constants are the header's values.
func TestStepCounterValuesMatchTheHeader(t *testing.T) {
	for _, c := range []struct {
		goValue CountKind
		cValue  cweft.Enum_SS_weft_count_kind
	}{{CountForward, cweft.WEFT_COUNT_FORWARD}, {CountBackward, cweft.WEFT_COUNT_BACKWARD}} {
		if int(c.goValue) != int(c.cValue) {
			t.Errorf("%v is %d in Go but %d in weft.h", c.goValue, int(c.goValue), int(c.cValue))
		}
	}
	for _, c := range []struct {
		goValue ComputationEvent
		cValue  cweft.Enum_SS_weft_computation_event
	}{
		{ComputationIgnored, cweft.WEFT_COMPUTATION_IGNORED},
		{ComputationCounted, cweft.WEFT_COMPUTATION_COUNTED},
		{ComputationCommunicate, cweft.WEFT_COMPUTATION_COMMUNICATE},
		{ComputationMisuse, cweft.WEFT_COMPUTATION_MISUSE},
	} {
		if int(c.goValue) != int(c.cValue) {
			t.Errorf("%v is %d in Go but %d in weft.h", c.goValue, int(c.goValue), int(c.cValue))
		}
	}
}

// The (buffer, capacity, *count) retry: a result larger than the first buffer.
func TestFetchGrowsTheBuffer(t *testing.T) {
	topo, err := FullyConnectedGraph(40)
	if err != nil {
		t.Fatal(err)
	}
	defer topo.Close()
	in, err := topo.InNeighbors(0)
	if err != nil || len(in) != 39 || in[38] != 39 {
		t.Fatalf("InNeighbors(0) of 40 = %v, %v", in, err)
	}
	_, recv, err := topo.RecvWeights(5)
	if err != nil || len(recv) != 39 || recv[39] != 1.0/40 {
		t.Fatalf("RecvWeights(5) of 40 = %v, %v", recv, err)
	}
}

// A dropped request is finalized (which frees it): nothing it references leads back to it.
// The test swaps the finalizer for one that also reports.
func TestDroppedRequestsAreFinalized(t *testing.T) {
	finalized := make(chan string, 2)
	watch := func(r *Request, what string) {
		runtime.SetFinalizer(r, nil)
		runtime.SetFinalizer(r, func(r *Request) {
			r.Free()
			finalized <- what
		})
	}
	func() {
		g, err := AllgatherNonblocking([]float64{1, 2}, AllgatherOptions{Name: "finalized.gather"})
		if err != nil {
			t.Fatal(err)
		}
		watch(g.Request, "gather")
		x := []int32{1}
		r, err := AllreduceNonblocking(x, make([]int32, 1), AllreduceOptions{Name: "finalized.allreduce"})
		if err != nil {
			t.Fatal(err)
		}
		watch(r, "allreduce")
	}()
	deadline := time.After(30 * time.Second)
	for seen := 0; seen < 2; {
		runtime.GC()
		select {
		case <-finalized:
			seen++
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatalf("only %d of 2 dropped requests were finalized", seen)
		}
	}
	if err := Barrier(); err != nil {
		t.Fatal(err)
	}
}

// A dropped StepCounter is finalized (which frees its C object). The test swaps the
// finalizer for one that also reports.
func TestDroppedStepCounterIsFinalized(t *testing.T) {
	finalized := make(chan struct{}, 1)
	func() {
		c, err := NewStepCounter(2, CountBackward, 4)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Computation(3, true); err != nil {
			t.Fatal(err)
		}
		runtime.SetFinalizer(c, nil)
		runtime.SetFinalizer(c, func(c *StepCounter) {
			c.Close()
			finalized <- struct{}{}
		})
	}()
	deadline := time.After(30 * time.Second)
	for {
		runtime.GC()
		select {
		case <-finalized:
			return
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatal("a dropped StepCounter was not finalized")
		}
	}
}
