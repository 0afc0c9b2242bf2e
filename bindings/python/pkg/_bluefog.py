"""The functions of weft.torch that follow Bluefog's signatures and return types.

weft's own top-level functions already take Bluefog's names and arguments; the ones here
differ from them where a Bluefog program would notice: init() may be called again and takes
topology_fn, topologies go in and out as networkx DiGraphs (load_topology returns the very
graph set), allreduce's third positional parameter is is_hierarchical_local, timeline
markers return a bool, and the names Bluefog has and weft's core does not (machine
neighbors, neighbor_win_*, the skip-negotiate switch, InferSourceFromDestinationRanks, ...).
The migration table is in bindings/python/README.md.
"""

import contextlib
import sys
import warnings

import numpy as np

import weft as _weft
from . import topology as _topology
from .topology import Topology

__all__ = [
    "init", "shutdown", "size", "local_size", "rank", "local_rank", "machine_size",
    "machine_rank", "is_homogeneous", "load_topology", "set_topology", "load_machine_topology",
    "set_machine_topology", "in_neighbor_ranks", "out_neighbor_ranks",
    "in_neighbor_machine_ranks", "out_neighbor_machine_ranks", "is_topo_weighted",
    "is_machine_topo_weighted", "mpi_threads_supported", "unified_mpi_window_model_supported",
    "nccl_built", "suspend", "resume", "set_skip_negotiate_stage", "get_skip_negotiate_stage",
    "allreduce", "allreduce_", "allreduce_nonblocking", "allreduce_nonblocking_", "broadcast",
    "broadcast_", "broadcast_nonblocking", "broadcast_nonblocking_", "allgather",
    "allgather_nonblocking", "neighbor_allgather", "neighbor_allgather_nonblocking",
    "neighbor_allreduce", "neighbor_allreduce_nonblocking", "hierarchical_neighbor_allreduce",
    "hierarchical_neighbor_allreduce_nonblocking", "pair_gossip", "pair_gossip_nonblocking",
    "poll", "synchronize", "wait", "barrier", "win_create", "win_free", "win_update",
    "win_update_then_collect", "win_put", "win_put_nonblocking", "win_accumulate",
    "win_accumulate_nonblocking", "win_get", "win_get_nonblocking", "neighbor_win_put",
    "neighbor_win_put_nonblocking", "neighbor_win_accumulate",
    "neighbor_win_accumulate_nonblocking", "neighbor_win_get", "neighbor_win_get_nonblocking",
    "win_poll", "win_wait", "win_mutex", "get_win_version", "get_current_created_window_names",
    "win_associated_p", "turn_on_win_ops_with_associated_p",
    "turn_off_win_ops_with_associated_p", "timeline_start_activity", "timeline_end_activity",
    "timeline_context", "InferSourceFromDestinationRanks", "InferDestinationFromSourceRanks",
] + list(_topology.__all__)

# Bluefog's graph helpers, as bluefog.torch re-exports them.
from .topology import *  # noqa: F401,F403,E402

# ---- process model and topology -----------------------------------------------------------

size = _weft.size
local_size = _weft.local_size
rank = _weft.rank
local_rank = _weft.local_rank
machine_size = _weft.machine_size
machine_rank = _weft.machine_rank
is_topo_weighted = _weft.is_topo_weighted
in_neighbor_ranks = _weft.in_neighbor_ranks
out_neighbor_ranks = _weft.out_neighbor_ranks
shutdown = _weft.shutdown

# The graphs last set through this module, returned as they are by load_topology and
# load_machine_topology (Bluefog hands back the very object), as long as weft's topology
# is still the one they describe.
_graphs = {"topology": None, "machine": None, "machine_weighted": False}


def init(topology_fn=None, is_weighted=False):
    """Start weft (the first call only) and set the topology.

    As in Bluefog, a later call is allowed and only sets the topology again. Collective,
    like set_topology. The first call also turns off turn_on_win_ops_with_associated_p
    (Bluefog's windows leave p alone until it is turned on).

    Parameters
    ----------
    topology_fn : callable, optional
        topology_fn(size()) returns the topology, a networkx DiGraph; None (the default):
        the exponential graph.
    is_weighted : bool, optional
        As for set_topology (default False).

    Raises
    ------
    WeftError
        weft cannot start: weft.init's errors.
    TypeError
        The topology is not a DiGraph (or Topology) of size() nodes.

    Examples
    --------
    >>> import weft.torch as bf
    >>> bf.init(lambda n: bf.RingGraph(n))
    >>> bf.load_topology()
    <networkx.classes.digraph.DiGraph object at 0x...>
    """
    if not _weft.is_initialized():
        _weft.init()
        # Bluefog's windows leave p alone until turn_on_win_ops_with_associated_p().
        _weft.turn_off_win_ops_with_associated_p()
    topology = topology_fn(size()) if topology_fn is not None else ExponentialGraph(size())  # noqa: F405
    set_topology(topology, is_weighted)


