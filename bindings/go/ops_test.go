package weft_test

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"weft.dev/weft"
)

// ---- expected values ------------------------------------------------------------------------

// valuesOf is rank r's input of n elements, as float64.
func valuesOf(r, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = value(r, i)
	}
	return v
}

func sumOverRanks(n int) []float64 {
	v := make([]float64, n)
	for r := 0; r < size; r++ {
		for i := range v {
			v[i] += value(r, i)
		}
	}
	return v
}

func scale(v []float64, f float64) []float64 {
	out := make([]float64, len(v))
	for i := range v {
		out[i] = v[i] * f
	}
	return out
}

// weighted is self*x_rank + sum_j w_j*x_j, element by element.
func weighted(self float64, neighbors map[int]float64, n int) []float64 {
	want := scale(valuesOf(rank, n), self)
	for j, w := range neighbors {
		for i := range want {
			want[i] += w * value(j, i)
		}
	}
	return want
}

// waitPolling polls until the request completes (bounded, so a bug fails instead of hanging).
func waitPolling(t *testing.T, req *weft.Request) error {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		done, err := req.Poll()
		if done {
			return err
		}
		if err != nil {
			t.Fatalf("rank %d: Poll: %v", rank, err)
		}
		time.Sleep(200 * time.Microsecond)
	}
	t.Fatalf("rank %d: the request did not complete in 2 minutes", rank)
	return nil
}

// ---- every op, every element type ------------------------------------------------------------

func TestAllreduce(t *testing.T) {
	forEachType(t, testAllreduce[float32], testAllreduce[float64], testAllreduce[int32],
		testAllreduce[int64])
}

func testAllreduce[T weft.Element](t *testing.T) {
	const n = 5
	name := "allreduce." + typeName[T]()
	in := fill[T](rank, n)
	out := make([]T, n)
	must(t, weft.Allreduce(in, out, weft.AllreduceOptions{Op: weft.Sum, Name: name + ".sum"}), "sum")
	expectValues(t, "sum", out, sumOverRanks(n))
	must(t, weft.Allreduce(in, out, weft.AllreduceOptions{Name: name + ".avg"}), "average")
	expectValues(t, "average", out, scale(sumOverRanks(n), 1/float64(size)))
	expectValues(t, "the input of an out-of-place op", in, valuesOf(rank, n))

	// In place, unnamed (matched by call order), as a 2 x 3 tensor.
	x := fill[T](rank, 6)
	must(t, weft.Allreduce(x, x, weft.AllreduceOptions{Op: weft.Sum, Shape: []int64{2, 3}}), "in place")
	expectValues(t, "in place", x, sumOverRanks(6))
	must(t, weft.Allreduce([]T{}, []T{}, weft.AllreduceOptions{Name: name + ".empty"}), "empty")

	// Nonblocking: the input is copied at the start, the output written by Poll/Wait.
	src := fill[T](rank, n)
	out = make([]T, n)
	req, err := weft.AllreduceNonblocking(src, out, weft.AllreduceOptions{Op: weft.Sum, Name: name + ".nb"})
	must(t, err, "AllreduceNonblocking")
	src[0] = 99 // too late to matter
	must(t, waitPolling(t, req), "the nonblocking allreduce")
	expectValues(t, "nonblocking sum", out, sumOverRanks(n))
	must(t, req.Wait(), "waiting again")
	y := fill[T](rank, n)
	req, err = weft.AllreduceNonblocking(y, y, weft.AllreduceOptions{Name: name + ".nb.inplace"})
	must(t, err, "AllreduceNonblocking in place")
	must(t, req.Wait(), "the nonblocking in-place allreduce")
	expectValues(t, "nonblocking in-place average", y, scale(sumOverRanks(n), 1/float64(size)))
}

func TestGroup(t *testing.T) {
	const n = 4
	must(t, weft.GroupStart(), "GroupStart")
	var reqs []*weft.Request
	var outs [][]float64
	for k := 0; k < 8; k++ {
		out := make([]float64, n)
		// Unnamed ones too: they run on the goroutine's locked thread, inside the group.
		o := weft.AllreduceOptions{Op: weft.Sum}
		if k%2 == 0 {
			o.Name = fmt.Sprintf("group.%d", k)
		}
		req, err := weft.AllreduceNonblocking(fill[float64](rank, n), out, o)
		must(t, err, "AllreduceNonblocking in a group")
		reqs = append(reqs, req)
		outs = append(outs, out)
	}
	must(t, weft.GroupEnd(), "GroupEnd")
	for k, req := range reqs {
		must(t, req.Wait(), "an op of the group")
		expectValues(t, "an op of the group", outs[k], sumOverRanks(n))
	}
	if err := weft.GroupEnd(); !errors.Is(err, weft.ErrFailedPrecondition) {
		t.Fatalf("GroupEnd without a group: got %v, want FailedPrecondition", err)
	}
}

