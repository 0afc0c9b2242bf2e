package weft

import (
	"fmt"
	"math"
	"runtime"
	"sort"
	"unsafe"

	"weft.dev/weft/internal/cconv"
	"weft.dev/weft/internal/cweft"
)

// Element is the element type of the slices the ops take.
type Element interface {
	float32 | float64 | int32 | int64
}

// ---- options ------------------------------------------------------------------------------

// Every op takes at most one options struct; its zero value means the defaults. Name
// matches the op across ranks ("" matches by call order, so every rank must then call the
// same ops in the same order). Shape describes the slice as a tensor (nil: 1-D of its
// length); ranks must agree on it, except for dim 0 in the allgather ops.

// ReduceOp is what Allreduce computes.
type ReduceOp int

const (
	Average ReduceOp = iota // the mean over ranks (the default)
	Sum                     // the sum over ranks
)

// Ranks, when non-empty, is a process set: the op runs among those ranks only (distinct,
// in any order, this rank among them). Only they call it, all with the same set; they are
// matched among themselves by Name (or by call order within the set), so disjoint sets
// run independently. Empty: every rank.
type AllreduceOptions struct {
	Op    ReduceOp
	Name  string
	Shape []int64
	Ranks []int
}

// BroadcastOptions: Ranks as for AllreduceOptions; the root must be one of them.
type BroadcastOptions struct {
	Name  string
	Shape []int64
	Ranks []int
}

// SendOptions and RecvOptions: a send matches the receive on the destination from this rank
// with the same Name ("" matches the pair's unnamed ops in call order). The receiver's
// Shape (and element type) must be the sender's.
type SendOptions struct {
	Name  string
	Shape []int64
}

type RecvOptions struct {
	Name  string
	Shape []int64
}

// RecvAnyOptions: the shape comes from the sender.
type RecvAnyOptions struct {
	Name string
}

type AllgatherOptions struct {
	Name  string
	Shape []int64
}

// NeighborAllgatherOptions: with SrcRanks or DstRanks non-nil this call receives from
// exactly SrcRanks (the result in that order) and sends to exactly DstRanks (nil or empty:
// none) instead of the topology's neighbors.
type NeighborAllgatherOptions struct {
	SrcRanks []int
	DstRanks []int
	Name     string
	Shape    []int64
}

// Weights are explicit receive weights: y = Self*x + sum over j of Src[j] * x_j, where the
// keys of Src are the ranks received from (nil or empty: none, y = Self*x). Self and Src
// go together, as weft requires. Sends still follow the topology unless DstWeights is
// given, and every rank's sends must match what the receivers expect.
type Weights struct {
	Self float64
	Src  map[int]float64
}

// NeighborAllreduceOptions: Weights nil uses the topology's receive weights (a uniform
// average over self and in-neighbors on an unweighted topology). DstWeights non-nil (needs
// Weights) makes this call dynamic: it sends to exactly those ranks, scaled by the weight,
// and the topology is left alone.
type NeighborAllreduceOptions struct {
	Weights    *Weights
	DstWeights map[int]float64
	Name       string
	Shape      []int64
}

// HierarchicalNeighborAllreduceOptions: as NeighborAllreduceOptions, keyed by machine index
// (Weights.Src and DstWeights name machines).
type HierarchicalNeighborAllreduceOptions struct {
	Weights    *Weights
	DstWeights map[int]float64
	Name       string
	Shape      []int64
}

// PairGossipOptions: both peers end with SelfWeight*own + PairWeight*peer's; both zero
// means 0.5 each.
type PairGossipOptions struct {
	SelfWeight float64
	PairWeight float64
	Name       string
	Shape      []int64
}

// ---- blocking ops ---------------------------------------------------------------------------
//
// A blocking op lends the slices' backing arrays to weft for the duration of the call (no
// copy): cgo allows passing Go memory that holds no Go pointers to C while the call runs.
// The output may be the input (in place).

