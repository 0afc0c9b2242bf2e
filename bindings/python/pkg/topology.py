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
from ._tensors import numpy as np  # imported at its first use

__all__ = [
    "Topology", "isPowerOf", "ExponentialTwoGraph", "ExponentialGraph", "SymmetricExponentialGraph",
    "MeshGrid2DGraph", "StarGraph", "RingGraph", "FullyConnectedGraph", "GetRecvWeights",
    "GetSendWeights", "IsRegularGraph", "IsTopologyEquivalent",
    "GetDynamicOnePeerSendRecvRanks", "GetExp2DynamicSendRecvMachineRanks",
    "GetInnerOuterRingDynamicSendRecvRanks", "GetInnerOuterExpo2DynamicSendRecvRanks",
]


class Topology:
    """A weft topology: a weighted directed graph over ranks, owning its C handle.

    W[i][j] is the weight of the edge i -> j, applied by the receiver j; W[i][i] is rank
    i's self weight. Build one with the class methods (empty, exponential,
    from_weight_matrix, from_networkx, coerce); Topology(ptr) only wraps a C handle.
    Equality compares sizes and weight matrices; topologies are not hashable.

    Examples
    --------
    >>> t = Topology.empty(3)
    >>> t.add_edge(0, 1, 0.5)
    >>> t.in_neighbors(1)
    [0]
    """

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
        """A topology of `size` ranks, no edges, every self weight 1.

        Parameters
        ----------
        size : int
            The number of ranks.

        Returns
        -------
        Topology
        """
        return cls(_c.weft_topology_create(int(size)))

    @classmethod
    def exponential(cls, size, base=2):
        """The exponential graph: rank i sends to i + base^k (mod size) for every base^k < size.

        weft's default topology (base 2); ExponentialGraph returns the same graph as a
        networkx DiGraph.

        Parameters
        ----------
        size : int
            The number of ranks.
        base : int, optional
            The base of the offsets (default 2).

        Returns
        -------
        Topology
        """
        return cls(_c.weft_topology_exponential(int(size), int(base)))

    @classmethod
    def from_weight_matrix(cls, weights):
        """A topology from a square weight matrix: nonzero W[i][j] (i != j) is an edge.

        Parameters
        ----------
        weights : array_like
            A size x size matrix (nested lists or a 2-D array); W[i][i] is rank i's self
            weight.

        Returns
        -------
        Topology

        Raises
        ------
        ValueError
            The matrix is not square.

        Examples
        --------
        >>> Topology.from_weight_matrix([[0.5, 0.5], [0.5, 0.5]])
        <weft.Topology: 2 ranks, 2 edges>
        """
        w = np.ascontiguousarray(weights, dtype=np.float64)
        if w.ndim != 2 or w.shape[0] != w.shape[1]:
            raise ValueError(f"the weight matrix must be square, got shape {w.shape}")
        return cls(_c.weft_topology_from_weight_matrix(w.shape[0], w))

    @classmethod
    def from_networkx(cls, graph):
        """A topology from a networkx DiGraph over the nodes 0 .. n-1.

        Parameters
        ----------
        graph : networkx.DiGraph
            Edges carry the attribute "weight" (default 1); self loops carry the self
            weights, a missing self loop meaning self weight 0.

        Returns
        -------
        Topology

        Raises
        ------
        ValueError
            The nodes are not the ranks 0 .. n-1.
        """
        n = graph.number_of_nodes()
        if sorted(graph.nodes()) != list(range(n)):
            raise ValueError("the graph's nodes must be the ranks 0..n-1")
        w = np.zeros((n, n))
        for i, j, data in graph.edges(data=True):
            w[i][j] = data.get("weight", 1.0)
        return cls.from_weight_matrix(w)

    @classmethod
    def coerce(cls, topology):
        """A Topology from a Topology (returned as it is) or a networkx graph.

        Parameters
        ----------
        topology : Topology or networkx.DiGraph

        Returns
        -------
        Topology

        Raises
        ------
        TypeError
            `topology` is neither.
        """
        if isinstance(topology, Topology):
            return topology
        if hasattr(topology, "edges") and hasattr(topology, "number_of_nodes"):
            return cls.from_networkx(topology)
        raise TypeError(
            f"expected a weft Topology or a networkx DiGraph, got {type(topology).__name__}")

    # -- editing --
    def add_edge(self, src, dst, weight):
        """Add the edge src -> dst with `weight`, or re-weight it if it exists.

        Parameters
        ----------
        src, dst : int
            Ranks of this topology.
        weight : float
            The weight dst applies to what src sends.
        """
        _c.weft_topology_add_edge(self._ptr, int(src), int(dst), float(weight))

    def set_self_weight(self, rank, weight):
        """Set W[rank][rank], the weight `rank` gives its own value.

        Parameters
        ----------
        rank : int
        weight : float
        """
        _c.weft_topology_set_self_weight(self._ptr, int(rank), float(weight))

    def copy(self):
        """Return an independent copy of this topology.

        Returns
        -------
        Topology
        """
        return Topology(_c.weft_topology_clone(self._ptr))

    # -- queries --
    @property
    def size(self):
        """The number of ranks (nodes) of the topology."""
        return _c.weft_topology_size(self._ptr)

    def number_of_nodes(self):
        """The number of ranks, as networkx spells it (the same as `size`).

        Returns
        -------
        int
        """
        return self.size

    def weight(self, src, dst):
        """The weight of the edge src -> dst.

        0 when there is no such edge; the self weight when src == dst.

        Parameters
        ----------
        src, dst : int

        Returns
        -------
        float
        """
        return _c.weft_topology_weight(self._ptr, int(src), int(dst))

    def in_neighbors(self, rank):
        """The ranks that send to `rank` (self excluded), sorted; also `predecessors`.

        Parameters
        ----------
        rank : int

        Returns
        -------
        list of int
        """
        return _c.weft_topology_in_neighbors(self.size, self._ptr, int(rank))

    def out_neighbors(self, rank):
        """The ranks that `rank` sends to (self excluded), sorted; also `successors`.

        Parameters
        ----------
        rank : int

        Returns
        -------
        list of int
        """
        return _c.weft_topology_out_neighbors(self.size, self._ptr, int(rank))

    # networkx-style spellings used by Bluefog programs.
    predecessors = in_neighbors
    successors = out_neighbors

    def weight_matrix(self):
        """The dense weight matrix W, W[i][j] the weight of the edge i -> j.

        Returns
        -------
        numpy.ndarray
            A size x size float64 array, self weights on the diagonal.
        """
        n = self.size
        return np.array(_c.weft_topology_weight_matrix(n * n, self._ptr)).reshape(n, n)

    def to_networkx(self):
        """Convert to a networkx DiGraph with the edge attribute "weight".

        Returns
        -------
        networkx.DiGraph
            Nodes 0 .. size-1; self loops carry the nonzero self weights.
        """
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
    """Whether x is base^k for some integer k >= 0.

    Parameters
    ----------
    x : int
    base : int
        An integer above 1.

    Returns
    -------
    bool

    Raises
    ------
    ValueError
        `base` is not an integer above 1.

    Examples
    --------
    >>> isPowerOf(8, 2), isPowerOf(6, 2), isPowerOf(1, 3)
    (True, False, True)
    """
    if not isinstance(base, int) or base < 2:
        raise ValueError(f"isPowerOf: base must be an integer above 1, got {base!r}")
    if x <= 0:
        return False
    while x % base == 0:
        x //= base
    return x == 1


