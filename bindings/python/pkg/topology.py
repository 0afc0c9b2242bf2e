"""Virtual topologies and dynamic schedules: every name of Bluefog's topology_util.

    from weft import topology as topology_util
    G = topology_util.ExponentialGraph(8)        # a networkx.DiGraph

A topology is a weighted directed graph over ranks: W[i][j] is the weight of the edge
i -> j, applied by the receiver j; W[i][i] is rank i's self weight. As in Bluefog, the
generators return networkx DiGraphs over nodes 0..n-1 with the edge attribute "weight",
self weights on self loops (a missing self loop is self weight 0). Every function that
takes a topology takes such a graph or a weft Topology (the C library's graph, which
Topology.from_networkx and Topology.to_networkx convert both ways).
"""

from . import lowlevel as _c


class _LazyNumpy:
    """NumPy, imported when a topology first needs it (`import weft` does not load it)."""

    def __getattr__(self, name):
        import numpy
        return getattr(numpy, name)


np = _LazyNumpy()

__all__ = [
    "Topology", "isPowerOf", "ExponentialTwoGraph", "ExponentialGraph", "SymmetricExponentialGraph",
    "MeshGrid2DGraph", "StarGraph", "RingGraph", "FullyConnectedGraph", "GetRecvWeights",
    "GetSendWeights", "IsRegularGraph", "IsTopologyEquivalent",
    "GetDynamicOnePeerSendRecvRanks", "GetExp2DynamicSendRecvMachineRanks",
    "GetInnerOuterRingDynamicSendRecvRanks", "GetInnerOuterExpo2DynamicSendRecvRanks",
]


class Topology:
    """A weft topology (owns its C handle)."""

    __slots__ = ("_ptr",)

    def __init__(self, ptr):
        self._ptr = ptr

    def __del__(self):
        ptr = getattr(self, "_ptr", None)
        if ptr is not None:
            self._ptr = None
            _c.weft_topology_destroy(ptr)

    # -- construction --
    @classmethod
    def empty(cls, size):
        """`size` ranks, no edges, every self weight 1."""
        return cls(_c.weft_topology_create(int(size)))

    @classmethod
    def exponential(cls, size, base=2):
        return cls(_c.weft_topology_exponential(int(size), int(base)))

    @classmethod
    def from_weight_matrix(cls, weights):
        """From a square matrix (nested lists or a 2-D array): nonzero W[i][j] (i != j) is
        an edge."""
        w = np.ascontiguousarray(weights, dtype=np.float64)
        if w.ndim != 2 or w.shape[0] != w.shape[1]:
            raise ValueError(f"the weight matrix must be square, got shape {w.shape}")
        return cls(_c.weft_topology_from_weight_matrix(w.shape[0], w))

    @classmethod
    def from_networkx(cls, graph):
        """From a networkx DiGraph over nodes 0..n-1 (edge attribute "weight", default 1;
        a missing self loop means self weight 0)."""
        n = graph.number_of_nodes()
        if sorted(graph.nodes()) != list(range(n)):
            raise ValueError("the graph's nodes must be the ranks 0..n-1")
        w = np.zeros((n, n))
        for i, j, data in graph.edges(data=True):
            w[i][j] = data.get("weight", 1.0)
        return cls.from_weight_matrix(w)

    @classmethod
    def coerce(cls, topology):
        """A Topology from a Topology or a networkx graph."""
        if isinstance(topology, Topology):
            return topology
        if hasattr(topology, "edges") and hasattr(topology, "number_of_nodes"):
            return cls.from_networkx(topology)
        raise TypeError(
            f"expected a weft Topology or a networkx DiGraph, got {type(topology).__name__}")

    # -- editing --
    def add_edge(self, src, dst, weight):
        _c.weft_topology_add_edge(self._ptr, int(src), int(dst), float(weight))

    def set_self_weight(self, rank, weight):
        _c.weft_topology_set_self_weight(self._ptr, int(rank), float(weight))

    def copy(self):
        return Topology(_c.weft_topology_clone(self._ptr))

    # -- queries --
    @property
    def size(self):
        return _c.weft_topology_size(self._ptr)

    def number_of_nodes(self):
        return self.size

    def weight(self, src, dst):
        return _c.weft_topology_weight(self._ptr, int(src), int(dst))

    def in_neighbors(self, rank):
        """In-neighbors (self excluded), sorted by rank."""
        return _c.weft_topology_in_neighbors(self.size, self._ptr, int(rank))

    def out_neighbors(self, rank):
        return _c.weft_topology_out_neighbors(self.size, self._ptr, int(rank))

    # networkx-style spellings used by Bluefog programs.
    predecessors = in_neighbors
    successors = out_neighbors

    def weight_matrix(self):
        n = self.size
        return np.array(_c.weft_topology_weight_matrix(n * n, self._ptr)).reshape(n, n)

    def to_networkx(self):
        """A networkx DiGraph with the edge attribute "weight" (self loops included)."""
        import networkx as nx

        w = self.weight_matrix()
        graph = nx.DiGraph()
        graph.add_nodes_from(range(self.size))
        for i, j in zip(*np.nonzero(w)):
            graph.add_edge(int(i), int(j), weight=float(w[i][j]))
        return graph

    def __eq__(self, other):
        if not isinstance(other, Topology):
            return NotImplemented
        return self.size == other.size and np.array_equal(self.weight_matrix(),
                                                          other.weight_matrix())

    __hash__ = None

    def __repr__(self):
        edges = sum(len(self.out_neighbors(r)) for r in range(self.size))
        return f"<weft.Topology: {self.size} ranks, {edges} edges>"


