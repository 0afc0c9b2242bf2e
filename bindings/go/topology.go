package weft

import (
	"math"
	"runtime"

	"weft.dev/weft/internal/cconv"
	"weft.dev/weft/internal/cweft"
)

type topoHandle = cweft.SwigcptrStruct_SS_weft_topology

// Topology is a weighted directed graph over ranks: W[i][j] is the weight of the edge
// i -> j, applied by the receiver j, and W[i][i] is rank i's self weight. It is plain data
// (usable before Init) held in C memory: Close frees it (a finalizer does so if Close is
// forgotten). A Topology is not safe for concurrent use with Close.
type Topology struct {
	h topoHandle // 0 once closed
}

// newTopology runs a C constructor that stores a handle in its out-parameter.
func newTopology(create func(out *topoHandle) cstatus) (*Topology, error) {
	var h topoHandle
	if err := call(func() cstatus { return create(&h) }); err != nil {
		return nil, err
	}
	t := &Topology{h: h}
	runtime.SetFinalizer(t, (*Topology).Close)
	return t, nil
}

// NewTopology returns n ranks with no edges and every self weight 1 (build it with AddEdge
// and SetSelfWeight).
func NewTopology(n int) (*Topology, error) {
	return newTopology(func(out *topoHandle) cstatus { return cweft.Weft_topology_create(out, n) })
}

// TopologyFromWeightMatrix builds a topology from a square matrix: w[i][j] != 0 (i != j) is
// an edge i -> j with that weight, w[i][i] the self weight.
func TopologyFromWeightMatrix(w [][]float64) (*Topology, error) {
	n := len(w)
	dense := make([]float64, 0, n*n)
	for i, row := range w {
		if len(row) != n {
			return nil, invalid("weft.TopologyFromWeightMatrix: the matrix must be square: "+
				"it has %d rows but row %d has %d entries", n, i, len(row))
		}
		dense = append(dense, row...)
	}
	return newTopology(func(out *topoHandle) cstatus {
		return cweft.Weft_topology_from_weight_matrix(out, n, dense)
	})
}

// ExponentialGraph is the circulant graph where rank i sends to i + base^k (mod n) for every
// k >= 0 with base^k < n; every row (self included) has equal weights.
func ExponentialGraph(n, base int) (*Topology, error) {
	return newTopology(func(out *topoHandle) cstatus {
		return cweft.Weft_topology_exponential(out, n, base)
	})
}

// ExponentialTwoGraph is ExponentialGraph(n, 2).
func ExponentialTwoGraph(n int) (*Topology, error) {
	return newTopology(func(out *topoHandle) cstatus {
		return cweft.Weft_topology_exponential_two(out, n)
	})
}

// SymmetricExponentialGraph connects i with i + d for every offset d whose distance
// around the ring, min(d, n-d), is a power of base (1 included): an undirected circulant
// graph, equal weights per row, as Bluefog defines it. Bluefog's default base is 4.
func SymmetricExponentialGraph(n, base int) (*Topology, error) {
	return newTopology(func(out *topoHandle) cstatus {
		return cweft.Weft_topology_symmetric_exponential(out, n, base)
	})
}

// MeshGrid2DGraph is a rows x cols 4-neighbor grid with weights 1/max(deg_i+1, deg_j+1)
// and self weight 1 - the row's other weights. rows = cols = 0 picks rows as the largest
// divisor of n not above sqrt(n).
func MeshGrid2DGraph(n, rows, cols int) (*Topology, error) {
	return newTopology(func(out *topoHandle) cstatus {
		return cweft.Weft_topology_mesh_grid_2d(out, n, rows, cols)
	})
}

// StarGraph: every leaf exchanges with center; leaves keep self weight 1 - 1/n, the
// center's row and column are 1/n.
func StarGraph(n, center int) (*Topology, error) {
	return newTopology(func(out *topoHandle) cstatus { return cweft.Weft_topology_star(out, n, center) })
}

// RingStyle selects the edges of RingGraph.
type RingStyle int

const (
	RingBidirectional RingStyle = 0 // i <-> i+1, weight 1/3 each (self included)
	RingLeft          RingStyle = 1 // i -> i-1, weight 1/2
	RingRight         RingStyle = 2 // i -> i+1, weight 1/2
)

// RingGraph is a ring over n ranks.
func RingGraph(n int, style RingStyle) (*Topology, error) {
	return newTopology(func(out *topoHandle) cstatus {
		return cweft.Weft_topology_ring(out, n, int(style))
	})
}

// FullyConnectedGraph has every edge, weight 1/n everywhere.
func FullyConnectedGraph(n int) (*Topology, error) {
	return newTopology(func(out *topoHandle) cstatus {
		return cweft.Weft_topology_fully_connected(out, n)
	})
}