def ExponentialTwoGraph(size):
    """Rank i sends to i + 2^k (mod size); equal weights per row, self included.

    Parameters
    ----------
    size : int
        The number of ranks.

    Returns
    -------
    networkx.DiGraph
    """
    return _graph(_c.weft_topology_exponential_two(int(size)))


def ExponentialGraph(size, base=2):
    """Rank i sends to i + base^k (mod size) for every base^k < size; equal weights.

    weft's default topology (base 2).

    Parameters
    ----------
    size : int
        The number of ranks.
    base : int, optional
        The base of the offsets (default 2).

    Returns
    -------
    networkx.DiGraph

    Examples
    --------
    >>> G = ExponentialGraph(8)
    >>> sorted(G.successors(0))               # self loop included
    [0, 1, 2, 4]
    """
    return _graph(_c.weft_topology_exponential(int(size), int(base)))


def SymmetricExponentialGraph(size, base=4):
    """A symmetric exponential graph (Bluefog's): offsets whose ring distance is a power.

    Rank i connects to i + d for every offset d whose distance around the ring,
    min(d, size - d), is a power of base (1 included); equal weights.

    Parameters
    ----------
    size : int
        The number of ranks.
    base : int, optional
        The base of the distances (default 4).

    Returns
    -------
    networkx.DiGraph
    """
    return _graph(_c.weft_topology_symmetric_exponential(int(size), int(base)))