// Allreduce writes the mean (or sum, Op: Sum) over all ranks of in into out.
func Allreduce[T Element](in, out []T, opts ...AllreduceOptions) error {
	const fn = "weft.Allreduce"
	o, l, ranks, err := allreduceArgs[T](fn, in, out, opts)
	if err != nil {
		return err
	}
	return ordered(o.Name, func() cstatus {
		return cweft.Weftgo_allreduce(nil, cconv.Data(in), cconv.Data(out), l.code, l.bits, l.shape,
			cconv.Bool(o.Op == Average), ranks, o.Name)
	})
}

// Broadcast writes root's in into out on every rank (of Ranks, when given).
func Broadcast[T Element](in, out []T, root int, opts ...BroadcastOptions) error {
	const fn = "weft.Broadcast"
	o, l, ranks, err := broadcastArgs[T](fn, in, out, opts)
	if err != nil {
		return err
	}
	return ordered(o.Name, func() cstatus {
		return cweft.Weftgo_broadcast(nil, cconv.Data(in), cconv.Data(out), l.code, l.bits, l.shape,
			root, ranks, o.Name)
	})
}

// Send sends in to rank dst, whose Recv (or RecvAny) from this rank with the same name
// receives it; only the two ranks call. It returns once the data has left in.
func Send[T Element](in []T, dst int, opts ...SendOptions) error {
	const fn = "weft.Send"
	o, l, err := inArgs[T](fn, in, opts, func(o SendOptions) []int64 { return o.Shape })
	if err != nil {
		return err
	}
	return ordered(o.Name, func() cstatus {
		return cweft.Weftgo_send(nil, cconv.Data(in), l.code, l.bits, l.shape, dst, o.Name)
	})
}

// Recv receives what rank src sends with the same name into out, which must have the
// sender's element type and shape (an error on both ranks otherwise).
func Recv[T Element](out []T, src int, opts ...RecvOptions) error {
	const fn = "weft.Recv"
	o, l, err := inArgs[T](fn, out, opts, func(o RecvOptions) []int64 { return o.Shape })
	if err != nil {
		return err
	}
	return ordered(o.Name, func() cstatus {
		return cweft.Weftgo_recv(nil, cconv.Data(out), l.code, l.bits, l.shape, src, o.Name)
	})
}

// RecvAny receives a tensor of whatever shape rank src sends with the same name, and
// returns it with that shape. Its element type must be T: another one is an
// InvalidArgument error (the data is dropped).
func RecvAny[T Element](src int, opts ...RecvAnyOptions) ([]T, []int64, error) {
	const fn = "weft.RecvAny"
	o, err := single(fn, opts)
	if err != nil {
		return nil, nil, err
	}
	var m managedHandle
	err = ordered(o.Name, func() cstatus { return cweft.Weft_comm_recv_any(&m, src, o.Name) })
	if err != nil {
		return nil, nil, err
	}
	return takeReceived[T](fn, src, m)
}

// Allgather returns every rank's in concatenated along dim 0 in rank order (dim 0 may
// differ between ranks). The result comes from weft's own memory, copied into a new slice.
func Allgather[T Element](in []T, opts ...AllgatherOptions) ([]T, error) {
	const fn = "weft.Allgather"
	o, l, err := inArgs[T](fn, in, opts, func(o AllgatherOptions) []int64 { return o.Shape })
	if err != nil {
		return nil, err
	}
	var m managedHandle
	err = ordered(o.Name, func() cstatus {
		return cweft.Weftgo_allgather(nil, &m, cconv.Data(in), l.code, l.bits, l.shape, o.Name)
	})
	if err != nil {
		return nil, err
	}
	return copyManaged[T](fn, m)
}

// NeighborAllgather returns the in-neighbors' in concatenated in rank order (or from
// SrcRanks, in that order); this rank's own in is not included.
func NeighborAllgather[T Element](in []T, opts ...NeighborAllgatherOptions) ([]T, error) {
	const fn = "weft.NeighborAllgather"
	o, l, err := inArgs[T](fn, in, opts, func(o NeighborAllgatherOptions) []int64 { return o.Shape })
	if err != nil {
		return nil, err
	}
	r, err := neighborRanks(fn, o)
	if err != nil {
		return nil, err
	}
	var m managedHandle
	err = ordered(o.Name, func() cstatus {
		return cweft.Weftgo_neighbor_allgather(nil, &m, cconv.Data(in), l.code, l.bits, l.shape,
			r.has, r.src, r.dst, o.Name)
	})
	if err != nil {
		return nil, err
	}
	return copyManaged[T](fn, m)
}

