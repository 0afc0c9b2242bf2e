package weft_test

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"weft.dev/weft"
)

// Tests of the one-sided windows, with the exact values of tests/comm/window_test.cc. Each
// test frees its windows and leaves the default topology (ExponentialGraph(size, 2)) in
// force.

// withTopology sets topo for the test and restores the default topology afterwards.
func withTopology(t *testing.T, topo *weft.Topology) {
	t.Helper()
	must(t, weft.SetTopology(topo, false), "SetTopology")
	t.Cleanup(func() {
		exp, err := weft.ExponentialGraph(size, 2)
		must(t, err, "ExponentialGraph")
		defer exp.Close()
		must(t, weft.SetTopology(exp, false), "restoring the default topology")
	})
}

func inNeighbors(t *testing.T) []int {
	t.Helper()
	in, err := weft.InNeighborRanks()
	must(t, err, "InNeighborRanks")
	return in
}

func outNeighbors(t *testing.T) []int {
	t.Helper()
	out, err := weft.OutNeighborRanks()
	must(t, err, "OutNeighborRanks")
	return out
}

func expectVersions[T weft.Element](t *testing.T, what string, w *weft.Window[T], in []int, want int64) {
	t.Helper()
	v, err := w.Versions()
	must(t, err, what+": Versions")
	if len(v) != len(in) {
		t.Errorf("rank %d: %s: Versions() = %v, want one entry per in-neighbor %v", rank, what, v, in)
	}
	for _, j := range in {
		if got, ok := v[j]; !ok || got != want {
			t.Errorf("rank %d: %s: version of in-neighbor %d is %d (present: %v), want %d", rank,
				what, j, got, ok, want)
		}
	}
}

func expectData[T weft.Element](t *testing.T, what string, w *weft.Window[T], want []float64) {
	t.Helper()
	got, err := w.Data()
	must(t, err, what+": Data")
	expectValues(t, what, got, want)
}

func expectP[T weft.Element](t *testing.T, what string, w *weft.Window[T], want float64) {
	t.Helper()
	p, err := w.AssociatedP()
	must(t, err, what+": AssociatedP")
	if !near(p, want) {
		t.Errorf("rank %d: %s: AssociatedP() = %v, want %v", rank, what, p, want)
	}
}

// Put then Update on the default topology: the uniform average over self and in-neighbors,
// which on the (unweighted) exponential graph is also what RecvWeights says.
func TestWindowPutThenUpdateAverages(t *testing.T) {
	forEachType(t, testWindowPutThenUpdate[float32], testWindowPutThenUpdate[float64],
		testWindowPutThenUpdate[int32], testWindowPutThenUpdate[int64])
}

func testWindowPutThenUpdate[T weft.Element](t *testing.T) {
	const n = 3
	name := "win.put." + typeName[T]()
	w, err := weft.WinCreate(name, fill[T](rank, n), false)
	must(t, err, "WinCreate")
	in := inNeighbors(t)
	topo, err := weft.LoadTopology()
	must(t, err, "LoadTopology")
	defer topo.Close()
	self, recv, err := topo.RecvWeights(rank)
	must(t, err, "RecvWeights")
	uniform := 1 / float64(len(in)+1)
	if !near(self, uniform) || len(recv) != len(in) {
		t.Fatalf("rank %d: RecvWeights = %v, %v; want %v for self and each of %v", rank, self,
			recv, uniform, in)
	}
	for _, j := range in {
		if !near(recv[j], uniform) {
			t.Fatalf("rank %d: RecvWeights[%d] = %v, want %v", rank, j, recv[j], uniform)
		}
	}
	if w.Name() != name || w.Len() != n || len(w.Shape()) != 1 || w.Shape()[0] != n {
		t.Errorf("rank %d: Name %q, Len %d, Shape %v", rank, w.Name(), w.Len(), w.Shape())
	}

	// Before any put the buffers hold copies of this rank's x: versions 0, p 1.
	expectVersions(t, "before the put", w, in, 0)
	expectP(t, "before the put", w, 1)
	must(t, weft.Barrier(), "Barrier") // nobody puts before everyone has looked
	must(t, w.Put(), "Put")
	expectData(t, "after a put without SelfWeight", w, valuesOf(rank, n))
	must(t, weft.Barrier(), "Barrier") // every put has landed
	expectVersions(t, "after the put", w, in, 1)
	must(t, w.Update(), "Update")
	expectData(t, "the average", w, weighted(self, recv, n))
	expectVersions(t, "after the update", w, in, 0)
	expectP(t, "after the update", w, 1)
	must(t, weft.Barrier(), "Barrier")
	must(t, w.Free(), "Free")
}

