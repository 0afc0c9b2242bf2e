package weft_test

import (
	"fmt"
	"math"
	"reflect"
	"testing"

	"weft.dev/weft"
)

// mustTopo(t)(weft.SomeGraph(...)) fails the test on an error and closes the topology at
// the end of the test.
func mustTopo(t *testing.T) func(*weft.Topology, error) *weft.Topology {
	return func(topo *weft.Topology, err error) *weft.Topology {
		t.Helper()
		must(t, err, "creating a topology")
		t.Cleanup(topo.Close)
		return topo
	}
}

func expectRanks(t *testing.T, what string, got []int, err error, want ...int) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	if want == nil {
		want = []int{}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func expectWeight(t *testing.T, topo *weft.Topology, from, to int, want float64) {
	t.Helper()
	got, err := topo.Weight(from, to)
	if err != nil || math.Abs(got-want) > 1e-12 {
		t.Errorf("Weight(%d, %d) = %v, %v; want %v", from, to, got, err, want)
	}
}

func TestExponentialGraphs(t *testing.T) {
	topo := mustTopo(t)(weft.ExponentialTwoGraph(8))
	if topo.Size() != 8 {
		t.Errorf("Size() = %d", topo.Size())
	}
	out, err := topo.OutNeighbors(0)
	expectRanks(t, "OutNeighbors(0)", out, err, 1, 2, 4)
	in, err := topo.InNeighbors(0)
	expectRanks(t, "InNeighbors(0)", in, err, 4, 6, 7)
	expectWeight(t, topo, 0, 0, 0.25)
	expectWeight(t, topo, 0, 4, 0.25)
	expectWeight(t, topo, 0, 3, 0)
	self, recv, err := topo.RecvWeights(0)
	must(t, err, "RecvWeights")
	if self != 0.25 || !reflect.DeepEqual(recv, map[int]float64{4: 0.25, 6: 0.25, 7: 0.25}) {
		t.Errorf("RecvWeights(0) = %v, %v", self, recv)
	}
	self, send, err := topo.SendWeights(3)
	must(t, err, "SendWeights")
	if self != 0.25 || !reflect.DeepEqual(send, map[int]float64{4: 0.25, 5: 0.25, 7: 0.25}) {
		t.Errorf("SendWeights(3) = %v, %v", self, send)
	}
	regular, err := topo.IsRegular()
	if err != nil || !regular {
		t.Errorf("IsRegular() = %v, %v", regular, err)
	}
	base2 := mustTopo(t)(weft.ExponentialGraph(8, 2))
	if eq, err := topo.IsEquivalent(base2); err != nil || !eq {
		t.Errorf("ExponentialTwoGraph(8) vs ExponentialGraph(8, 2): %v, %v", eq, err)
	}
	// Exact integer powers: 3^5 = 243 < 244 is an edge (the reference's float logs missed it).
	base3 := mustTopo(t)(weft.ExponentialGraph(244, 3))
	out, err = base3.OutNeighbors(0)
	expectRanks(t, "ExponentialGraph(244, 3).OutNeighbors(0)", out, err, 1, 3, 9, 27, 81, 243)
	base3small := mustTopo(t)(weft.ExponentialGraph(10, 3))
	in, err = base3small.InNeighbors(0)
	expectRanks(t, "ExponentialGraph(10, 3).InNeighbors(0)", in, err, 1, 7, 9)
}

func TestSymmetricExponentialGraph(t *testing.T) {
	topo := mustTopo(t)(weft.SymmetricExponentialGraph(8, 4))
	for r := 0; r < 8; r++ {
		in, err1 := topo.InNeighbors(r)
		out, err2 := topo.OutNeighbors(r)
		if err1 != nil || err2 != nil || !reflect.DeepEqual(in, out) {
			t.Errorf("rank %d: in %v, out %v (%v, %v): want an undirected graph", r, in, out, err1, err2)
		}
	}
	out, err := topo.OutNeighbors(0)
	expectRanks(t, "SymmetricExponentialGraph(8, 4).OutNeighbors(0)", out, err, 1, 4, 7)
	expectWeight(t, topo, 0, 0, 0.25)
	expectWeight(t, topo, 0, 7, 0.25)
}

func TestMeshGrid2DGraph(t *testing.T) {
	// 6 ranks: 2 rows of 3.  0 1 2 / 3 4 5
	topo := mustTopo(t)(weft.MeshGrid2DGraph(6, 0, 0))
	out, err := topo.OutNeighbors(0)
	expectRanks(t, "OutNeighbors(0)", out, err, 1, 3)
	out, err = topo.OutNeighbors(4)
	expectRanks(t, "OutNeighbors(4)", out, err, 1, 3, 5)
	expectWeight(t, topo, 0, 1, 0.25)  // 1 / max(2+1, 3+1)
	expectWeight(t, topo, 0, 3, 1.0/3) // 1 / max(2+1, 2+1)
	expectWeight(t, topo, 0, 0, 1-0.25-1.0/3)
	expectWeight(t, topo, 1, 1, 0.25)
	explicit := mustTopo(t)(weft.MeshGrid2DGraph(6, 3, 2))
	out, err = explicit.OutNeighbors(0)
	expectRanks(t, "MeshGrid2DGraph(6, 3, 2).OutNeighbors(0)", out, err, 1, 2)
}

func TestStarRingFullyConnected(t *testing.T) {
	star := mustTopo(t)(weft.StarGraph(4, 0))
	expectWeight(t, star, 1, 1, 0.75)
	expectWeight(t, star, 1, 0, 0.25)
	expectWeight(t, star, 0, 2, 0.25)
	expectWeight(t, star, 0, 0, 0.25)
	expectWeight(t, star, 1, 2, 0)
	self, recv, err := star.RecvWeights(0)
	must(t, err, "RecvWeights")
	if self != 0.25 || !reflect.DeepEqual(recv, map[int]float64{1: 0.25, 2: 0.25, 3: 0.25}) {
		t.Errorf("star RecvWeights(0) = %v, %v", self, recv)
	}
	if regular, err := star.IsRegular(); err != nil || regular {
		t.Errorf("star IsRegular() = %v, %v", regular, err)
	}

	ring := mustTopo(t)(weft.RingGraph(5, weft.RingBidirectional))
	out, err := ring.OutNeighbors(0)
	expectRanks(t, "ring OutNeighbors(0)", out, err, 1, 4)
	expectWeight(t, ring, 0, 0, 1.0/3)
	expectWeight(t, ring, 0, 4, 1.0/3)
	left := mustTopo(t)(weft.RingGraph(5, weft.RingLeft))
	out, err = left.OutNeighbors(2)
	expectRanks(t, "left ring OutNeighbors(2)", out, err, 1)
	expectWeight(t, left, 2, 1, 0.5)
	right := mustTopo(t)(weft.RingGraph(5, weft.RingRight))
	out, err = right.OutNeighbors(4)
	expectRanks(t, "right ring OutNeighbors(4)", out, err, 0)

	full := mustTopo(t)(weft.FullyConnectedGraph(4))
	w, err := full.WeightMatrix()
	must(t, err, "WeightMatrix")
	for i := range w {
		for j := range w[i] {
			if w[i][j] != 0.25 {
				t.Fatalf("fully connected W[%d][%d] = %v", i, j, w[i][j])
			}
		}
	}
	if regular, err := full.IsRegular(); err != nil || !regular {
		t.Errorf("fully connected IsRegular() = %v, %v", regular, err)
	}
}

func TestWeightMatrixRoundTripAndEditing(t *testing.T) {
	mesh := mustTopo(t)(weft.MeshGrid2DGraph(6, 0, 0))
	w, err := mesh.WeightMatrix()
	must(t, err, "WeightMatrix")
	if len(w) != 6 || len(w[5]) != 6 {
		t.Fatalf("WeightMatrix is %dx%d", len(w), len(w[0]))
	}
	back := mustTopo(t)(weft.TopologyFromWeightMatrix(w))
	w2, err := back.WeightMatrix()
	must(t, err, "WeightMatrix of the copy")
	if !reflect.DeepEqual(w, w2) {
		t.Errorf("round trip changed the matrix:\n%v\n%v", w, w2)
	}
	if eq, err := mesh.IsEquivalent(back); err != nil || !eq {
		t.Errorf("IsEquivalent(round trip) = %v, %v", eq, err)
	}
	ring := mustTopo(t)(weft.RingGraph(6, weft.RingBidirectional))
	if eq, err := mesh.IsEquivalent(ring); err != nil || eq {
		t.Errorf("mesh IsEquivalent(ring) = %v, %v", eq, err)
	}

	g := mustTopo(t)(weft.NewTopology(3))
	must(t, g.AddEdge(0, 1, 0.5), "AddEdge")
	must(t, g.SetSelfWeight(1, 0.5), "SetSelfWeight")
	expectWeight(t, g, 0, 1, 0.5)
	expectWeight(t, g, 1, 0, 0)
	expectWeight(t, g, 1, 1, 0.5)
	expectWeight(t, g, 2, 2, 1)
	in, err := g.InNeighbors(1)
	expectRanks(t, "InNeighbors(1)", in, err, 0)
	in, err = g.InNeighbors(2)
	expectRanks(t, "InNeighbors(2)", in, err)
	clone, err := g.Clone()
	must(t, err, "Clone")
	must(t, g.AddEdge(2, 1, 0.25), "AddEdge after Clone")
	in, err = clone.InNeighbors(1)
	expectRanks(t, "the clone's InNeighbors(1)", in, err, 0)
	clone.Close()
	clone.Close() // twice is fine
	_, err = clone.InNeighbors(1)
	expectStatus(t, "a closed topology", err, weft.FailedPrecondition, "closed")
	if clone.Size() != 0 {
		t.Errorf("Size() of a closed topology = %d", clone.Size())
	}
}

func TestTopologyErrors(t *testing.T) {
	topo := mustTopo(t)(weft.ExponentialTwoGraph(8))
	_, err := topo.InNeighbors(8)
	expectStatus(t, "InNeighbors(8) of 8 ranks", err, weft.InvalidArgument, "out of range", "8")
	_, _, err = topo.RecvWeights(-1)
	expectStatus(t, "RecvWeights(-1)", err, weft.InvalidArgument, "out of range")
	_, err = topo.Weight(0, 9)
	expectStatus(t, "Weight(0, 9)", err, weft.InvalidArgument)
	expectStatus(t, "AddEdge to rank 8", topo.AddEdge(0, 8, 1), weft.InvalidArgument)
	_, err = weft.TopologyFromWeightMatrix([][]float64{{1, 0}, {0}})
	expectStatus(t, "a ragged matrix", err, weft.InvalidArgument, "square")
	_, err = weft.RingGraph(4, weft.RingStyle(7))
	expectStatus(t, "RingGraph style 7", err, weft.InvalidArgument)
	_, err = weft.ExponentialGraph(0, 2)
	expectStatus(t, "ExponentialGraph(0, 2)", err, weft.InvalidArgument)
	_, err = weft.StarGraph(4, 4)
	expectStatus(t, "StarGraph(4, center 4)", err, weft.InvalidArgument)
	_, err = weft.OnePeerSchedule(topo, 99)
	expectStatus(t, "OnePeerSchedule for rank 99", err, weft.InvalidArgument)
}

// ---- schedules ----------------------------------------------------------------------------

func mustSchedule(t *testing.T) func(*weft.Schedule, error) *weft.Schedule {
	return func(s *weft.Schedule, err error) *weft.Schedule {
		t.Helper()
		must(t, err, "creating a schedule")
		t.Cleanup(s.Close)
		return s
	}
}

func TestOnePeerSchedule(t *testing.T) {
	topo := mustTopo(t)(weft.ExponentialTwoGraph(8))
	for r := 0; r < 8; r++ {
		s := mustSchedule(t)(weft.OnePeerSchedule(topo, r))
		for k := 0; k < 7; k++ {
			send, recv, err := s.Next()
			must(t, err, "Next")
			d := 1 << (k % 3)
			if !reflect.DeepEqual(send, []int{(r + d) % 8}) || !reflect.DeepEqual(recv, []int{(r - d + 8) % 8}) {
				t.Errorf("rank %d step %d: send %v recv %v, want [%d] [%d]", r, k, send, recv,
					(r+d)%8, (r-d+8)%8)
			}
		}
	}
}

func TestMachineExponentialTwoSchedule(t *testing.T) {
	for _, machines := range []int{5, 8} {
		period := int(math.Floor(math.Log2(float64(machines-1)))) + 1
		for m := 0; m < machines; m++ {
			s := mustSchedule(t)(weft.MachineExponentialTwoSchedule(machines, m))
			for k := 0; k < 2*period; k++ {
				send, recv, err := s.Next()
				must(t, err, "Next")
				d := 1 << (k % period)
				want := fmt.Sprint([]int{(m + d) % machines}, []int{(m - d + machines) % machines})
				if got := fmt.Sprint(send, recv); got != want {
					t.Errorf("%d machines, machine %d, step %d: %s, want %s", machines, m, k, got, want)
				}
			}
		}
	}
}

// Inner-outer schedules: at every step, r sends to j exactly when j receives from r.
func TestInnerOuterSchedulesAreConsistent(t *testing.T) {
	const world, local = 8, 2
	makers := map[string]func(w, l, r int) (*weft.Schedule, error){
		"ring":            weft.InnerOuterRingSchedule,
		"exponential-two": weft.InnerOuterExponentialTwoSchedule,
	}
	for name, create := range makers {
		schedules := schedulesFor(t, world, func(r int) (*weft.Schedule, error) {
			return create(world, local, r)
		})
		for k := 0; k < 8; k++ {
			sends := map[[2]int]bool{}
			recvs := map[[2]int]bool{}
			for r, s := range schedules {
				send, recv, err := s.Next()
				must(t, err, name+" Next")
				for _, j := range send {
					if j == r || j < 0 || j >= world {
						t.Fatalf("%s: rank %d step %d sends to %d", name, r, k, j)
					}
					sends[[2]int{r, j}] = true
				}
				for _, j := range recv {
					recvs[[2]int{j, r}] = true
				}
			}
			if len(sends) == 0 || !reflect.DeepEqual(sends, recvs) {
				t.Errorf("%s step %d: sends %v but receives %v", name, k, sends, recvs)
			}
		}
	}
	_, err := weft.InnerOuterRingSchedule(8, 3, 0)
	expectStatus(t, "a local size that does not divide the world", err, weft.InvalidArgument)
}

func schedulesFor(t *testing.T, n int, create func(r int) (*weft.Schedule, error)) []*weft.Schedule {
	t.Helper()
	out := make([]*weft.Schedule, n)
	for r := range out {
		out[r] = mustSchedule(t)(create(r))
	}
	return out
}

func TestScheduleClose(t *testing.T) {
	topo := mustTopo(t)(weft.RingGraph(4, weft.RingBidirectional))
	s, err := weft.OnePeerSchedule(topo, 0)
	must(t, err, "OnePeerSchedule")
	s.Close()
	s.Close()
	_, _, err = s.Next()
	expectStatus(t, "Next after Close", err, weft.FailedPrecondition, "closed")
}

// ---- the process's topology (collective) -------------------------------------------------

func TestDefaultTopology(t *testing.T) {
	topo, err := weft.LoadTopology()
	must(t, err, "LoadTopology")
	defer topo.Close()
	exp := mustTopo(t)(weft.ExponentialGraph(size, 2))
	if eq, err := topo.IsEquivalent(exp); err != nil || !eq {
		t.Errorf("the default topology is not ExponentialGraph(%d, 2): %v, %v", size, eq, err)
	}
	want, err := topo.InNeighbors(rank)
	must(t, err, "InNeighbors")
	got, err := weft.InNeighborRanks()
	expectRanks(t, "InNeighborRanks", got, err, want...)
	want, err = topo.OutNeighbors(rank)
	must(t, err, "OutNeighbors")
	got, err = weft.OutNeighborRanks()
	expectRanks(t, "OutNeighborRanks", got, err, want...)
}

func TestSetTopology(t *testing.T) {
	ring := mustTopo(t)(weft.RingGraph(size, weft.RingBidirectional))
	must(t, weft.SetTopology(ring, true), "SetTopology(ring)")
	if !weft.IsTopologyWeighted() {
		t.Error("IsTopologyWeighted() is false after SetTopology(ring, true)")
	}
	want, _ := ring.InNeighbors(rank)
	got, err := weft.InNeighborRanks()
	expectRanks(t, "InNeighborRanks on the ring", got, err, want...)
	// The ring's own weights apply: 1/3 each (or 1/2, 1 on 2 and 1 ranks).
	self, recv, err := ring.RecvWeights(rank)
	must(t, err, "RecvWeights")
	x := fill[float64](rank, 3)
	y := make([]float64, 3)
	must(t, weft.NeighborAllreduce(x, y, weft.NeighborAllreduceOptions{Name: "ring.nar"}), "NeighborAllreduce")
	expectValues(t, "NeighborAllreduce on the weighted ring", y, weighted(self, recv, 3))

	exp := mustTopo(t)(weft.ExponentialGraph(size, 2))
	must(t, weft.SetTopology(exp, false), "SetTopology(exponential)")
	if weft.IsTopologyWeighted() {
		t.Error("IsTopologyWeighted() after SetTopology(exp, false)")
	}
	// A graph of the wrong size fails on every rank (each checks its own argument).
	wrong := mustTopo(t)(weft.ExponentialGraph(size+1, 2))
	expectStatus(t, "SetTopology of a wrong size", weft.SetTopology(wrong, false),
		weft.InvalidArgument)
	closed, err := weft.RingGraph(size, weft.RingBidirectional)
	must(t, err, "RingGraph")
	closed.Close()
	expectStatus(t, "SetTopology of a closed topology", weft.SetTopology(closed, false),
		weft.FailedPrecondition, "closed")
}

// Ranks that pass different graphs all get an error, and nothing changes.
func TestSetTopologyMismatchFailsOnEveryRank(t *testing.T) {
	if size < 4 {
		t.Skip("ring and exponential graphs coincide below 4 ranks")
	}
	var topo *weft.Topology
	if rank == 0 {
		topo = mustTopo(t)(weft.RingGraph(size, weft.RingBidirectional))
	} else {
		topo = mustTopo(t)(weft.ExponentialGraph(size, 2))
	}
	expectStatus(t, "SetTopology with rank 0 disagreeing", weft.SetTopology(topo, false),
		weft.InvalidArgument, "not equivalent")
	now, err := weft.LoadTopology()
	must(t, err, "LoadTopology")
	defer now.Close()
	exp := mustTopo(t)(weft.ExponentialGraph(size, 2))
	if eq, _ := now.IsEquivalent(exp); !eq {
		t.Error("the failed SetTopology changed the topology")
	}
}

func TestMachineTopology(t *testing.T) {
	machines, err := weft.LoadMachineTopology()
	must(t, err, "LoadMachineTopology")
	defer machines.Close()
	if machines.Size() != weft.MachineSize() {
		t.Errorf("the machine topology has %d ranks for %d machines", machines.Size(), weft.MachineSize())
	}
	exp := mustTopo(t)(weft.ExponentialGraph(weft.MachineSize(), 2))
	if eq, _ := machines.IsEquivalent(exp); !eq {
		t.Error("the default machine topology is not exponential")
	}
	must(t, weft.SetMachineTopology(exp, false), "SetMachineTopology")
}