// NeighborAllreduce writes the weighted average of this rank's in and its in-neighbors'
// into out (see NeighborAllreduceOptions for the weights).
func NeighborAllreduce[T Element](in, out []T, opts ...NeighborAllreduceOptions) error {
	const fn = "weft.NeighborAllreduce"
	o, l, err := inOutArgs[T](fn, in, out, opts, func(o NeighborAllreduceOptions) []int64 { return o.Shape })
	if err != nil {
		return err
	}
	w, err := weightArgs(fn, o.Weights, o.DstWeights)
	if err != nil {
		return err
	}
	return ordered(o.Name, func() cstatus {
		return cweft.Weftgo_neighbor_allreduce(nil, cconv.Data(in), cconv.Data(out), l.code, l.bits,
			l.shape, w.has, w.self, w.src, w.hasDst, w.dst, o.Name)
	})
}

// HierarchicalNeighborAllreduce sums in inside each machine, exchanges the sums between
// machines over the machine topology (or the given machine weights), and writes the result
// divided by LocalSize() into out on every rank of the machine.
func HierarchicalNeighborAllreduce[T Element](in, out []T, opts ...HierarchicalNeighborAllreduceOptions) error {
	const fn = "weft.HierarchicalNeighborAllreduce"
	o, l, err := inOutArgs[T](fn, in, out, opts, func(o HierarchicalNeighborAllreduceOptions) []int64 { return o.Shape })
	if err != nil {
		return err
	}
	w, err := weightArgs(fn, o.Weights, o.DstWeights)
	if err != nil {
		return err
	}
	return ordered(o.Name, func() cstatus {
		return cweft.Weftgo_hierarchical_neighbor_allreduce(nil, cconv.Data(in), cconv.Data(out), l.code,
			l.bits, l.shape, w.has, w.self, w.src, w.hasDst, w.dst, o.Name)
	})
}

// PairGossip exchanges in with peer (which must call it with this rank as its peer); both
// end with SelfWeight*own + PairWeight*peer's in out.
func PairGossip[T Element](in, out []T, peer int, opts ...PairGossipOptions) error {
	const fn = "weft.PairGossip"
	o, l, err := inOutArgs[T](fn, in, out, opts, func(o PairGossipOptions) []int64 { return o.Shape })
	if err != nil {
		return err
	}
	self, pair := gossipWeights(o)
	return ordered(o.Name, func() cstatus {
		return cweft.Weftgo_pair_gossip(nil, cconv.Data(in), cconv.Data(out), l.code, l.bits, l.shape,
			peer, self, pair, o.Name)
	})
}

// Barrier returns once every rank has called it.
func Barrier() error { return ordered("", cweft.Weft_comm_barrier) }

// GroupStart opens a group, as NCCL's ncclGroupStart: the ops this goroutine starts until
// GroupEnd do not wake weft's engine thread, so that a burst of nonblocking ops reaches it
// whole and is negotiated and fused as one instead of the first op starting alone (a hint:
// an engine thread awake anyway takes them as they come; waiting for one of them inside
// the group hands them over at once). Groups belong to an OS thread in the C library, so
// GroupStart locks the goroutine to its thread until the matching GroupEnd. Groups nest.
func GroupStart() error {
	runtime.LockOSThread()
	if err := call(cweft.Weft_comm_group_start); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	return nil
}

// GroupEnd closes the group GroupStart opened on this goroutine; the outermost one hands
// its ops to the engine. Without an open group it fails with FailedPrecondition.
func GroupEnd() error {
	if err := call(cweft.Weft_comm_group_end); err != nil {
		return err
	}
	runtime.UnlockOSThread()
	return nil
}

// ---- nonblocking ops ------------------------------------------------------------------------
//
// These copy in into C memory and return at once; see Request for when out is written.