def _as_graph(topology, function, expected, unit):
    if isinstance(topology, Topology):
        graph = topology.to_networkx()
    elif hasattr(topology, "edges") and hasattr(topology, "number_of_nodes"):
        graph = topology
    else:
        raise TypeError(f"{function}: expected a networkx DiGraph (or a weft Topology), got "
                        f"{type(topology).__name__}")
    if graph.number_of_nodes() != expected:
        raise TypeError(f"{function}: the topology has {graph.number_of_nodes()} nodes but "
                        f"there are {expected} {unit}")
    return graph


def set_topology(topology=None, is_weighted=False):
    """Set the virtual topology from a networkx DiGraph. Collective.

    Returns True, also without changing anything when the graph, weights included, is the
    one in force; False (with a RuntimeWarning saying why) when the ranks refuse it, or
    before init(), as in Bluefog.

    Parameters
    ----------
    topology : networkx.DiGraph or weft.Topology, optional
        A graph over the ranks; None (the default): the exponential graph.
    is_weighted : bool, optional
        Whether ops without weights use the graph's receive weights (default False).

    Returns
    -------
    bool

    Raises
    ------
    TypeError
        The graph is not a DiGraph (or Topology) or does not have size() nodes.

    Examples
    --------
    >>> bf.set_topology(bf.RingGraph(bf.size()))
    True
    """
    if not _weft.is_initialized():
        warnings.warn("set_topology: weft is not initialized; call init() first",
                      RuntimeWarning, stacklevel=2)
        return False
    if topology is None:
        topology = ExponentialGraph(size())  # noqa: F405
    graph = _as_graph(topology, "set_topology", size(), "ranks")
    if IsTopologyEquivalent(graph, _weft.load_topology()):  # noqa: F405
        _graphs["topology"] = graph
        return True
    if not _weft.set_topology(graph, is_weighted):
        return False
    _graphs["topology"] = graph
    return True


def _graph_in_force(key, current):
    # The graph set through this module while weft still uses it; else weft's, converted.
    graph = _graphs[key]
    if graph is None or not IsTopologyEquivalent(graph, current):  # noqa: F405
        graph = current.to_networkx()
        _graphs[key] = graph
    return graph


def load_topology():
    """The topology in force, as the networkx DiGraph that set it.

    Returns
    -------
    networkx.DiGraph
        The very graph passed to set_topology while it is still in force; otherwise weft's
        topology, converted.
    """
    return _graph_in_force("topology", _weft.load_topology())


def set_machine_topology(topology, is_weighted=False):
    """Set the graph between machines for hierarchical_neighbor_allreduce.

    Parameters
    ----------
    topology : networkx.DiGraph or weft.Topology
        A graph over the machine_size() machines.
    is_weighted : bool, optional
        Whether the hierarchical op without weights uses its weights (default False).

    Returns
    -------
    bool
        True, or False with a RuntimeWarning, as set_topology.

    Raises
    ------
    ValueError
        `topology` is None.
    TypeError
        The graph is not a DiGraph (or Topology) or does not have machine_size() nodes.
    """
    if topology is None:
        raise ValueError("set_machine_topology: the topology must not be None")
    graph = _as_graph(topology, "set_machine_topology", machine_size(), "machines")
    if not _weft.set_machine_topology(graph, is_weighted):
        return False
    _graphs["machine"] = graph
    _graphs["machine_weighted"] = bool(is_weighted)
    return True


def load_machine_topology():
    """The machine topology in force, as the networkx DiGraph that set it.

    Returns
    -------
    networkx.DiGraph
        A graph over the machines; the exponential graph until set_machine_topology.
    """
    return _graph_in_force("machine", _weft.load_machine_topology())


def is_machine_topo_weighted():
    """Whether the machine topology was set with is_weighted=True through this module.

    Returns
    -------
    bool
    """
    return bool(_graphs["machine_weighted"])