# ---- generators: networkx DiGraphs, as Bluefog's ---------------------------------------


def _graph(ptr):
    return Topology(ptr).to_networkx()


def isPowerOf(x, base):
    """True when x is base^k for some integer k >= 0 (base an integer above 1)."""
    if not isinstance(base, int) or base < 2:
        raise ValueError(f"isPowerOf: base must be an integer above 1, got {base!r}")
    if x <= 0:
        return False
    while x % base == 0:
        x //= base
    return x == 1


def ExponentialTwoGraph(size):
    """Rank i sends to i + 2^k (mod size); equal weights per row, self included."""
    return _graph(_c.weft_topology_exponential_two(int(size)))


def ExponentialGraph(size, base=2):
    """Rank i sends to i + base^k (mod size) for every base^k < size; equal weights."""
    return _graph(_c.weft_topology_exponential(int(size), int(base)))


def SymmetricExponentialGraph(size, base=4):
    """Rank i connects to i + d for every offset d whose distance around the ring,
    min(d, size - d), is a power of base (1 included); equal weights. Bluefog's graph."""
    return _graph(_c.weft_topology_symmetric_exponential(int(size), int(base)))


def MeshGrid2DGraph(size, shape=None):
    """A 4-neighbor grid (rows = the largest divisor of size not above sqrt(size)), with
    Metropolis-Hastings weights."""
    rows, cols = (0, 0) if shape is None else (int(shape[0]), int(shape[1]))
    return _graph(_c.weft_topology_mesh_grid_2d(int(size), rows, cols))


def StarGraph(size, center_rank=0):
    return _graph(_c.weft_topology_star(int(size), int(center_rank)))


def RingGraph(size, connect_style=0):
    """connect_style 0: both directions, 1/3 each; 1: i -> i-1; 2: i -> i+1 (1/2 each)."""
    return _graph(_c.weft_topology_ring(int(size), int(connect_style)))


def FullyConnectedGraph(size):
    return _graph(_c.weft_topology_fully_connected(int(size)))

# ---- helpers -----------------------------------------------------------------------------


def GetRecvWeights(topo, rank):
    """(self_weight, {in_neighbor: weight}): W[rank][rank] and column `rank`."""
    t = Topology.coerce(topo)
    return _c.weft_topology_recv_weights(t.size, t._ptr, int(rank))


def GetSendWeights(topo, rank):
    """(self_weight, {out_neighbor: weight}): row `rank`."""
    t = Topology.coerce(topo)
    return _c.weft_topology_send_weights(t.size, t._ptr, int(rank))


def IsRegularGraph(topo):
    """Every rank has the same degree, in-edges plus out-edges (a self loop counts twice,
    as networkx counts it)."""
    w = Topology.coerce(topo).weight_matrix() != 0
    degrees = w.sum(axis=0) + w.sum(axis=1)
    return bool(np.all(degrees == degrees[0]))


def IsTopologyEquivalent(topo1, topo2):
    """Same ranks and the same weight on every edge, self loops included (False when
    either is None)."""
    if topo1 is None or topo2 is None:
        return False
    w1 = Topology.coerce(topo1).weight_matrix()
    w2 = Topology.coerce(topo2).weight_matrix()
    return w1.shape == w2.shape and bool(np.array_equal(w1, w2))

# ---- dynamic schedules: infinite generators of (send_ranks, recv_ranks) ---------------------


def _steps(schedule, capacity):
    try:
        while True:
            _c.weft_schedule_next(schedule)
            yield (_c.weft_schedule_send_ranks(capacity, schedule),
                   _c.weft_schedule_recv_ranks(capacity, schedule))
    finally:
        _c.weft_schedule_destroy(schedule)


def GetDynamicOnePeerSendRecvRanks(topo, self_rank):
    """One out-neighbor per step, clockwise from self_rank; receives from every rank whose
    step target is self_rank."""
    t = Topology.coerce(topo)
    return _steps(_c.weft_schedule_one_peer(t._ptr, int(self_rank)), t.size)


def GetExp2DynamicSendRecvMachineRanks(world_size, local_size, self_rank, local_rank):
    """Machine-level exponential-2 schedule, yielding machine indices."""
    machines = int(world_size) // int(local_size)
    return _steps(_c.weft_schedule_machine_exponential_two(machines,
                                                            int(self_rank) // int(local_size)),
                  max(machines, 1))


def GetInnerOuterRingDynamicSendRecvRanks(world_size, local_size, self_rank):
    return _steps(_c.weft_schedule_inner_outer_ring(int(world_size), int(local_size),
                                                    int(self_rank)), int(world_size))


def GetInnerOuterExpo2DynamicSendRecvRanks(world_size, local_size, self_rank):
    return _steps(_c.weft_schedule_inner_outer_exponential_two(
        int(world_size), int(local_size), int(self_rank)), int(world_size))