// AllreduceNonblocking starts Allreduce.
func AllreduceNonblocking[T Element](in, out []T, opts ...AllreduceOptions) (*Request, error) {
	const fn = "weft.AllreduceNonblocking"
	o, l, ranks, err := allreduceArgs[T](fn, in, out, opts)
	if err != nil {
		return nil, err
	}
	return startInOut(fn, o.Name, in, out, func(req *reqHandle, cin, cout unsafe.Pointer) cstatus {
		return cweft.Weftgo_allreduce(req, cin, cout, l.code, l.bits, l.shape,
			cconv.Bool(o.Op == Average), ranks, o.Name)
	})
}

// BroadcastNonblocking starts Broadcast.
func BroadcastNonblocking[T Element](in, out []T, root int, opts ...BroadcastOptions) (*Request, error) {
	const fn = "weft.BroadcastNonblocking"
	o, l, ranks, err := broadcastArgs[T](fn, in, out, opts)
	if err != nil {
		return nil, err
	}
	return startInOut(fn, o.Name, in, out, func(req *reqHandle, cin, cout unsafe.Pointer) cstatus {
		return cweft.Weftgo_broadcast(req, cin, cout, l.code, l.bits, l.shape, root, ranks,
			o.Name)
	})
}

// SendNonblocking starts Send; in may be reused at once (it is copied).
func SendNonblocking[T Element](in []T, dst int, opts ...SendOptions) (*Request, error) {
	const fn = "weft.SendNonblocking"
	o, l, err := inArgs[T](fn, in, opts, func(o SendOptions) []int64 { return o.Shape })
	if err != nil {
		return nil, err
	}
	return startIn(fn, o.Name, in, func(req *reqHandle, cin unsafe.Pointer) cstatus {
		return cweft.Weftgo_send(req, cin, l.code, l.bits, l.shape, dst, o.Name)
	}, nil)
}

// RecvNonblocking starts Recv; out is written when the Request completes.
func RecvNonblocking[T Element](out []T, src int, opts ...RecvOptions) (*Request, error) {
	const fn = "weft.RecvNonblocking"
	o, l, err := inArgs[T](fn, out, opts, func(o RecvOptions) []int64 { return o.Shape })
	if err != nil {
		return nil, err
	}
	return startOut(fn, o.Name, out, func(req *reqHandle, cout unsafe.Pointer) cstatus {
		return cweft.Weftgo_recv(req, cout, l.code, l.bits, l.shape, src, o.Name)
	})
}

// RecvAnyNonblocking starts RecvAny; the RecvRequest's Result is the received slice and
// its shape.
func RecvAnyNonblocking[T Element](src int, opts ...RecvAnyOptions) (*RecvRequest[T], error) {
	const fn = "weft.RecvAnyNonblocking"
	o, err := single(fn, opts)
	if err != nil {
		return nil, err
	}
	var h reqHandle
	err = ordered(o.Name, func() cstatus {
		return cweft.Weft_comm_recv_any_nonblocking(&h, src, o.Name)
	})
	if err != nil {
		return nil, err
	}
	// A cell shared with the RecvRequest, as for startGather.
	result := new(received[T])
	r := newRequest(h, nil, func(h reqHandle) error {
		var m managedHandle
		if err := call(func() cstatus { return cweft.Weft_request_take_output(&m, h) }); err != nil {
			return err
		}
		var err error
		result.data, result.shape, err = takeReceived[T](fn, src, m)
		return err
	})
	return &RecvRequest[T]{Request: r, result: result}, nil
}

// AllgatherNonblocking starts Allgather; the GatherRequest's Result is the gathered slice.
func AllgatherNonblocking[T Element](in []T, opts ...AllgatherOptions) (*GatherRequest[T], error) {
	const fn = "weft.AllgatherNonblocking"
	o, l, err := inArgs[T](fn, in, opts, func(o AllgatherOptions) []int64 { return o.Shape })
	if err != nil {
		return nil, err
	}
	return startGather(fn, o.Name, in, func(req *reqHandle, cin unsafe.Pointer) cstatus {
		return cweft.Weftgo_allgather(req, nil, cin, l.code, l.bits, l.shape, o.Name)
	})
}