func TestBroadcast(t *testing.T) {
	forEachType(t, testBroadcast[float32], testBroadcast[float64], testBroadcast[int32],
		testBroadcast[int64])
}

func testBroadcast[T weft.Element](t *testing.T) {
	name := "broadcast." + typeName[T]()
	root := size - 1
	in := fill[T](rank, 4)
	out := make([]T, 4)
	must(t, weft.Broadcast(in, out, root, weft.BroadcastOptions{Name: name}), "Broadcast")
	expectValues(t, "broadcast", out, valuesOf(root, 4))
	x := fill[T](rank, 6)
	must(t, weft.Broadcast(x, x, 0, weft.BroadcastOptions{Name: name + ".2d", Shape: []int64{3, 2}}), "in place")
	expectValues(t, "in-place broadcast", x, valuesOf(0, 6))

	out = make([]T, 4)
	req, err := weft.BroadcastNonblocking(in, out, root, weft.BroadcastOptions{Name: name + ".nb"})
	must(t, err, "BroadcastNonblocking")
	must(t, req.Wait(), "the nonblocking broadcast")
	expectValues(t, "nonblocking broadcast", out, valuesOf(root, 4))
}

func TestAllgather(t *testing.T) {
	forEachType(t, testAllgather[float32], testAllgather[float64], testAllgather[int32],
		testAllgather[int64])
}

func testAllgather[T weft.Element](t *testing.T) {
	name := "allgather." + typeName[T]()
	// Dim 0 differs between ranks: rank r gives r + 1 elements.
	var want, want2d []float64
	for r := 0; r < size; r++ {
		want = append(want, valuesOf(r, r+1)...)
		want2d = append(want2d, valuesOf(r, 2*(r+1))...)
	}
	in := fill[T](rank, rank+1)
	got, err := weft.Allgather(in, weft.AllgatherOptions{Name: name})
	must(t, err, "Allgather")
	expectValues(t, "allgather", got, want)
	got, err = weft.Allgather(fill[T](rank, 2*(rank+1)),
		weft.AllgatherOptions{Name: name + ".2d", Shape: []int64{int64(rank + 1), 2}})
	must(t, err, "Allgather 2-D")
	expectValues(t, "allgather of rows", got, want2d)

	// Rank 0 gives nothing.
	var wantEmpty0 []float64
	for r := 1; r < size; r++ {
		wantEmpty0 = append(wantEmpty0, valuesOf(r, r)...)
	}
	got, err = weft.Allgather(fill[T](rank, rank), weft.AllgatherOptions{Name: name + ".empty0"})
	must(t, err, "Allgather with nothing from rank 0")
	expectValues(t, "allgather with nothing from rank 0", got, wantEmpty0)

	g, err := weft.AllgatherNonblocking(in, weft.AllgatherOptions{Name: name + ".nb"})
	must(t, err, "AllgatherNonblocking")
	in[0] = 99 // copied at the start
	got, err = g.Result()
	must(t, err, "the nonblocking allgather")
	expectValues(t, "nonblocking allgather", got, want)
	g.Free() // after completion: nothing to do
	if again, err := g.Result(); err != nil || len(again) != len(want) {
		t.Errorf("rank %d: Result after Free = %v, %v", rank, again, err)
	}
}

func TestNeighborAllgather(t *testing.T) {
	forEachType(t, testNeighborAllgather[float32], testNeighborAllgather[float64],
		testNeighborAllgather[int32], testNeighborAllgather[int64])
}

func testNeighborAllgather[T weft.Element](t *testing.T) {
	name := "neighbor_allgather." + typeName[T]()
	in := fill[T](rank, 3)
	neighbors, err := weft.InNeighborRanks()
	must(t, err, "InNeighborRanks")
	var want []float64
	for _, j := range neighbors {
		want = append(want, valuesOf(j, 3)...)
	}
	got, err := weft.NeighborAllgather(in, weft.NeighborAllgatherOptions{Name: name})
	must(t, err, "NeighborAllgather")
	expectValues(t, "neighbor allgather", got, want)

	// Explicit ranks: receive from the previous rank, send to the next (none on 1 rank).
	src, dst := []int{}, []int{}
	if size > 1 {
		src, dst = []int{(rank - 1 + size) % size}, []int{(rank + 1) % size}
	}
	want = nil
	for _, j := range src {
		want = append(want, valuesOf(j, 3)...)
	}
	opts := weft.NeighborAllgatherOptions{SrcRanks: src, DstRanks: dst, Name: name + ".ring"}
	got, err = weft.NeighborAllgather(in, opts)
	must(t, err, "NeighborAllgather with ranks")
	expectValues(t, "neighbor allgather from the previous rank", got, want)

	opts.Name = name + ".ring.nb"
	g, err := weft.NeighborAllgatherNonblocking(in, opts)
	must(t, err, "NeighborAllgatherNonblocking")
	must(t, waitPolling(t, g.Request), "the nonblocking neighbor allgather")
	got, err = g.Result()
	must(t, err, "Result")
	expectValues(t, "nonblocking neighbor allgather", got, want)
}