def MeshGrid2DGraph(size, shape=None):
    """A 4-neighbor 2-D grid with Metropolis-Hastings weights.

    Parameters
    ----------
    size : int
        The number of ranks.
    shape : tuple of (int, int), optional
        (rows, cols); None (the default): rows is the largest divisor of size not above
        sqrt(size).

    Returns
    -------
    networkx.DiGraph
    """
    rows, cols = (0, 0) if shape is None else (int(shape[0]), int(shape[1]))
    return _graph(_c.weft_topology_mesh_grid_2d(int(size), rows, cols))


def StarGraph(size, center_rank=0):
    """A star: every rank exchanges with center_rank, in both directions.

    Parameters
    ----------
    size : int
        The number of ranks.
    center_rank : int, optional
        The center (default 0).

    Returns
    -------
    networkx.DiGraph
    """
    return _graph(_c.weft_topology_star(int(size), int(center_rank)))


def RingGraph(size, connect_style=0):
    """A ring over the ranks.

    Parameters
    ----------
    size : int
        The number of ranks.
    connect_style : {0, 1, 2}, optional
        0 (the default): both directions, weights 1/3 each (self included); 1: i -> i-1;
        2: i -> i+1 (1/2 each, self included).

    Returns
    -------
    networkx.DiGraph

    Examples
    --------
    >>> sorted(RingGraph(4).predecessors(0))
    [0, 1, 3]
    """
    return _graph(_c.weft_topology_ring(int(size), int(connect_style)))


def FullyConnectedGraph(size):
    """Every rank connects with every other rank.

    Parameters
    ----------
    size : int
        The number of ranks.

    Returns
    -------
    networkx.DiGraph
    """
    return _graph(_c.weft_topology_fully_connected(int(size)))

# ---- helpers -----------------------------------------------------------------------------


def GetRecvWeights(topo, rank):
    """The weights `rank` receives with: W[rank][rank] and column `rank`.

    Parameters
    ----------
    topo : networkx.DiGraph or Topology
    rank : int

    Returns
    -------
    tuple of (float, dict of {int: float})
        (self_weight, {in_neighbor: weight}).

    Examples
    --------
    >>> GetRecvWeights(RingGraph(4), 0)
    (0.3333333333333333, {1: 0.3333333333333333, 3: 0.3333333333333333})
    """
    t = Topology.coerce(topo)
    return _c.weft_topology_recv_weights(t.size, t._ptr, int(rank))


def GetSendWeights(topo, rank):
    """The weights of `rank`'s outgoing edges: row `rank`.

    Parameters
    ----------
    topo : networkx.DiGraph or Topology
    rank : int

    Returns
    -------
    tuple of (float, dict of {int: float})
        (self_weight, {out_neighbor: weight}).
    """
    t = Topology.coerce(topo)
    return _c.weft_topology_send_weights(t.size, t._ptr, int(rank))