// errClosed is the error of a method called after Close.
func errClosed(method string) error {
	return &Error{Status: FailedPrecondition,
		Message: "weft.Topology." + method + ": the topology was closed"}
}

// handle returns the C handle, or an error once closed. Callers keep t alive (KeepAlive)
// until their C call has returned, so that the finalizer cannot free it mid-call.
func (t *Topology) handle(method string) (topoHandle, error) {
	if t == nil || t.h == 0 {
		return 0, errClosed(method)
	}
	return t.h, nil
}

// Close frees the topology; later calls on it fail. Closing twice is fine.
func (t *Topology) Close() {
	if t == nil || t.h == 0 {
		return
	}
	cweft.Weft_topology_destroy(t.h)
	t.h = 0
	runtime.SetFinalizer(t, nil)
}

// Clone returns an independent copy.
func (t *Topology) Clone() (*Topology, error) {
	defer runtime.KeepAlive(t)
	h, err := t.handle("Clone")
	if err != nil {
		return nil, err
	}
	return newTopology(func(out *topoHandle) cstatus { return cweft.Weft_topology_clone(out, h) })
}

// Size is the number of ranks (0 once closed).
func (t *Topology) Size() int {
	defer runtime.KeepAlive(t)
	if t == nil || t.h == 0 {
		return 0
	}
	return cweft.Weft_topology_size(t.h)
}

// AddEdge adds (or re-weights) the edge from -> to.
func (t *Topology) AddEdge(from, to int, weight float64) error {
	defer runtime.KeepAlive(t)
	h, err := t.handle("AddEdge")
	if err != nil {
		return err
	}
	return call(func() cstatus { return cweft.Weft_topology_add_edge(h, from, to, weight) })
}

// SetSelfWeight sets W[rank][rank].
func (t *Topology) SetSelfWeight(rank int, weight float64) error {
	defer runtime.KeepAlive(t)
	h, err := t.handle("SetSelfWeight")
	if err != nil {
		return err
	}
	return call(func() cstatus { return cweft.Weft_topology_set_self_weight(h, rank, weight) })
}

// Weight is W[from][to]: 0 when there is no edge, the self weight when from == to.
func (t *Topology) Weight(from, to int) (float64, error) {
	defer runtime.KeepAlive(t)
	h, err := t.handle("Weight")
	if err != nil {
		return 0, err
	}
	var w float64
	err = call(func() cstatus { return cweft.Weft_topology_weight(&w, h, from, to) })
	return w, err
}

// InNeighbors are the ranks with an edge to rank, sorted, rank itself excluded.
func (t *Topology) InNeighbors(rank int) ([]int, error) {
	defer runtime.KeepAlive(t)
	h, err := t.handle("InNeighbors")
	if err != nil {
		return nil, err
	}
	return fetchRanks(func(buf []int32, count *uint64) cstatus {
		return cweft.Weft_topology_in_neighbors(buf, count, h, rank)
	})
}

// OutNeighbors are the ranks rank has an edge to, sorted, rank itself excluded.
func (t *Topology) OutNeighbors(rank int) ([]int, error) {
	defer runtime.KeepAlive(t)
	h, err := t.handle("OutNeighbors")
	if err != nil {
		return nil, err
	}
	return fetchRanks(func(buf []int32, count *uint64) cstatus {
		return cweft.Weft_topology_out_neighbors(buf, count, h, rank)
	})
}

// WeightMatrix returns W as Size() rows of Size() weights.
func (t *Topology) WeightMatrix() ([][]float64, error) {
	defer runtime.KeepAlive(t)
	h, err := t.handle("WeightMatrix")
	if err != nil {
		return nil, err
	}
	dense, err := fetch(func(buf []float64, count *uint64) cstatus {
		return cweft.Weft_topology_weight_matrix(buf, count, h)
	})
	if err != nil {
		return nil, err
	}
	n := int(math.Round(math.Sqrt(float64(len(dense)))))
	w := make([][]float64, n)
	for i := range w {
		w[i] = dense[i*n : (i+1)*n : (i+1)*n]
	}
	return w, nil
}

// RecvWeights is what rank applies when receiving: its self weight W[rank][rank] and
// {i: W[i][rank]} for each in-neighbor i.
func (t *Topology) RecvWeights(rank int) (self float64, neighbors map[int]float64, err error) {
	return t.weights("RecvWeights", rank, cweft.Weft_topology_recv_weights)
}

// SendWeights is row rank: the self weight and {j: W[rank][j]} for each out-neighbor j.
func (t *Topology) SendWeights(rank int) (self float64, neighbors map[int]float64, err error) {
	return t.weights("SendWeights", rank, cweft.Weft_topology_send_weights)
}