func TestNeighborAllreduce(t *testing.T) {
	forEachType(t, testNeighborAllreduce[float32], testNeighborAllreduce[float64],
		testNeighborAllreduce[int32], testNeighborAllreduce[int64])
}

func testNeighborAllreduce[T weft.Element](t *testing.T) {
	name := "neighbor_allreduce." + typeName[T]()
	const n = 4
	topo, err := weft.LoadTopology()
	must(t, err, "LoadTopology")
	defer topo.Close()
	self, recv, err := topo.RecvWeights(rank)
	must(t, err, "RecvWeights")
	in := fill[T](rank, n)
	out := make([]T, n)
	must(t, weft.NeighborAllreduce(in, out, weft.NeighborAllreduceOptions{Name: name}), "default")
	expectValues(t, "the topology's weights", out, weighted(self, recv, n))

	// Explicit weights over the same neighbors: a plain sum.
	ones := map[int]float64{}
	for j := range recv {
		ones[j] = 1
	}
	opts := weft.NeighborAllreduceOptions{Weights: &weft.Weights{Self: 1, Src: ones}, Name: name + ".sum"}
	must(t, weft.NeighborAllreduce(in, out, opts), "explicit weights")
	expectValues(t, "explicit weights", out, weighted(1, ones, n))

	// Dynamic: send to the next rank scaled by 2, receive from the previous with weight 1/4.
	if size > 1 {
		prev, next := (rank-1+size)%size, (rank+1)%size
		x := fill[T](rank, n)
		dyn := weft.NeighborAllreduceOptions{
			Weights:    &weft.Weights{Self: 0.5, Src: map[int]float64{prev: 0.25}},
			DstWeights: map[int]float64{next: 2},
			Name:       name + ".dynamic",
		}
		must(t, weft.NeighborAllreduce(x, x, dyn), "dynamic, in place")
		expectValues(t, "dynamic", x, weighted(0.5, map[int]float64{prev: 0.5}, n))
	}

	// Nobody sends: y = self_weight * x.
	alone := weft.NeighborAllreduceOptions{Weights: &weft.Weights{Self: 0.5},
		DstWeights: map[int]float64{}, Name: name + ".alone"}
	must(t, weft.NeighborAllreduce(in, out, alone), "no senders")
	expectValues(t, "no senders", out, weighted(0.5, nil, n))

	out = make([]T, n)
	req, err := weft.NeighborAllreduceNonblocking(in, out, weft.NeighborAllreduceOptions{Name: name + ".nb"})
	must(t, err, "NeighborAllreduceNonblocking")
	must(t, req.Wait(), "the nonblocking neighbor allreduce")
	expectValues(t, "nonblocking neighbor allreduce", out, weighted(self, recv, n))
}

func TestHierarchicalNeighborAllreduce(t *testing.T) {
	forEachType(t, testHierarchical[float32], testHierarchical[float64], testHierarchical[int32],
		testHierarchical[int64])
}

func testHierarchical[T weft.Element](t *testing.T) {
	name := "hierarchical." + typeName[T]()
	const n = 3
	machineOf, err := weft.Allgather([]int32{int32(weft.MachineRank())},
		weft.AllgatherOptions{Name: name + ".machines"})
	must(t, err, "Allgather of machine ranks")
	machineSum := func(m, i int) float64 {
		s := 0.0
		for r, mr := range machineOf {
			if int(mr) == m {
				s += value(r, i)
			}
		}
		return s
	}
	expect := func(self float64, src map[int]float64) []float64 {
		want := make([]float64, n)
		for i := range want {
			want[i] = self * machineSum(weft.MachineRank(), i)
			for j, w := range src {
				want[i] += w * machineSum(j, i)
			}
			want[i] /= float64(weft.LocalSize())
		}
		return want
	}
	machines, err := weft.LoadMachineTopology()
	must(t, err, "LoadMachineTopology")
	defer machines.Close()
	self, recv, err := machines.RecvWeights(weft.MachineRank())
	must(t, err, "RecvWeights")
	in := fill[T](rank, n)
	out := make([]T, n)
	must(t, weft.HierarchicalNeighborAllreduce(in, out,
		weft.HierarchicalNeighborAllreduceOptions{Name: name}), "default")
	expectValues(t, "machine-level average", out, expect(self, recv))

	if M := weft.MachineSize(); M > 1 {
		m := weft.MachineRank()
		prev, next := (m-1+M)%M, (m+1)%M
		opts := weft.HierarchicalNeighborAllreduceOptions{
			Weights:    &weft.Weights{Self: 0.5, Src: map[int]float64{prev: 0.25}},
			DstWeights: map[int]float64{next: 2},
			Name:       name + ".weights",
		}
		x := fill[T](rank, n)
		must(t, weft.HierarchicalNeighborAllreduce(x, x, opts), "machine weights")
		expectValues(t, "machine weights", x, expect(0.5, map[int]float64{prev: 0.5}))
	}

	out = make([]T, n)
	req, err := weft.HierarchicalNeighborAllreduceNonblocking(in, out,
		weft.HierarchicalNeighborAllreduceOptions{Name: name + ".nb"})
	must(t, err, "HierarchicalNeighborAllreduceNonblocking")
	must(t, req.Wait(), "the nonblocking hierarchical op")
	expectValues(t, "nonblocking machine-level average", out, expect(self, recv))
}