def in_neighbor_machine_ranks():
    """The machines this rank's machine receives from in the machine topology.

    Returns
    -------
    list of int
        Machine indices, sorted, this machine excluded.
    """
    return Topology.coerce(load_machine_topology()).in_neighbors(machine_rank())


def out_neighbor_machine_ranks():
    """The machines this rank's machine sends to in the machine topology.

    Returns
    -------
    list of int
        Machine indices, sorted, this machine excluded.
    """
    return Topology.coerce(load_machine_topology()).out_neighbors(machine_rank())


is_homogeneous = _weft.is_homogeneous
nccl_built = _weft.nccl_built


def mpi_threads_supported():
    """Return True: weft needs MPI_THREAD_MULTIPLE, and init fails without it.

    Returns
    -------
    bool
    """
    return True


def unified_mpi_window_model_supported():
    """Whether MPI windows use MPI's unified memory model (not collective in weft).

    Returns
    -------
    bool
    """
    return _weft.unified_mpi_window_model()


def _in_ipython():
    return "IPython" in sys.modules and getattr(sys.modules["IPython"], "get_ipython",
                                                 lambda: None)() is not None


def suspend():
    """Bluefog's pause of the background thread; here only a check for IPython.

    Bluefog pauses its background thread for interactive sessions. weft's engine sleeps
    by itself when idle, so this only checks, as Bluefog does, that it runs under IPython.

    Raises
    ------
    EnvironmentError
        Not running under IPython.
    """
    if not _in_ipython():
        raise EnvironmentError("suspend() is only for interactive (IPython) sessions")


def resume():
    """The counterpart of suspend(): only checks, as Bluefog does, that it runs under IPython.

    Raises
    ------
    EnvironmentError
        Not running under IPython.
    """
    if not _in_ipython():
        raise EnvironmentError("resume() is only for interactive (IPython) sessions")


_skip_negotiate = [False]


def set_skip_negotiate_stage(value):
    """Record Bluefog's skip-negotiate switch; weft's behaviour does not change.

    weft always negotiates each op with rank 0, which is how it checks shapes, dtypes and
    names across ranks; pair_gossip needs no switch.

    Parameters
    ----------
    value : bool
        What get_skip_negotiate_stage() reports from now on.
    """
    _skip_negotiate[0] = bool(value)


def get_skip_negotiate_stage():
    """The value last given to set_skip_negotiate_stage (False at first).

    Returns
    -------
    bool
    """
    return _skip_negotiate[0]

# ---- collectives ----------------------------------------------------------------------------


_machine_ranks = {}  # this machine's ranks, gathered once per weft session


def _local_ranks():
    # Keyed by the session (init() is collective, so every rank counts the same), so that a
    # shutdown() and init() with other machines (say a new BLUEFOG_NODES_PER_MACHINE)
    # gathers again on every rank alike.
    layout = _weft._session[0]
    if layout not in _machine_ranks:
        mine = np.array([machine_rank()], dtype=np.int64)
        machines = _weft.allgather(mine, name="weft.torch.machine_ranks")
        _machine_ranks[layout] = [r for r in range(size()) if machines[r] == machine_rank()]
    return _machine_ranks[layout]


def _allreduce_args(is_hierarchical_local):
    # is_hierarchical_local: the op runs among this machine's ranks only.
    return _local_ranks() if is_hierarchical_local else None


def allreduce(tensor, average=True, is_hierarchical_local=False, name=None):
    """The mean (or sum) of `tensor` over all ranks, or over this machine's ranks.

    Bluefog's signature: the third positional parameter is is_hierarchical_local.
    Collective: every rank calls it.

    Parameters
    ----------
    tensor : torch.Tensor or numpy.ndarray
        This rank's values (not changed).
    average : bool, optional
        True (the default): the mean; False: the sum.
    is_hierarchical_local : bool, optional
        Reduce over this machine's ranks only (default False).
    name : str, optional
        The op's name, as for weft.allreduce.

    Returns
    -------
    torch.Tensor or numpy.ndarray
        A new tensor.

    Raises
    ------
    InvalidArgumentError
        As weft.allreduce.

    Examples
    --------
    >>> bf.allreduce(torch.ones(2) * bf.rank(), name="x")   # 4 ranks
    tensor([1.5000, 1.5000])
    """
    return _weft.allreduce(tensor, average, name, _allreduce_args(is_hierarchical_local))