// SelfWeight and DstWeights scale x and p; explicit update weights combine them.
func TestWindowWeightsAndAssociatedP(t *testing.T) {
	const n = 3
	w, err := weft.WinCreate("win.weights", fill[float64](rank, n), false)
	must(t, err, "WinCreate")
	in := inNeighbors(t)
	dst := map[int]float64{}
	for _, d := range outNeighbors(t) {
		dst[d] = 0.5
	}
	half := 0.5
	must(t, w.Put(weft.WinPutOptions{SelfWeight: &half, DstWeights: dst}), "Put")
	expectData(t, "x after a put with SelfWeight 0.5", w, scale(valuesOf(rank, n), 0.5))
	expectP(t, "p after a put with SelfWeight 0.5", w, 0.5)
	must(t, weft.Barrier(), "Barrier")
	src := map[int]float64{}
	halves := map[int]float64{}
	for _, j := range in {
		src[j] = 1
		halves[j] = 0.5
	}
	must(t, w.Update(weft.WinUpdateOptions{Weights: &weft.Weights{Self: 1, Src: src}}), "Update")
	expectData(t, "x after the weighted update", w, weighted(0.5, halves, n))
	// Push-sum: p moved with the same weights.
	expectP(t, "p after the weighted update", w, 0.5+0.5*float64(len(in)))
	must(t, weft.Barrier(), "Barrier")
	must(t, w.Free(), "Free")
}

// Accumulate twice into zeroed buffers, then UpdateThenCollect: a sum.
func TestWindowAccumulateThenCollect(t *testing.T) {
	forEachType(t, testWindowAccumulate[float32], testWindowAccumulate[float64],
		testWindowAccumulate[int32], testWindowAccumulate[int64])
}

func testWindowAccumulate[T weft.Element](t *testing.T) {
	const n = 4
	name := "win.acc." + typeName[T]()
	// A 2 x 2 tensor.
	w, err := weft.WinCreate(name, fill[T](rank, n), true, 2, 2)
	must(t, err, "WinCreate")
	in := inNeighbors(t)
	must(t, w.Accumulate(), "Accumulate")
	req, err := w.AccumulateNonblocking()
	must(t, err, "AccumulateNonblocking")
	must(t, waitPolling(t, req), "the nonblocking accumulate")
	must(t, weft.Barrier(), "Barrier")
	expectVersions(t, "after two accumulates", w, in, 2)
	must(t, w.UpdateThenCollect(), "UpdateThenCollect")
	twice := map[int]float64{}
	for _, j := range in {
		twice[j] = 2
	}
	want := weighted(1, twice, n)
	expectData(t, "the collected sum", w, want)
	expectVersions(t, "after collecting", w, in, 0)
	// The buffers were zeroed: collecting again changes nothing.
	must(t, w.UpdateThenCollect(true), "UpdateThenCollect again")
	expectData(t, "collected twice", w, want)
	must(t, weft.Barrier(), "Barrier")
	must(t, w.Free(), "Free")
}

// The same accumulate-and-collect on the UCX transport, chosen for this window.
func TestWindowOnUcxTransport(t *testing.T) {
	const n = 4
	w, err := weft.WinCreateWith("win.ucx", fill[float64](rank, n),
		weft.WinCreateOptions{ZeroInit: true, Transport: "ucx"})
	must(t, err, "WinCreateWith ucx")
	in := inNeighbors(t)
	must(t, w.Accumulate(), "Accumulate")
	must(t, weft.Barrier(), "Barrier")
	expectVersions(t, "after one accumulate", w, in, 1)
	must(t, w.UpdateThenCollect(), "UpdateThenCollect")
	once := map[int]float64{}
	for _, j := range in {
		once[j] = 1
	}
	expectData(t, "the collected sum", w, weighted(1, once, n))
	must(t, weft.Barrier(), "Barrier")
	must(t, w.Free(), "Free")
	_, err = weft.WinCreateWith("win.bogus", fill[float64](rank, n),
		weft.WinCreateOptions{Transport: "bogus"})
	if !errors.Is(err, weft.ErrInvalidArgument) {
		t.Errorf("transport \"bogus\": got %v, want InvalidArgument", err)
	}
}