func TestPairGossip(t *testing.T) {
	forEachType(t, testPairGossip[float32], testPairGossip[float64], testPairGossip[int32],
		testPairGossip[int64])
}

func testPairGossip[T weft.Element](t *testing.T) {
	if size%2 != 0 {
		t.Skip("pairs ranks 2k and 2k+1")
	}
	name := "pair_gossip." + typeName[T]()
	peer := rank ^ 1
	in := fill[T](rank, 4)
	out := make([]T, 4)
	must(t, weft.PairGossip(in, out, peer, weft.PairGossipOptions{Name: name}), "PairGossip")
	expectValues(t, "gossip", out, weighted(0.5, map[int]float64{peer: 0.5}, 4))
	x := fill[T](rank, 4)
	opts := weft.PairGossipOptions{SelfWeight: 0.75, PairWeight: 0.25, Name: name + ".w"}
	must(t, weft.PairGossip(x, x, peer, opts), "PairGossip in place")
	expectValues(t, "weighted gossip", x, weighted(0.75, map[int]float64{peer: 0.25}, 4))

	out = make([]T, 4)
	req, err := weft.PairGossipNonblocking(in, out, peer, weft.PairGossipOptions{Name: name + ".nb"})
	must(t, err, "PairGossipNonblocking")
	must(t, req.Wait(), "the nonblocking gossip")
	expectValues(t, "nonblocking gossip", out, weighted(0.5, map[int]float64{peer: 0.5}, 4))
}

// ---- process sets and point to point ---------------------------------------------------------

func TestProcessSets(t *testing.T) {
	forEachType(t, testProcessSets[float32], testProcessSets[float64], testProcessSets[int32],
		testProcessSets[int64])
}

// Even and odd ranks: disjoint sets running under the same names.
func testProcessSets[T weft.Element](t *testing.T) {
	name := "sets." + typeName[T]()
	var set []int
	for r := rank % 2; r < size; r += 2 {
		set = append(set, r)
	}
	sumOverSet := func(n int) []float64 {
		v := make([]float64, n)
		for _, r := range set {
			for i := range v {
				v[i] += value(r, i)
			}
		}
		return v
	}
	in := fill[T](rank, 4)
	out := make([]T, 4)
	must(t, weft.Allreduce(in, out, weft.AllreduceOptions{Op: weft.Sum, Name: name, Ranks: set}), "Allreduce in a set")
	expectValues(t, "sum over the set", out, sumOverSet(4))
	x := fill[T](rank, 4)
	must(t, weft.Allreduce(x, x, weft.AllreduceOptions{Ranks: set}), "unnamed Allreduce in a set")
	expectValues(t, "average over the set", x, scale(sumOverSet(4), 1/float64(len(set))))

	root := set[len(set)-1]
	must(t, weft.Broadcast(in, out, root, weft.BroadcastOptions{Name: name + ".bcast", Ranks: set}), "Broadcast in a set")
	expectValues(t, "broadcast in the set", out, valuesOf(root, 4))

	// Nonblocking, the set given in reverse order.
	reversed := make([]int, len(set))
	for i, r := range set {
		reversed[len(set)-1-i] = r
	}
	sum := make([]T, 4)
	bcast := make([]T, 4)
	a, err := weft.AllreduceNonblocking(in, sum, weft.AllreduceOptions{Op: weft.Sum, Name: name + ".nb", Ranks: reversed})
	must(t, err, "AllreduceNonblocking in a set")
	b, err := weft.BroadcastNonblocking(in, bcast, set[0], weft.BroadcastOptions{Name: name + ".nb.bcast", Ranks: set})
	must(t, err, "BroadcastNonblocking in a set")
	must(t, a.Wait(), "the nonblocking allreduce in a set")
	must(t, b.Wait(), "the nonblocking broadcast in a set")
	expectValues(t, "nonblocking sum over the set", sum, sumOverSet(4))
	expectValues(t, "nonblocking broadcast in the set", bcast, valuesOf(set[0], 4))
}

func TestSendRecv(t *testing.T) {
	forEachType(t, testSendRecv[float32], testSendRecv[float64], testSendRecv[int32],
		testSendRecv[int64])
}