def allreduce_(tensor, average=True, is_hierarchical_local=False, name=None):
    """In-place allreduce, with allreduce's parameters; returns `tensor`.

    Returns
    -------
    torch.Tensor or numpy.ndarray
        `tensor` itself, now holding the mean or sum.
    """
    return _weft.allreduce_(tensor, average, name, _allreduce_args(is_hierarchical_local))


def allreduce_nonblocking(tensor, average=True, is_hierarchical_local=False, name=None):
    """Start an allreduce (allreduce's parameters) and return at once.

    Returns
    -------
    weft.Handle
        synchronize(handle) returns what allreduce would.
    """
    return _weft.allreduce_nonblocking(tensor, average, name,
                                       _allreduce_args(is_hierarchical_local))


def allreduce_nonblocking_(tensor, average=True, is_hierarchical_local=False, name=None):
    """Start an in-place allreduce of `tensor` (allreduce's parameters) and return at once.

    Returns
    -------
    weft.Handle
        synchronize(handle) returns `tensor`, holding the mean or sum.
    """
    return _weft.allreduce_nonblocking_(tensor, average, name,
                                        _allreduce_args(is_hierarchical_local))


broadcast = _weft.broadcast
broadcast_ = _weft.broadcast_
broadcast_nonblocking = _weft.broadcast_nonblocking
broadcast_nonblocking_ = _weft.broadcast_nonblocking_
allgather = _weft.allgather
allgather_nonblocking = _weft.allgather_nonblocking
neighbor_allgather = _weft.neighbor_allgather
neighbor_allgather_nonblocking = _weft.neighbor_allgather_nonblocking
neighbor_allreduce = _weft.neighbor_allreduce
neighbor_allreduce_nonblocking = _weft.neighbor_allreduce_nonblocking
hierarchical_neighbor_allreduce = _weft.hierarchical_neighbor_allreduce
hierarchical_neighbor_allreduce_nonblocking = _weft.hierarchical_neighbor_allreduce_nonblocking
pair_gossip = _weft.pair_gossip
pair_gossip_nonblocking = _weft.pair_gossip_nonblocking
poll = _weft.poll
synchronize = _weft.synchronize
wait = _weft.synchronize
barrier = _weft.barrier

# ---- windows ----------------------------------------------------------------------------------

win_create = _weft.win_create


def win_free(name=None):
    """Free one window, or every window. Collective.

    Parameters
    ----------
    name : str, optional
        The window; None (the default): every window.

    Returns
    -------
    bool
        True.

    Raises
    ------
    KeyError
        There is no window named `name` (as in Bluefog).
    """
    try:
        return _weft.win_free(name)
    except _weft.NotFoundError:  # every rank is told; this one raises Bluefog's error
        raise KeyError(name) from None
win_update = _weft.win_update
win_put = neighbor_win_put = _weft.win_put
win_put_nonblocking = neighbor_win_put_nonblocking = _weft.win_put_nonblocking
win_accumulate = neighbor_win_accumulate = _weft.win_accumulate
win_accumulate_nonblocking = neighbor_win_accumulate_nonblocking = (
    _weft.win_accumulate_nonblocking)
win_get = neighbor_win_get = _weft.win_get
win_get_nonblocking = neighbor_win_get_nonblocking = _weft.win_get_nonblocking
win_poll = _weft.win_poll
win_mutex = _weft.win_mutex
get_win_version = _weft.get_win_version
win_associated_p = _weft.win_associated_p
turn_on_win_ops_with_associated_p = _weft.turn_on_win_ops_with_associated_p
turn_off_win_ops_with_associated_p = _weft.turn_off_win_ops_with_associated_p


def win_wait(handle):
    """Wait for a nonblocking window op; True once it completed.

    Parameters
    ----------
    handle : weft.Handle
        What a win_*_nonblocking call returned.

    Returns
    -------
    bool
        True.

    Raises
    ------
    WeftError
        The op failed.
    """
    _weft.synchronize(handle)
    return True


def win_update_then_collect(name, require_mutex=True):
    """x <- x + the sum of every buffer, then zero the buffers.

    Holds this rank's own mutex by default, as Bluefog does.

    Parameters
    ----------
    name : str
        The window.
    require_mutex : bool, optional
        Hold this rank's own window mutex (default True).

    Returns
    -------
    torch.Tensor or numpy.ndarray
        The window's tensor.
    """
    return _weft.win_update_then_collect(name, require_mutex)