// NeighborAllgatherNonblocking starts NeighborAllgather.
func NeighborAllgatherNonblocking[T Element](in []T, opts ...NeighborAllgatherOptions) (*GatherRequest[T], error) {
	const fn = "weft.NeighborAllgatherNonblocking"
	o, l, err := inArgs[T](fn, in, opts, func(o NeighborAllgatherOptions) []int64 { return o.Shape })
	if err != nil {
		return nil, err
	}
	r, err := neighborRanks(fn, o)
	if err != nil {
		return nil, err
	}
	return startGather(fn, o.Name, in, func(req *reqHandle, cin unsafe.Pointer) cstatus {
		return cweft.Weftgo_neighbor_allgather(req, nil, cin, l.code, l.bits, l.shape, r.has,
			r.src, r.dst, o.Name)
	})
}

// NeighborAllreduceNonblocking starts NeighborAllreduce.
func NeighborAllreduceNonblocking[T Element](in, out []T, opts ...NeighborAllreduceOptions) (*Request, error) {
	const fn = "weft.NeighborAllreduceNonblocking"
	o, l, err := inOutArgs[T](fn, in, out, opts, func(o NeighborAllreduceOptions) []int64 { return o.Shape })
	if err != nil {
		return nil, err
	}
	w, err := weightArgs(fn, o.Weights, o.DstWeights)
	if err != nil {
		return nil, err
	}
	return startInOut(fn, o.Name, in, out, func(req *reqHandle, cin, cout unsafe.Pointer) cstatus {
		return cweft.Weftgo_neighbor_allreduce(req, cin, cout, l.code, l.bits, l.shape, w.has,
			w.self, w.src, w.hasDst, w.dst, o.Name)
	})
}

// HierarchicalNeighborAllreduceNonblocking starts HierarchicalNeighborAllreduce.
func HierarchicalNeighborAllreduceNonblocking[T Element](in, out []T, opts ...HierarchicalNeighborAllreduceOptions) (*Request, error) {
	const fn = "weft.HierarchicalNeighborAllreduceNonblocking"
	o, l, err := inOutArgs[T](fn, in, out, opts, func(o HierarchicalNeighborAllreduceOptions) []int64 { return o.Shape })
	if err != nil {
		return nil, err
	}
	w, err := weightArgs(fn, o.Weights, o.DstWeights)
	if err != nil {
		return nil, err
	}
	return startInOut(fn, o.Name, in, out, func(req *reqHandle, cin, cout unsafe.Pointer) cstatus {
		return cweft.Weftgo_hierarchical_neighbor_allreduce(req, cin, cout, l.code, l.bits,
			l.shape, w.has, w.self, w.src, w.hasDst, w.dst, o.Name)
	})
}

// PairGossipNonblocking starts PairGossip.
func PairGossipNonblocking[T Element](in, out []T, peer int, opts ...PairGossipOptions) (*Request, error) {
	const fn = "weft.PairGossipNonblocking"
	o, l, err := inOutArgs[T](fn, in, out, opts, func(o PairGossipOptions) []int64 { return o.Shape })
	if err != nil {
		return nil, err
	}
	self, pair := gossipWeights(o)
	return startInOut(fn, o.Name, in, out, func(req *reqHandle, cin, cout unsafe.Pointer) cstatus {
		return cweft.Weftgo_pair_gossip(req, cin, cout, l.code, l.bits, l.shape, peer, self,
			pair, o.Name)
	})
}

// BarrierNonblocking starts Barrier.
func BarrierNonblocking() (*Request, error) {
	var h reqHandle
	if err := ordered("", func() cstatus { return cweft.Weft_comm_barrier_nonblocking(&h) }); err != nil {
		return nil, err
	}
	return newRequest(h, nil, nil), nil
}

// ---- argument checking --------------------------------------------------------------------

type managedHandle = cweft.SwigcptrStruct_SS_DLManagedTensor