func testSendRecv[T weft.Element](t *testing.T) {
	if size < 2 {
		t.Skip("needs a peer")
	}
	name := "p2p." + typeName[T]()
	next, prev := (rank+1)%size, (rank+size-1)%size
	// A ring: receive first (nonblocking), then send; named by the sender, so that on 2
	// ranks (prev == next) the two directions do not match each other.
	got := make([]T, 6)
	recv, err := weft.RecvNonblocking(got, prev, weft.RecvOptions{Name: fmt.Sprintf("%s.ring%d", name, prev), Shape: []int64{2, 3}})
	must(t, err, "RecvNonblocking")
	in := fill[T](rank, 6)
	send, err := weft.SendNonblocking(in, next, weft.SendOptions{Name: fmt.Sprintf("%s.ring%d", name, rank), Shape: []int64{2, 3}})
	must(t, err, "SendNonblocking")
	in[0] = 99 // copied at the start: too late to matter
	must(t, send.Wait(), "the nonblocking send")
	must(t, waitPolling(t, recv), "the nonblocking recv")
	expectValues(t, "received around the ring", got, valuesOf(prev, 6))

	// Blocking between ranks 0 and 1, unnamed ones matched in call order.
	if rank < 2 {
		x := make([]T, 3)
		if rank == 0 {
			must(t, weft.Send(fill[T](0, 3), 1, weft.SendOptions{Name: name + ".blocking"}), "Send")
			must(t, weft.Send(fill[T](10, 3), 1), "the first unnamed Send")
			must(t, weft.Send(fill[T](20, 3), 1), "the second unnamed Send")
		} else {
			must(t, weft.Recv(x, 0, weft.RecvOptions{Name: name + ".blocking"}), "Recv")
			expectValues(t, "Recv", x, valuesOf(0, 3))
			must(t, weft.Recv(x, 0), "the first unnamed Recv")
			expectValues(t, "the first unnamed Recv", x, valuesOf(10, 3))
			must(t, weft.Recv(x, 0), "the second unnamed Recv")
			expectValues(t, "the second unnamed Recv", x, valuesOf(20, 3))
		}
	}

	// RecvAny: rank 0 sends each rank a tensor of its own shape (dst x 2).
	if rank == 0 {
		for dst := 1; dst < size; dst++ {
			must(t, weft.Send(fill[T](dst, 2*dst), dst, weft.SendOptions{Name: name + ".any", Shape: []int64{int64(dst), 2}}), "Send to RecvAny")
			must(t, weft.Send(fill[T](dst, 1), dst, weft.SendOptions{Name: name + ".any.nb"}), "Send to RecvAnyNonblocking")
		}
	} else {
		data, shape, err := weft.RecvAny[T](0, weft.RecvAnyOptions{Name: name + ".any"})
		must(t, err, "RecvAny")
		if len(shape) != 2 || shape[0] != int64(rank) || shape[1] != 2 {
			t.Errorf("rank %d: RecvAny shape = %v, want [%d 2]", rank, shape, rank)
		}
		expectValues(t, "RecvAny", data, valuesOf(rank, 2*rank))
		req, err := weft.RecvAnyNonblocking[T](0, weft.RecvAnyOptions{Name: name + ".any.nb"})
		must(t, err, "RecvAnyNonblocking")
		data, shape, err = req.Result()
		must(t, err, "RecvAnyNonblocking's result")
		if len(shape) != 1 || shape[0] != 1 {
			t.Errorf("rank %d: RecvAnyNonblocking shape = %v, want [1]", rank, shape)
		}
		expectValues(t, "RecvAnyNonblocking", data, valuesOf(rank, 1))
	}
	must(t, weft.Barrier(), "Barrier")
}

// RecvAny of another element type than the sender's: an error naming both.
func TestRecvAnyOfTheWrongType(t *testing.T) {
	if size < 2 {
		t.Skip("needs a peer")
	}
	if rank == 0 {
		must(t, weft.Send(fill[int64](0, 2), 1, weft.SendOptions{Name: "p2p.wrong.type"}), "Send")
	} else if rank == 1 {
		_, _, err := weft.RecvAny[float32](0, weft.RecvAnyOptions{Name: "p2p.wrong.type"})
		expectStatus(t, "RecvAny[float32] of int64 data", err, weft.InvalidArgument,
			"rank 0 sent int64 elements but the result is []float32")
	}
	must(t, weft.Barrier(), "Barrier")
}

func TestBarrier(t *testing.T) {
	must(t, weft.Barrier(), "Barrier")
	req, err := weft.BarrierNonblocking()
	must(t, err, "BarrierNonblocking")
	must(t, waitPolling(t, req), "the nonblocking barrier")
}

// ---- requests --------------------------------------------------------------------------------