// Get reads the sources' tensors (weighted) into the buffers, on the ring.
func TestWindowGet(t *testing.T) {
	ring, err := weft.RingGraph(size, weft.RingBidirectional)
	must(t, err, "RingGraph")
	defer ring.Close()
	withTopology(t, ring)
	const n = 3
	w, err := weft.WinCreate("win.get", fill[float32](rank, n), true)
	must(t, err, "WinCreate")
	in := inNeighbors(t)
	must(t, weft.Barrier(), "Barrier")
	src := map[int]float64{}
	quarters := map[int]float64{}
	for _, j := range in {
		src[j] = 2
		quarters[j] = 0.25
	}
	must(t, w.Get(weft.WinGetOptions{SrcWeights: src}), "Get")
	must(t, weft.Barrier(), "Barrier") // nobody changes x before every get is done
	must(t, w.Update(weft.WinUpdateOptions{Weights: &weft.Weights{Self: 0, Src: quarters}}),
		"Update")
	halves := map[int]float64{}
	for _, j := range in {
		halves[j] = 0.5
	}
	expectData(t, "0.25 * 2 * each source's x", w, weighted(0, halves, n))
	must(t, weft.Barrier(), "Barrier")
	must(t, w.Free(), "Free")
}

// The nonblocking put and get, Set, and a request dropped before its op completed: the
// op holds the window's memory itself, and its values still arrive.
func TestWindowNonblockingAndSet(t *testing.T) {
	const n = 2
	w, err := weft.WinCreate("win.nb", make([]float64, n), false)
	must(t, err, "WinCreate")
	in := inNeighbors(t)
	expectStatus(t, "Set of a wrong length", w.Set(make([]float64, n+1)), weft.InvalidArgument,
		"3 elements", "holds 2")
	must(t, w.Set(valuesOf(rank, n)), "Set")
	expectData(t, "after Set", w, valuesOf(rank, n))
	must(t, weft.Barrier(), "Barrier")

	req, err := w.PutNonblocking()
	must(t, err, "PutNonblocking")
	must(t, req.Wait(), "the nonblocking put")
	done, err := req.Poll()
	if !done || err != nil {
		t.Errorf("rank %d: Poll after Wait = %v, %v", rank, done, err)
	}
	must(t, weft.Barrier(), "Barrier")
	expectVersions(t, "after the nonblocking put", w, in, 1)
	req, err = w.GetNonblocking()
	must(t, err, "GetNonblocking")
	must(t, waitPolling(t, req), "the nonblocking get")
	expectVersions(t, "after put and get", w, in, 2)
	must(t, weft.Barrier(), "Barrier")
	must(t, w.Update(weft.WinUpdateOptions{Reset: true}), "Update")
	uniform := 1 / float64(len(in)+1)
	avg := map[int]float64{}
	for _, j := range in {
		avg[j] = uniform
	}
	expectData(t, "the average after put and get", w, weighted(uniform, avg, n))
	must(t, weft.Barrier(), "Barrier")

	// A dropped request: freed at once, collected, and the put still lands.
	must(t, w.Set(valuesOf(rank, n)), "Set")
	must(t, weft.Barrier(), "Barrier")
	req, err = w.PutNonblocking()
	must(t, err, "PutNonblocking")
	req.Free()
	req = nil
	runtime.GC()
	deadline := time.Now().Add(time.Minute)
	for {
		v, err := w.Versions()
		must(t, err, "Versions")
		all := true
		for _, j := range in {
			all = all && v[j] == 1
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank %d: the dropped puts did not arrive in a minute: %v", rank, v)
		}
		time.Sleep(time.Millisecond)
	}
	must(t, w.Update(), "Update")
	expectData(t, "the average after dropped requests", w, weighted(uniform, avg, n))
	must(t, weft.Barrier(), "Barrier")
	must(t, w.Free(), "Free")
	expectStatus(t, "a second Free", w.Free(), weft.FailedPrecondition, "freed")
	_, err = w.Data()
	expectStatus(t, "Data after Free", err, weft.FailedPrecondition, "win.nb", "freed")
	expectStatus(t, "Put after Free", w.Put(), weft.FailedPrecondition, "freed")
	_, err = w.PutNonblocking()
	expectStatus(t, "PutNonblocking after Free", err, weft.FailedPrecondition, "freed")
}