// layout is a slice described as a DLPack tensor.
type layout struct {
	code, bits int
	shape      []int64
}

func dtypeOf[T Element]() (code, bits int) {
	var zero T
	switch any(zero).(type) {
	case float32:
		return cconv.DLFloat, 32
	case float64:
		return cconv.DLFloat, 64
	case int32:
		return cconv.DLInt, 32
	default: // int64
		return cconv.DLInt, 64
	}
}

func sizeOf[T Element]() int {
	var zero T
	return int(unsafe.Sizeof(zero))
}

// dataOf is the slice's backing array (nil when empty: weft never reads an empty tensor).
func dataOf[T Element](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}

func layoutOf[T Element](fn string, n int, shape []int64) (layout, error) {
	code, bits := dtypeOf[T]()
	if shape == nil {
		return layout{code, bits, []int64{int64(n)}}, nil
	}
	numel := int64(1)
	for _, d := range shape {
		if d < 0 {
			return layout{}, invalid("%s: Shape %v has a negative dimension", fn, shape)
		}
		numel *= d
	}
	if numel != int64(n) {
		return layout{}, invalid("%s: Shape %v holds %d elements but the slice has %d", fn,
			shape, numel, n)
	}
	return layout{code, bits, shape}, nil
}

func single[O any](fn string, opts []O) (O, error) {
	var o O
	if len(opts) > 1 {
		return o, invalid("%s: pass at most one options struct (got %d)", fn, len(opts))
	}
	if len(opts) == 1 {
		o = opts[0]
	}
	return o, nil
}

func inArgs[T Element, O any](fn string, in []T, opts []O, shapeOf func(O) []int64) (O, layout, error) {
	o, err := single(fn, opts)
	if err != nil {
		return o, layout{}, err
	}
	l, err := layoutOf[T](fn, len(in), shapeOf(o))
	return o, l, err
}

// inOutArgs also checks that out can hold the result: the same length as in.
func inOutArgs[T Element, O any](fn string, in, out []T, opts []O, shapeOf func(O) []int64) (O, layout, error) {
	o, l, err := inArgs(fn, in, opts, shapeOf)
	if err != nil {
		return o, l, err
	}
	if len(out) != len(in) {
		return o, l, invalid("%s: out has %d elements but in has %d; out must have in's "+
			"length (pass in itself for in place)", fn, len(out), len(in))
	}
	return o, l, nil
}

func allreduceArgs[T Element](fn string, in, out []T, opts []AllreduceOptions) (AllreduceOptions, layout, []int32, error) {
	o, l, err := inOutArgs(fn, in, out, opts, func(o AllreduceOptions) []int64 { return o.Shape })
	if err == nil && o.Op != Average && o.Op != Sum {
		err = invalid("%s: Op is %d; expected weft.Average or weft.Sum", fn, int(o.Op))
	}
	if err != nil {
		return o, l, nil, err
	}
	ranks, err := toInt32s(fn, "Ranks", o.Ranks)
	return o, l, ranks, err
}

func broadcastArgs[T Element](fn string, in, out []T, opts []BroadcastOptions) (BroadcastOptions, layout, []int32, error) {
	o, l, err := inOutArgs(fn, in, out, opts, func(o BroadcastOptions) []int64 { return o.Shape })
	if err != nil {
		return o, l, nil, err
	}
	ranks, err := toInt32s(fn, "Ranks", o.Ranks)
	return o, l, ranks, err
}

func toInt32s(fn, what string, ranks []int) ([]int32, error) {
	out := make([]int32, len(ranks))
	for i, r := range ranks {
		if r < math.MinInt32 || r > math.MaxInt32 {
			return nil, invalid("%s: %s has rank %d, which is out of range", fn, what, r)
		}
		out[i] = int32(r)
	}
	return out, nil
}