type weightsFunc func(self *float64, pairs []cweft.RankWeight, count *uint64,
	topo cweft.Struct_SS_weft_topology, rank int) cstatus

func (t *Topology) weights(method string, rank int, get weightsFunc) (float64, map[int]float64, error) {
	defer runtime.KeepAlive(t)
	h, err := t.handle(method)
	if err != nil {
		return 0, nil, err
	}
	var self float64
	pairs, err := fetch(func(buf []cweft.RankWeight, count *uint64) cstatus {
		return get(&self, buf, count, h, rank)
	})
	if err != nil {
		return 0, nil, err
	}
	m := make(map[int]float64, len(pairs))
	for _, p := range pairs {
		m[int(p.Rank)] = p.Weight
	}
	return self, m, nil
}

// IsRegular reports whether every rank has the same in-degree and the same out-degree.
func (t *Topology) IsRegular() (bool, error) {
	defer runtime.KeepAlive(t)
	h, err := t.handle("IsRegular")
	if err != nil {
		return false, err
	}
	var result int32
	err = call(func() cstatus { return cweft.Weft_topology_is_regular(&result, h) })
	return result != 0, err
}

// IsEquivalent reports whether both topologies have the same size and the same edges
// (weights ignored).
func (t *Topology) IsEquivalent(other *Topology) (bool, error) {
	defer runtime.KeepAlive(t)
	defer runtime.KeepAlive(other)
	h, err := t.handle("IsEquivalent")
	if err != nil {
		return false, err
	}
	o, err := other.handle("IsEquivalent")
	if err != nil {
		return false, err
	}
	var result int32
	err = call(func() cstatus { return cweft.Weft_topology_is_equivalent(&result, h, o) })
	return result != 0, err
}

// ---- the process's topology -------------------------------------------------------------

// SetTopology makes t (copied) the topology of the neighbor ops. Collective: every rank
// passes an equivalent graph, else every rank gets an error and nothing changes; it also
// fails while ops are in flight. isWeighted: use t's weights by default (otherwise a
// uniform average over self and in-neighbors).
func SetTopology(t *Topology, isWeighted bool) error {
	defer runtime.KeepAlive(t)
	h, err := t.handle("SetTopology")
	if err != nil {
		return err
	}
	return ordered("", func() cstatus { return cweft.Weft_comm_set_topology(h, cconv.Bool(isWeighted)) })
}

// LoadTopology returns a copy of the topology in force.
func LoadTopology() (*Topology, error) { return newTopology(cweft.Weft_comm_load_topology) }

// IsTopologyWeighted reports the isWeighted flag of the topology in force.
func IsTopologyWeighted() bool { return cweft.Weft_comm_is_topo_weighted() != 0 }

// InNeighborRanks are this rank's in-neighbors in the topology in force.
func InNeighborRanks() ([]int, error) { return fetchRanks(cweft.Weft_comm_in_neighbor_ranks) }

// OutNeighborRanks are this rank's out-neighbors in the topology in force.
func OutNeighborRanks() ([]int, error) { return fetchRanks(cweft.Weft_comm_out_neighbor_ranks) }

// SetMachineTopology sets the graph between machines used by HierarchicalNeighborAllreduce
// (collective, like SetTopology).
func SetMachineTopology(t *Topology, isWeighted bool) error {
	defer runtime.KeepAlive(t)
	h, err := t.handle("SetMachineTopology")
	if err != nil {
		return err
	}
	return call(func() cstatus {
		return cweft.Weft_comm_set_machine_topology(h, cconv.Bool(isWeighted))
	})
}

// LoadMachineTopology returns a copy of the machine-level topology in force.
func LoadMachineTopology() (*Topology, error) {
	return newTopology(cweft.Weft_comm_load_machine_topology)
}

// ---- helpers ------------------------------------------------------------------------------

// fetch follows the ABI's (buffer, capacity, *count) convention: a too-small buffer is
// OutOfRange with *count set to the size needed, so retry once with that size (the loop
// covers a size that grows in between, e.g. a concurrent SetTopology).
func fetch[T any](get func(buf []T, count *uint64) cstatus) ([]T, error) {
	buf := make([]T, 16)
	for {
		var count uint64
		err := call(func() cstatus { return get(buf, &count) })
		switch {
		case err == nil:
			return buf[:count:count], nil
		case StatusOf(err) == OutOfRange && count > uint64(len(buf)):
			buf = make([]T, count)
		default:
			return nil, err
		}
	}
}

func fetchRanks(get func(buf []int32, count *uint64) cstatus) ([]int, error) {
	ranks, err := fetch(get)
	if err != nil {
		return nil, err
	}
	out := make([]int, len(ranks))
	for i, r := range ranks {
		out[i] = int(r)
	}
	return out, nil
}