// Many ops in flight at once, completed in reverse order.
func TestManyRequestsInFlight(t *testing.T) {
	const n = 8
	sum := make([]float64, n)
	bcast := make([]int64, n)
	nar := make([]float32, n)
	var reqs []*weft.Request
	start := func(r *weft.Request, err error) {
		t.Helper()
		must(t, err, "starting an op")
		reqs = append(reqs, r)
	}
	start(weft.AllreduceNonblocking(fill[float64](rank, n), sum,
		weft.AllreduceOptions{Op: weft.Sum, Name: "inflight.sum"}))
	start(weft.BroadcastNonblocking(fill[int64](rank, n), bcast, 0,
		weft.BroadcastOptions{Name: "inflight.bcast"}))
	start(weft.NeighborAllreduceNonblocking(fill[float32](rank, n), nar,
		weft.NeighborAllreduceOptions{Name: "inflight.nar"}))
	gather, err := weft.AllgatherNonblocking(fill[int32](rank, 1), weft.AllgatherOptions{Name: "inflight.gather"})
	must(t, err, "AllgatherNonblocking")
	start(weft.BarrierNonblocking())
	for i := len(reqs) - 1; i >= 0; i-- {
		must(t, reqs[i].Wait(), fmt.Sprintf("request %d", i))
	}
	got, err := gather.Result()
	must(t, err, "gather")
	var want []float64
	for r := 0; r < size; r++ {
		want = append(want, value(r, 0))
	}
	expectValues(t, "gather", got, want)
	expectValues(t, "sum", sum, sumOverRanks(n))
	expectValues(t, "broadcast", bcast, valuesOf(0, n))
	topo, err := weft.LoadTopology()
	must(t, err, "LoadTopology")
	defer topo.Close()
	self, recv, _ := topo.RecvWeights(rank)
	expectValues(t, "neighbor allreduce", nar, weighted(self, recv, n))
}

// Free gives up the result; dropped requests are freed by their finalizer; the ops still
// complete everywhere and the memory they use is released afterwards.
func TestRequestFreeAndFinalizer(t *testing.T) {
	const n = 1 << 12
	out := make([]float32, n)
	req, err := weft.AllreduceNonblocking(fill[float32](rank, n), out, weft.AllreduceOptions{Name: "free.early"})
	must(t, err, "AllreduceNonblocking")
	req.Free()
	req.Free()
	expectStatus(t, "Wait after Free", req.Wait(), weft.FailedPrecondition, "freed")
	if done, err := req.Poll(); done || weft.StatusOf(err) != weft.FailedPrecondition {
		t.Errorf("rank %d: Poll after Free = %v, %v", rank, done, err)
	}
	for i := 0; i < 3; i++ {
		_, err := weft.AllreduceNonblocking(fill[float32](rank, n), make([]float32, n),
			weft.AllreduceOptions{Name: fmt.Sprintf("free.dropped.%d", i)})
		must(t, err, "AllreduceNonblocking")
		_, err = weft.AllgatherNonblocking(fill[float64](rank, 2),
			weft.AllgatherOptions{Name: fmt.Sprintf("free.dropped.gather.%d", i)})
		must(t, err, "AllgatherNonblocking")
	}
	for i := 0; i < 3; i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	must(t, weft.Barrier(), "Barrier after the dropped requests")
	for i, v := range out {
		if v != 0 {
			t.Fatalf("rank %d: out[%d] = %v was written after Free", rank, i, v)
		}
	}
	// The names are free again once the ops have completed everywhere.
	x := fill[float32](rank, 2)
	must(t, weft.Allreduce(x, x, weft.AllreduceOptions{Name: "free.early"}), "reusing the name")
}

// Ops from several goroutines at once, matched by name across ranks.
func TestConcurrentGoroutines(t *testing.T) {
	const workers, n = 4, 16
	var wg sync.WaitGroup
	errs := make([]error, workers)
	outs := make([][]float64, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			outs[w] = make([]float64, n)
			in := fill[float64](rank+w, n)
			errs[w] = weft.Allreduce(in, outs[w],
				weft.AllreduceOptions{Op: weft.Sum, Name: fmt.Sprintf("concurrent.%d", w)})
		}(w)
	}
	wg.Wait()
	for w := 0; w < workers; w++ {
		must(t, errs[w], fmt.Sprintf("worker %d", w))
		want := make([]float64, n)
		for r := 0; r < size; r++ {
			for i := range want {
				want[i] += value(r+w, i)
			}
		}
		expectValues(t, fmt.Sprintf("worker %d", w), outs[w], want)
	}
}

// ---- errors ----------------------------------------------------------------------------------