// rankWeights turns a map into (rank, weight) pairs sorted by rank (weft matches weights to
// senders by rank, so the order only makes calls reproducible).
func rankWeights(fn, what string, m map[int]float64) ([]cweft.RankWeight, error) {
	pairs := make([]cweft.RankWeight, 0, len(m))
	for r, w := range m {
		if r < math.MinInt32 || r > math.MaxInt32 {
			return nil, invalid("%s: %s has rank %d, which is out of range", fn, what, r)
		}
		pairs = append(pairs, cweft.RankWeight{Rank: int32(r), Weight: w})
	}
	sort.Slice(pairs, func(i, j int) bool { return pairs[i].Rank < pairs[j].Rank })
	return pairs, nil
}

type neighborRankArgs struct {
	has      int
	src, dst []int32
}

func neighborRanks(fn string, o NeighborAllgatherOptions) (neighborRankArgs, error) {
	if o.SrcRanks == nil && o.DstRanks == nil {
		return neighborRankArgs{}, nil
	}
	src, err := toInt32s(fn, "SrcRanks", o.SrcRanks)
	if err != nil {
		return neighborRankArgs{}, err
	}
	dst, err := toInt32s(fn, "DstRanks", o.DstRanks)
	if err != nil {
		return neighborRankArgs{}, err
	}
	return neighborRankArgs{1, src, dst}, nil
}

type weightArgList struct {
	has, hasDst int
	self        float64
	src, dst    []cweft.RankWeight
}

func weightArgs(fn string, w *Weights, dstWeights map[int]float64) (weightArgList, error) {
	var a weightArgList
	var err error
	if w != nil {
		a.has, a.self = 1, w.Self
		if a.src, err = rankWeights(fn, "Weights.Src", w.Src); err != nil {
			return a, err
		}
	}
	if dstWeights != nil {
		a.hasDst = 1
		if a.dst, err = rankWeights(fn, "DstWeights", dstWeights); err != nil {
			return a, err
		}
	}
	return a, nil
}

func gossipWeights(o PairGossipOptions) (self, pair float64) {
	if o.SelfWeight == 0 && o.PairWeight == 0 {
		return 0.5, 0.5
	}
	return o.SelfWeight, o.PairWeight
}

// ---- C memory for nonblocking ops and results ----------------------------------------------

func allocC(fn string, nbytes int) (unsafe.Pointer, error) {
	p := cweft.Weftgo_alloc(int64(nbytes))
	if p == nil {
		return nil, &Error{Status: ResourceExhausted,
			Message: fmt.Sprintf("%s: cannot allocate %d bytes of C memory", fn, nbytes)}
	}
	return p, nil
}

// startInOut copies in into C memory, starts the op there (one buffer when in and out are
// the same slice) and returns a Request that copies the C result into out on success.
func startInOut[T Element](fn, name string, in, out []T,
	start func(req *reqHandle, cin, cout unsafe.Pointer) cstatus) (*Request, error) {
	n, size := len(in), sizeOf[T]()
	inPlace := n > 0 && &in[0] == &out[0]
	buffers := 2
	if inPlace {
		buffers = 1
	}
	buf, err := allocC(fn, buffers*n*size)
	if err != nil {
		return nil, err
	}
	cin := unsafe.Slice((*T)(buf), n)
	copy(cin, in)
	coutPtr := buf
	if !inPlace {
		coutPtr = unsafe.Add(buf, n*size)
	}
	cout := unsafe.Slice((*T)(coutPtr), n)
	var h reqHandle
	if err := ordered(name, func() cstatus { return start(&h, buf, coutPtr) }); err != nil {
		cweft.Weftgo_free(buf)
		return nil, err
	}
	return newRequest(h, buf, func(reqHandle) error {
		copy(out, cout)
		return nil
	}), nil
}

// startIn copies in into C memory and starts an op that reads it (send, the gathering
// ops); finish (may be nil) delivers the result when the op completes.
func startIn[T Element](fn, name string, in []T, start func(req *reqHandle, cin unsafe.Pointer) cstatus,
	finish func(reqHandle) error) (*Request, error) {
	buf, err := allocC(fn, len(in)*sizeOf[T]())
	if err != nil {
		return nil, err
	}
	copy(unsafe.Slice((*T)(buf), len(in)), in)
	var h reqHandle
	if err := ordered(name, func() cstatus { return start(&h, buf) }); err != nil {
		cweft.Weftgo_free(buf)
		return nil, err
	}
	return newRequest(h, buf, finish), nil
}