// Ranks accumulate into rank 0 while rank 0 collects, all under rank 0's window mutex
// (taken by the ops themselves or explicitly): nothing is lost.
func TestWindowMutexGuardedAccumulatesLoseNothing(t *testing.T) {
	w, err := weft.WinCreate("win.mutex.self", []int32{int32(rank)}, false)
	must(t, err, "WinCreate")
	must(t, w.MutexAcquire(), "MutexAcquire of this rank's own mutex")
	must(t, w.MutexRelease(), "MutexRelease of this rank's own mutex")
	must(t, weft.Barrier(), "Barrier")
	must(t, w.Free(), "Free")
	if size < 2 {
		t.Skip("needs 2 ranks")
	}
	full, err := weft.FullyConnectedGraph(size)
	must(t, err, "FullyConnectedGraph")
	defer full.Close()
	withTopology(t, full)
	one := int64(0)
	if rank != 0 {
		one = 1
	}
	m, err := weft.WinCreate("win.mutex", []int64{one}, true)
	must(t, err, "WinCreate")
	const rounds = 40
	if rank == 0 {
		for i := 0; i < rounds; i++ {
			must(t, m.UpdateThenCollect(true), "UpdateThenCollect under the mutex")
		}
	} else {
		toZero := weft.WinPutOptions{DstWeights: map[int]float64{0: 1}}
		for i := 0; i < rounds; i++ {
			if i%2 == 0 {
				guarded := toZero
				guarded.RequireMutex = true
				must(t, m.Accumulate(guarded), "Accumulate with RequireMutex")
			} else {
				must(t, m.MutexAcquire(0), "MutexAcquire(0)")
				must(t, m.Accumulate(toZero), "Accumulate under MutexAcquire")
				must(t, m.MutexRelease(0), "MutexRelease(0)")
			}
		}
	}
	must(t, weft.Barrier(), "Barrier")
	if rank == 0 {
		must(t, m.UpdateThenCollect(), "UpdateThenCollect")
		expectData(t, "everything accumulated into rank 0", m, []float64{float64(rounds * (size - 1))})
	} else {
		expectData(t, "the sender's own x", m, []float64{1})
	}
	must(t, weft.Barrier(), "Barrier")
	must(t, m.Free(), "Free")
}

func TestWindowErrors(t *testing.T) {
	x := []float32{1, 1, 1, 1}
	_, err := weft.WinCreate("win.err.shape", x, false, 3)
	expectStatus(t, "WinCreate with a wrong Shape", err, weft.InvalidArgument, "Shape [3]")
	_, err = weft.WinCreate("", x, false)
	expectStatus(t, "WinCreate without a name", err, weft.InvalidArgument)

	w, err := weft.WinCreate("win.err", x, false)
	must(t, err, "WinCreate")
	_, err = weft.WinCreate("win.err", x, false)
	expectStatus(t, "WinCreate of an existing name", err, weft.InvalidArgument, "exists")
	expectStatus(t, "two options structs", w.Put(weft.WinPutOptions{}, weft.WinPutOptions{}),
		weft.InvalidArgument)

	// A destination that is not an out-neighbor (the exponential graph leaves some out).
	topo, err := weft.LoadTopology()
	must(t, err, "LoadTopology")
	defer topo.Close()
	out, err := topo.OutNeighbors(rank)
	must(t, err, "OutNeighbors")
	isOut := map[int]bool{}
	for _, d := range out {
		isOut[d] = true
	}
	for d := 0; d < size; d++ {
		if d == rank || isOut[d] {
			continue
		}
		expectStatus(t, "Put to a non-neighbor",
			w.Put(weft.WinPutOptions{DstWeights: map[int]float64{d: 1}}), weft.InvalidArgument,
			"not an out-neighbor")
		break
	}
	expectStatus(t, "Get from rank -1",
		w.Get(weft.WinGetOptions{SrcWeights: map[int]float64{-1: 1}}), weft.InvalidArgument)
	expectStatus(t, "Update with a non-neighbor",
		w.Update(weft.WinUpdateOptions{Weights: &weft.Weights{Self: 1, Src: map[int]float64{size: 1}}}),
		weft.InvalidArgument)
	expectStatus(t, "UpdateThenCollect(true, true)", w.UpdateThenCollect(true, true),
		weft.InvalidArgument)
	expectData(t, "x after the refused calls", w, []float64{1, 1, 1, 1})

	ring, err := weft.RingGraph(size, weft.RingBidirectional)
	must(t, err, "RingGraph")
	defer ring.Close()
	expectStatus(t, "SetTopology while a window exists", weft.SetTopology(ring, false),
		weft.FailedPrecondition, "windows exist (win.err)")
	now, err := weft.LoadTopology()
	must(t, err, "LoadTopology")
	defer now.Close()
	if same, err := now.IsEquivalent(topo); err != nil || !same {
		t.Errorf("rank %d: the refused SetTopology changed the topology (%v)", rank, err)
	}

	// WinFreeAll frees every window; then the topology may change again.
	must(t, weft.Barrier(), "Barrier")
	must(t, weft.WinFreeAll(), "WinFreeAll")
	expectStatus(t, "Free after WinFreeAll", w.Free(), weft.FailedPrecondition, "freed")
	withTopology(t, ring)

	if size >= 2 {
		// Shapes that differ between ranks: an error on every rank, no window.
		n := 4
		if rank == 0 {
			n = 3
		}
		_, err = weft.WinCreate("win.err.mismatch", make([]float64, n), false)
		expectStatus(t, "WinCreate with shapes differing across ranks", err,
			weft.InvalidArgument, "shape differs across ranks")
		must(t, weft.WinFreeAll(), "WinFreeAll with no window")
	}
}