// Bad arguments are reported at once, on the calling rank, with what was expected.
func TestArgumentErrors(t *testing.T) {
	in := fill[float32](rank, 4)
	short := make([]float32, 3)
	expectStatus(t, "Allreduce into a short out", weft.Allreduce(in, short),
		weft.InvalidArgument, "out has 3 elements but in has 4")
	_, err := weft.AllreduceNonblocking(in, short)
	expectStatus(t, "AllreduceNonblocking into a short out", err, weft.InvalidArgument,
		"out has 3 elements but in has 4")
	expectStatus(t, "NeighborAllreduce into a short out", weft.NeighborAllreduce(in, short),
		weft.InvalidArgument, "weft.NeighborAllreduce", "out has 3")
	expectStatus(t, "a Shape of the wrong size",
		weft.Allreduce(in, in, weft.AllreduceOptions{Shape: []int64{3, 2}}),
		weft.InvalidArgument, "Shape [3 2] holds 6 elements but the slice has 4")
	expectStatus(t, "a negative dimension",
		weft.Broadcast(in, in, 0, weft.BroadcastOptions{Shape: []int64{-4}}),
		weft.InvalidArgument, "negative")
	expectStatus(t, "two options structs",
		weft.Allreduce(in, in, weft.AllreduceOptions{}, weft.AllreduceOptions{}),
		weft.InvalidArgument, "at most one")
	expectStatus(t, "an unknown ReduceOp",
		weft.Allreduce(in, in, weft.AllreduceOptions{Op: weft.ReduceOp(5)}), weft.InvalidArgument, "Op")

	expectStatus(t, "Broadcast from rank Size()",
		weft.Broadcast(in, in, size, weft.BroadcastOptions{Name: "bad.root"}),
		weft.InvalidArgument, "out of range")
	expectStatus(t, "PairGossip with rank Size()",
		weft.PairGossip(in, in, size, weft.PairGossipOptions{Name: "bad.peer"}),
		weft.InvalidArgument)
	expectStatus(t, "PairGossip with itself",
		weft.PairGossip(in, in, rank, weft.PairGossipOptions{Name: "bad.self"}),
		weft.InvalidArgument)
	expectStatus(t, "a weight for this rank itself",
		weft.NeighborAllreduce(in, in, weft.NeighborAllreduceOptions{
			Weights: &weft.Weights{Self: 0.5, Src: map[int]float64{rank: 0.5}}, Name: "bad.src"}),
		weft.InvalidArgument, "give its weight as self_weight")
	expectStatus(t, "a weight for a rank out of range",
		weft.NeighborAllreduce(in, in, weft.NeighborAllreduceOptions{
			Weights: &weft.Weights{Self: 0.5, Src: map[int]float64{size + 3: 0.5}}, Name: "bad.range"}),
		weft.InvalidArgument, "out of range")
	expectStatus(t, "DstWeights without Weights",
		weft.NeighborAllreduce(in, in, weft.NeighborAllreduceOptions{
			DstWeights: map[int]float64{}, Name: "bad.dst"}),
		weft.InvalidArgument, "dst_weights needs self_weight and src_weights")
	expectStatus(t, "a reserved name",
		weft.Allreduce(in, in, weft.AllreduceOptions{Name: "#3"}), weft.InvalidArgument, "reserved")
	_, err = weft.NeighborAllgather(in, weft.NeighborAllgatherOptions{
		SrcRanks: []int{1 << 40}, Name: "bad.int32"})
	expectStatus(t, "a rank beyond int32", err, weft.InvalidArgument, "SrcRanks")
	expectStatus(t, "Send to itself", weft.Send(in, rank), weft.InvalidArgument, "itself")
	_, err = weft.SendNonblocking(in, rank)
	expectStatus(t, "SendNonblocking to itself", err, weft.InvalidArgument, "itself")
	expectStatus(t, "Recv from rank Size()", weft.Recv(in, size), weft.InvalidArgument, "src")
	_, err = weft.RecvNonblocking(in, -1)
	expectStatus(t, "RecvNonblocking from rank -1", err, weft.InvalidArgument, "out of range")
	_, _, err = weft.RecvAny[float32](size)
	expectStatus(t, "RecvAny from rank Size()", err, weft.InvalidArgument, "src")
	_, err = weft.RecvAnyNonblocking[float32](rank)
	expectStatus(t, "RecvAnyNonblocking from itself", err, weft.InvalidArgument, "itself")
	expectStatus(t, "Recv into a Shape of the wrong size",
		weft.Recv(in, 0, weft.RecvOptions{Shape: []int64{5}}), weft.InvalidArgument, "Shape [5]")
	expectStatus(t, "a rank twice in a set",
		weft.Allreduce(in, in, weft.AllreduceOptions{Ranks: []int{rank, rank}}),
		weft.InvalidArgument, "twice")
	expectStatus(t, "a set rank out of range",
		weft.Allreduce(in, in, weft.AllreduceOptions{Ranks: []int{rank, size}}),
		weft.InvalidArgument, "out of range")
	_, err = weft.AllreduceNonblocking(in, in, weft.AllreduceOptions{Ranks: []int{1 << 40}})
	expectStatus(t, "a set rank beyond int32", err, weft.InvalidArgument, "Ranks")
	if size > 1 {
		other := (rank + 1) % size
		expectStatus(t, "a set without this rank",
			weft.Allreduce(in, in, weft.AllreduceOptions{Ranks: []int{other}}),
			weft.InvalidArgument, "not in `ranks`")
		expectStatus(t, "a root outside the set",
			weft.Broadcast(in, in, other, weft.BroadcastOptions{Ranks: []int{rank}}),
			weft.InvalidArgument, "root_rank")
	}
	expectValues(t, "the input after the failed calls", in, valuesOf(rank, 4))
	must(t, weft.Barrier(), "Barrier: every rank still in step")
}