// startOut starts an op that writes into C memory (recv) and returns a Request that
// copies the result into out on success.
func startOut[T Element](fn, name string, out []T,
	start func(req *reqHandle, cout unsafe.Pointer) cstatus) (*Request, error) {
	buf, err := allocC(fn, len(out)*sizeOf[T]())
	if err != nil {
		return nil, err
	}
	cout := unsafe.Slice((*T)(buf), len(out))
	var h reqHandle
	if err := ordered(name, func() cstatus { return start(&h, buf) }); err != nil {
		cweft.Weftgo_free(buf)
		return nil, err
	}
	return newRequest(h, buf, func(reqHandle) error {
		copy(out, cout)
		return nil
	}), nil
}

// startGather copies in into C memory and starts a gathering op; the result is taken from
// the request when it completes.
func startGather[T Element](fn, name string, in []T,
	start func(req *reqHandle, cin unsafe.Pointer) cstatus) (*GatherRequest[T], error) {
	// The result goes to a cell shared with the GatherRequest, not to the GatherRequest
	// itself: a reference from the Request's finish back to it would make a cycle through
	// the finalized Request, which Go then never finalizes.
	result := new([]T)
	r, err := startIn(fn, name, in, start, func(h reqHandle) error {
		var m managedHandle
		if err := call(func() cstatus { return cweft.Weft_request_take_output(&m, h) }); err != nil {
			return err
		}
		var err error
		*result, err = copyManaged[T](fn, m)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &GatherRequest[T]{Request: r, result: result}, nil
}

// takeReceived copies a received tensor (recv_any) into a new slice and returns its shape;
// the sender chose its element type, so another than T is the caller's error, not weft's.
func takeReceived[T Element](fn string, src int, m managedHandle) ([]T, []int64, error) {
	if m == 0 {
		return nil, nil, &Error{Status: Internal, Message: fn + ": the library returned no output"}
	}
	code, bits := dtypeOf[T]()
	if got := cweft.Weftgo_managed_dtype(m); got != code*256+bits {
		cweft.Weftgo_managed_delete(m)
		return nil, nil, invalid("%s: rank %d sent %s elements but the result is []%s; "+
			"receive with the sender's element type", fn, src, dtypeName(got/256, got%256),
			dtypeName(code, bits))
	}
	shape := make([]int64, cweft.Weftgo_managed_ndim(m))
	for d := range shape {
		shape[d] = cweft.Weftgo_managed_dim(m, d)
	}
	data, err := copyManaged[T](fn, m)
	if err != nil {
		return nil, nil, err
	}
	return data, shape, nil
}

// dtypeName names a DLPack dtype as Go does where it can.
func dtypeName(code, bits int) string {
	switch {
	case code == cconv.DLFloat && (bits == 32 || bits == 64):
		return fmt.Sprintf("float%d", bits)
	case code == cconv.DLInt && (bits == 32 || bits == 64):
		return fmt.Sprintf("int%d", bits)
	default:
		return fmt.Sprintf("DLPack (code %d, %d bits)", code, bits)
	}
}

// copyManaged copies a library-allocated result into a new slice and calls its deleter.
func copyManaged[T Element](fn string, m managedHandle) ([]T, error) {
	if m == 0 {
		return nil, &Error{Status: Internal, Message: fn + ": the library returned no output"}
	}
	defer cweft.Weftgo_managed_delete(m)
	code, bits := dtypeOf[T]()
	if got := cweft.Weftgo_managed_dtype(m); got != code*256+bits {
		return nil, &Error{Status: Internal, Message: fmt.Sprintf(
			"%s: the output has DLPack dtype (%d, %d), expected (%d, %d)", fn, got/256, got%256,
			code, bits)}
	}
	n := cweft.Weftgo_managed_numel(m)
	out := make([]T, n)
	if n > 0 {
		copy(out, unsafe.Slice((*T)(cweft.Weftgo_managed_data(m)), n))
	}
	return out, nil
}