def get_current_created_window_names():
    """The names of the windows created and not yet freed.

    Returns
    -------
    list of str
        Sorted.
    """
    return _weft.win_names()

# ---- timeline ---------------------------------------------------------------------------------


def timeline_start_activity(tensor_name, activity_name):
    """Mark the start of an activity on tensor_name's row.

    Parameters
    ----------
    tensor_name : str
        The timeline row.
    activity_name : str
        The activity shown on the row.

    Returns
    -------
    bool
        True, or False (doing nothing) when no timeline is being written.
    """
    if not _weft.timeline_active():
        return False
    _weft.timeline_start_activity(tensor_name, activity_name)
    return True


def timeline_end_activity(tensor_name):
    """Mark the end of the activity on tensor_name's row.

    Parameters
    ----------
    tensor_name : str
        The timeline row.

    Returns
    -------
    bool
        True, or False (doing nothing) when no timeline is being written.
    """
    if not _weft.timeline_active():
        return False
    _weft.timeline_end_activity(tensor_name)
    return True


def timeline_context(tensor_name, activity_name):
    """A context manager marking its body as an activity (nothing without a timeline).

    Parameters
    ----------
    tensor_name : str
        The timeline row.
    activity_name : str
        The activity shown on the row.

    Examples
    --------
    >>> with bf.timeline_context("layer1", "forward"):
    ...     y = layer1(x)
    """
    if not _weft.timeline_active():
        return contextlib.nullcontext()
    return _weft.timeline_context(tensor_name, activity_name)

# ---- inferring the other side of a dynamic exchange -------------------------------------------


def _infer(ranks, function, transpose, construct_adjacency_matrix):
    n, me = size(), rank()
    ranks = list(ranks)
    for r in ranks:
        if not isinstance(r, (int, np.integer)) or not 0 <= r < n or r == me:
            raise ValueError(f"{function}: ranks must be other ranks in [0, {n}), got {ranks}")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"{function}: ranks must be unique, got {ranks}")
    row = np.zeros((1, n), dtype=np.float64)
    row[0, ranks] = 1.0
    matrix = _weft.allgather(row, name=f"weft.torch.{function}")  # row i: rank i's list
    other = sorted(int(i) for i in np.nonzero(matrix[:, me])[0])
    if not construct_adjacency_matrix:
        return other
    w = matrix + np.eye(n)
    if transpose:
        w = w.T
    return other, w / w.sum(axis=0, keepdims=True)  # each receiver's weights sum to 1


def InferSourceFromDestinationRanks(dst_ranks, construct_adjacency_matrix=False):
    """The ranks that send to this one, given every rank's destinations. Collective.

    Parameters
    ----------
    dst_ranks : sequence of int
        This rank's destinations: distinct other ranks.
    construct_adjacency_matrix : bool, optional
        Also return W (default False).

    Returns
    -------
    list of int or tuple of (list of int, numpy.ndarray)
        The sources (sorted); with construct_adjacency_matrix also W (size x size):
        W[i][j] = 1 for i = j and for each edge i -> j, each column divided by its sum (a
        receiver's weights sum to 1, as in Bluefog).

    Raises
    ------
    ValueError
        A rank is out of range, this rank, or listed twice.

    Examples
    --------
    >>> send, _ = next(schedule)
    >>> recv = bf.InferSourceFromDestinationRanks(send)
    """
    return _infer(dst_ranks, "InferSourceFromDestinationRanks", False,
                  construct_adjacency_matrix)


def InferDestinationFromSourceRanks(src_ranks, construct_adjacency_matrix=False):
    """The ranks this one sends to, given every rank's sources. Collective.

    Parameters
    ----------
    src_ranks : sequence of int
        This rank's sources: distinct other ranks.
    construct_adjacency_matrix : bool, optional
        Also return W, as for InferSourceFromDestinationRanks (default False).

    Returns
    -------
    list of int or tuple of (list of int, numpy.ndarray)
        The destinations (sorted), and W with construct_adjacency_matrix.

    Raises
    ------
    ValueError
        A rank is out of range, this rank, or listed twice.
    """
    return _infer(src_ranks, "InferDestinationFromSourceRanks", True,
                  construct_adjacency_matrix)