// What only the other ranks can see is an error on every rank, never a hang.
func TestMismatchesAcrossRanks(t *testing.T) {
	if size < 2 {
		t.Skip("needs 2 ranks")
	}
	last := rank == size-1
	n := 4
	if last {
		n = 5
	}
	x := fill[float32](rank, n)
	expectStatus(t, "shapes that differ under one name",
		weft.Allreduce(x, x, weft.AllreduceOptions{Name: "mismatch.shape"}),
		weft.InvalidArgument, "allreduce 'mismatch.shape'", fmt.Sprintf("[5] on rank %d", size-1))
	expectValues(t, "the input after the failed op", x, valuesOf(rank, n))

	var err error
	if rank == 0 {
		err = weft.Allreduce(fill[float64](rank, 3), make([]float64, 3),
			weft.AllreduceOptions{Name: "mismatch.dtype"})
	} else {
		err = weft.Allreduce(fill[float32](rank, 3), make([]float32, 3),
			weft.AllreduceOptions{Name: "mismatch.dtype"})
	}
	expectStatus(t, "dtypes that differ", err, weft.InvalidArgument, "dtype differs",
		"float64 on rank 0")

	y := fill[int32](rank, 2)
	if rank == 0 {
		err = weft.Broadcast(y, y, 0, weft.BroadcastOptions{Name: "mismatch.op"})
	} else {
		err = weft.Allreduce(y, y, weft.AllreduceOptions{Name: "mismatch.op"})
	}
	expectStatus(t, "ops that differ", err, weft.InvalidArgument, "different operations")

	// Nonblocking: the error comes from Wait.
	req, err := weft.AllreduceNonblocking(x, make([]float32, n), weft.AllreduceOptions{Name: "mismatch.nb"})
	must(t, err, "AllreduceNonblocking")
	expectStatus(t, "shapes that differ, nonblocking", req.Wait(), weft.InvalidArgument,
		"mismatch.nb")
	if done, err := req.Poll(); !done || weft.StatusOf(err) != weft.InvalidArgument {
		t.Errorf("rank %d: Poll after the failed Wait = %v, %v", rank, done, err)
	}

	if size >= 3 {
		// Everyone sends to the next rank but expects data from two ranks back.
		opts := weft.NeighborAllreduceOptions{
			Weights:    &weft.Weights{Self: 0.5, Src: map[int]float64{(rank - 2 + size) % size: 0.5}},
			DstWeights: map[int]float64{(rank + 1) % size: 1},
			Name:       "mismatch.pattern",
		}
		z := fill[float64](rank, 4)
		expectStatus(t, "send and receive sets that do not match",
			weft.NeighborAllreduce(z, z, opts), weft.InvalidArgument,
			"send and receive ranks do not match")
	}
	must(t, weft.Barrier(), "Barrier: every rank still in step")
}

// Ranks calling differently named ops cannot know the others are not just late: each gets
// a DeadlineExceeded after WEFT_STALL_TIMEOUT_SECONDS, naming the missing ranks.
func TestMismatchedNamesTimeOut(t *testing.T) {
	if size < 2 {
		t.Skip("needs 2 ranks")
	}
	must(t, weft.ConfigSet("WEFT_STALL_TIMEOUT_SECONDS", "1.5"), "ConfigSet")
	defer func() { must(t, weft.ConfigUnset("WEFT_STALL_TIMEOUT_SECONDS"), "ConfigUnset") }()
	mine, theirs := "names.b", "names.a"
	if rank == 0 {
		mine, theirs = theirs, mine
	}
	x := fill[float32](rank, 2)
	started := time.Now()
	expectStatus(t, "an op the other ranks call by another name",
		weft.Allreduce(x, x, weft.AllreduceOptions{Name: mine}),
		weft.DeadlineExceeded, "'"+mine+"'", "timed out", "waiting for rank")
	if elapsed := time.Since(started); elapsed > time.Minute {
		t.Errorf("rank %d: the timeout took %v", rank, elapsed)
	}
	expectValues(t, "the input after the timeout", x, valuesOf(rank, 2))
	// Every rank has now seen its op time out; calling the other name is an error at once
	// (and clears what the engine kept about it).
	must(t, weft.Barrier(), "Barrier")
	expectStatus(t, "the name that timed out on the others",
		weft.Allreduce(x, x, weft.AllreduceOptions{Name: theirs}), weft.DeadlineExceeded, theirs)
	must(t, weft.Barrier(), "Barrier")
}