def IsRegularGraph(topo):
    """Whether every rank has the same degree, in-edges plus out-edges.

    A self loop counts twice, as networkx counts it.

    Parameters
    ----------
    topo : networkx.DiGraph or Topology

    Returns
    -------
    bool
    """
    w = Topology.coerce(topo).weight_matrix() != 0
    degrees = w.sum(axis=0) + w.sum(axis=1)
    return bool(np.all(degrees == degrees[0]))


def IsTopologyEquivalent(topo1, topo2):
    """Whether two topologies have the same ranks and the same weight on every edge.

    Self loops included.

    Parameters
    ----------
    topo1, topo2 : networkx.DiGraph, Topology or None

    Returns
    -------
    bool
        False when either is None.
    """
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
    """A dynamic schedule sending to one out-neighbor per step.

    Each step sends to one out-neighbor, in turn clockwise from self_rank, and receives
    from every rank whose step target is self_rank.

    Parameters
    ----------
    topo : networkx.DiGraph or Topology
        The topology whose out-neighbors are taken (copied).
    self_rank : int
        This rank.

    Returns
    -------
    generator of tuple of (list of int, list of int)
        An infinite generator of (send_ranks, recv_ranks).

    Examples
    --------
    >>> schedule = GetDynamicOnePeerSendRecvRanks(ExponentialGraph(8), 0)
    >>> send_ranks, recv_ranks = next(schedule)
    """
    t = Topology.coerce(topo)
    return _steps(_c.weft_schedule_one_peer(t._ptr, int(self_rank)), t.size)


def GetExp2DynamicSendRecvMachineRanks(world_size, local_size, self_rank, local_rank):
    """A machine-level exponential-2 dynamic schedule, yielding machine indices.

    At step k, with M machines and d = 2^(k mod (floor(log2(M - 1)) + 1)), machine m sends
    to (m + d) mod M and receives from (m - d) mod M; one machine yields empty lists.

    Parameters
    ----------
    world_size : int
        The number of ranks.
    local_size : int
        Ranks per machine.
    self_rank : int
        This rank (its machine is self_rank // local_size).
    local_rank : int
        This rank's index within its machine (not used).

    Returns
    -------
    generator of tuple of (list of int, list of int)
        An infinite generator of (send_machines, recv_machines).
    """
    machines = int(world_size) // int(local_size)
    return _steps(_c.weft_schedule_machine_exponential_two(machines,
                                                            int(self_rank) // int(local_size)),
                  max(machines, 1))


def GetInnerOuterRingDynamicSendRecvRanks(world_size, local_size, self_rank):
    """Bluefog's inner-outer ring dynamic schedule, over ranks laid out machine by machine.

    At step k, local rank (k mod local_size) of every machine exchanges with the same
    local rank of the next and previous machines; the machine's other local ranks exchange
    with their next and previous among themselves.

    Parameters
    ----------
    world_size : int
        The number of ranks.
    local_size : int
        Ranks per machine.
    self_rank : int
        This rank.

    Returns
    -------
    generator of tuple of (list of int, list of int)
        An infinite generator of (send_ranks, recv_ranks).
    """
    return _steps(_c.weft_schedule_inner_outer_ring(int(world_size), int(local_size),
                                                    int(self_rank)), int(world_size))


def GetInnerOuterExpo2DynamicSendRecvRanks(world_size, local_size, self_rank):
    """Bluefog's inner-outer exponential-2 dynamic schedule, over ranks laid out by machine.

    At step k, local rank (k mod local_size) of every machine exchanges with the same
    local rank of another machine, at the machine-level exponential-2 distance; the
    machine's other local ranks exchange among themselves at distances 2^j.

    Parameters
    ----------
    world_size : int
        The number of ranks.
    local_size : int
        Ranks per machine.
    self_rank : int
        This rank.

    Returns
    -------
    generator of tuple of (list of int, list of int)
        An infinite generator of (send_ranks, recv_ranks).
    """
    return _steps(_c.weft_schedule_inner_outer_exponential_two(
        int(world_size), int(local_size), int(self_rank)), int(world_size))
