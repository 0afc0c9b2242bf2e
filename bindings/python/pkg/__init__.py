"""weft for Python: decentralized and collective communication for distributed training.

The function names are Bluefog's:

    import weft as bf
    bf.init()
    x = np.full(4, bf.rank(), dtype=np.float32)
    y = bf.neighbor_allreduce(x)

A bluefog.torch program moves by changing its import to `import weft.torch as bf`, which
also follows Bluefog's signatures where weft's core differs (networkx topologies, init()
called again, is_hierarchical_local, ...).

Inputs are NumPy arrays, CPU torch.Tensors or anything that speaks DLPack; results have the
input's type, dtype and shape. Ranks are matched by op name (or call order when unnamed), so
every rank must make the same calls. Blocking calls release the GIL. Errors raise
weft.WeftError subclasses carrying the status code and weft's message.
"""

import contextlib as _contextlib
import functools as _functools
import operator as _operator
import sys as _sys
import warnings as _warnings
from _thread import allocate_lock as _allocate_lock

from . import _errors
from . import _tensors
from . import lowlevel as _c
from ._errors import *  # noqa: F401,F403  (the exception classes)
from . import topology  # noqa: F401
from .topology import Topology
from ._step_counter import StepCounter  # noqa: F401

_c.weft_py_set_error_factory(_errors.make_error)

__version__ = _c.weft_version()

_prepare = _tensors.prepare
_empty_like = _tensors.empty_like
_output = _tensors.output
_result = _tensors.result
_NUMPY, _TORCH = _tensors.NUMPY, _tensors.TORCH

# ---- process model -------------------------------------------------------------------------


_session = [0]  # how many times init() succeeded in this process: the same on every rank


def init():
    """Start MPI (unless the program did) and weft's engine.

    Collective: every rank calls it, before any op. The topology in force is then the
    exponential graph over all ranks (see set_topology). init() works again after
    shutdown(), but not after finalize().

    Raises
    ------
    FailedPreconditionError
        weft is already initialized (call shutdown() first), MPI was already finalized in
        this process, or MPI does not provide MPI_THREAD_MULTIPLE.
    InvalidArgumentError
        A WEFT_* setting is invalid, e.g. WEFT_RANKS_PER_MACHINE does not divide the ranks.

    See Also
    --------
    shutdown, finalize, weft.torch.init

    Examples
    --------
    >>> import weft
    >>> weft.init()
    >>> weft.rank(), weft.size()
    (0, 4)
    """
    _c.weft_init()
    _session[0] += 1


def _end_job_on_uncaught_exception(kind, value, traceback, _previous=_sys.excepthook):
    # A rank that dies of an exception would otherwise run weft's shutdown at exit, which
    # waits for every rank, while the others wait in their next op for this one: the job
    # would hang forever. Print the error, then end the job with weft_abort (MPI_Abort):
    # Open MPI's launcher stops every rank.
    _previous(kind, value, traceback)
    interactive = hasattr(_sys, "ps1") or _sys.flags.interactive
    if interactive or not is_initialized() or size() < 2:
        return
    try:
        _sys.stderr.write(f"weft: rank {rank()} ends the job: an uncaught {kind.__name__} "
                          f"(the other ranks would wait for this one forever)\n")
        _sys.stdout.flush()
        _sys.stderr.flush()
    finally:
        _c.weft_abort(1)


_sys.excepthook = _end_job_on_uncaught_exception


def shutdown():
    """Wait for every rank, then stop weft's engine, freeing every window.

    Collective: every rank calls it. Ops that cannot complete then fail. The tensors of the
    windows it frees are the program's again. init() may be called again afterwards.

    Raises
    ------
    FailedPreconditionError
        weft is not initialized.
    DeadlineExceededError
        A rank never reached shutdown() (it died, or stalls).

    Examples
    --------
    >>> weft.init()
    >>> ...                                   # ops
    >>> weft.shutdown()
    """
    _c.weft_shutdown()
    _windows.clear()  # weft freed them: their arrays are the program's again


def finalize():
    """Finalize MPI if weft started it; init() fails afterwards.

    If weft is still initialized, it runs shutdown() first (collective then). MPI that the
    program started is left alone. Python runs it at exit by itself, so programs seldom
    call it.

    Raises
    ------
    DeadlineExceededError
        The shutdown() it ran found a rank that never shut down; MPI is then not finalized,
        so that the process can exit.
    """
    _c.weft_finalize()
    _windows.clear()


def is_initialized():
    """Whether weft is initialized: init() succeeded and shutdown() has not run since.

    Returns
    -------
    bool
    """
    return bool(_c.weft_is_initialized())


rank = _c.weft_rank
size = _c.weft_size
local_rank = _c.weft_local_rank
local_size = _c.weft_local_size
machine_rank = _c.weft_machine_rank
machine_size = _c.weft_machine_size


def is_homogeneous():
    """Whether every machine runs the same number of ranks, each machine's consecutive.

    Machine m then holds ranks m * local_size() to (m + 1) * local_size() - 1.

    Returns
    -------
    bool

    Raises
    ------
    FailedPreconditionError
        weft is not initialized; call init() first.
    """
    value = _c.weft_is_homogeneous()
    if value < 0:
        raise FailedPreconditionError(  # noqa: F405
            2, "is_homogeneous: weft is not initialized; call init() first")
    return bool(value)


def unified_mpi_window_model():
    """Whether MPI windows here use MPI's unified memory model.

    Not collective: it asks a window on MPI_COMM_SELF.

    Returns
    -------
    bool

    Raises
    ------
    FailedPreconditionError
        weft is not initialized; call init() first.
    """
    return bool(_c.weft_unified_mpi_window_model())


def nccl_built():
    """Whether this build runs CUDA tensors on NCCL.

    Returns
    -------
    bool
        False for a build without NCCL, where a CUDA tensor raises UnimplementedError.
    """
    return bool(_c.weft_nccl_built())

# ---- topology ------------------------------------------------------------------------------


def set_topology(topology=None, is_weighted=False):
    """Set the virtual topology that the neighbor ops and new windows use.

    Collective: every rank passes an equivalent graph (the same edges). As in Bluefog, the
    ranks may refuse it, changing nothing: it then returns False with a RuntimeWarning
    giving the reason (ops in flight on some rank, windows that exist, or graphs that
    differ across ranks).

    Parameters
    ----------
    topology : Topology or networkx.DiGraph, optional
        A graph over the ranks 0 .. size() - 1: W[i][j] is the weight of the edge i -> j,
        applied by the receiver j, and W[i][i] rank i's self weight. None (the default):
        the exponential graph, Topology.exponential(size()).
    is_weighted : bool, optional
        Whether ops called without weights use the graph's receive weights (True) or the
        uniform average over self and in-neighbors (False, the default).

    Returns
    -------
    bool
        True once the topology is in force; False when the ranks refused it.

    Raises
    ------
    InvalidArgumentError
        The graph does not have size() nodes (raised at once, on this rank).
    FailedPreconditionError
        weft is not initialized.
    TypeError
        `topology` is neither a Topology nor a networkx graph.

    Examples
    --------
    >>> from weft import topology
    >>> weft.set_topology(topology.RingGraph(weft.size()))
    True
    >>> weft.in_neighbor_ranks()              # rank 0 of 4
    [1, 3]
    """
    _require_init("set_topology")
    if topology is None:
        topology = Topology.exponential(size())
    topo = Topology.coerce(topology)
    _check_topology_size(topo, size(), "set_topology", "ranks")
    return _refusable(_c.weft_comm_set_topology, topo, is_weighted, "set_topology")


def _check_topology_size(topo, expected, function, unit):
    if expected >= 0 and topo.size != expected:
        raise InvalidArgumentError(  # noqa: F405
            1, f"{function}: the topology has {topo.size} {unit} but weft runs {expected}")


def _require_init(function):
    if not is_initialized():
        raise FailedPreconditionError(  # noqa: F405
            2, f"{function}: weft is not initialized; call init() first")


def _refusable(call, topo, is_weighted, function):
    try:
        call(topo._ptr, bool(is_weighted))
    except WeftError as e:  # noqa: F405
        _warnings.warn(f"{function} did not change the topology: {e}", RuntimeWarning,
                       stacklevel=3)
        return False
    return True


def load_topology():
    """Return a copy of the topology in force.

    Returns
    -------
    Topology
        weft's own graph; .to_networkx() converts it to a networkx DiGraph.

    Examples
    --------
    >>> weft.load_topology()
    <weft.Topology: 4 ranks, 8 edges>
    """
    return Topology(_c.weft_comm_load_topology())


def is_topo_weighted():
    """Whether the topology in force was set with is_weighted=True.

    Returns
    -------
    bool
        False before init().
    """
    return bool(_c.weft_comm_is_topo_weighted())


def in_neighbor_ranks():
    """The ranks this rank receives from in the topology in force, self excluded.

    Returns
    -------
    list of int
        Sorted by rank.

    Raises
    ------
    FailedPreconditionError
        weft is not initialized.
    """
    return _c.weft_comm_in_neighbor_ranks(max(size(), 0))


def out_neighbor_ranks():
    """The ranks this rank sends to in the topology in force, self excluded.

    Returns
    -------
    list of int
        Sorted by rank.

    Raises
    ------
    FailedPreconditionError
        weft is not initialized.
    """
    return _c.weft_comm_out_neighbor_ranks(max(size(), 0))


def set_machine_topology(topology, is_weighted=False):
    """Set the graph between machines that hierarchical_neighbor_allreduce uses.

    Until it is set, the machine topology is the exponential graph over machine_size()
    machines.

    Parameters
    ----------
    topology : Topology or networkx.DiGraph
        A graph over the machines 0 .. machine_size() - 1.
    is_weighted : bool, optional
        Whether hierarchical_neighbor_allreduce without weights uses the graph's receive
        weights (True) or the uniform average (False, the default).

    Returns
    -------
    bool
        True, or False with a RuntimeWarning, as set_topology.

    Raises
    ------
    InvalidArgumentError
        The graph does not have machine_size() nodes.
    FailedPreconditionError
        weft is not initialized.
    TypeError
        `topology` is neither a Topology nor a networkx graph.
    """
    _require_init("set_machine_topology")
    topo = Topology.coerce(topology)
    _check_topology_size(topo, machine_size(), "set_machine_topology", "machines")
    return _refusable(_c.weft_comm_set_machine_topology, topo, is_weighted,
                      "set_machine_topology")


def load_machine_topology():
    """Return a copy of the machine topology in force (see set_machine_topology).

    Returns
    -------
    Topology
        A graph over the machines 0 .. machine_size() - 1.
    """
    return Topology(_c.weft_comm_load_machine_topology())

# ---- handles -----------------------------------------------------------------------------


class Handle:
    """A nonblocking op in flight: poll() it, then synchronize() (or wait()) for its result.

    The *_nonblocking functions return one; it is not built directly. Dropping a handle
    early is safe: the op completes in the background and keeps its arrays alive until
    then.

    Examples
    --------
    >>> h = weft.allreduce_nonblocking(x, name="grad")
    >>> ...                                   # overlap other work
    >>> weft.poll(h)
    True
    >>> y = weft.synchronize(h)
    """

    __slots__ = ("_request", "_result", "_kind", "_gather", "_target", "_done", "_lock")

    def __init__(self, request, result, kind, gather=False, target=None):
        self._request = request
        # Held while a thread finishes the op (waits, takes the output, frees the request):
        # another thread waiting for the same handle meanwhile must not use the request
        # the first one frees.
        self._lock = _allocate_lock()
        self._result = result  # the output array (not for allgather ops)
        self._kind = kind
        self._gather = gather
        self._target = target  # in-place on a non-contiguous input: copy back here
        self._done = False

    def __del__(self):
        request = getattr(self, "_request", None)
        if request is not None:
            self._request = None
            _c.weft_request_free(request)

    def _finish(self):
        if self._done:
            return self._result
        with self._lock:
            if not self._done:
                self._finish_locked()
        return self._result

    def _finish_locked(self):
        _c.weft_request_wait(self._request)
        if self._gather:
            self._result = _tensors.from_capsule(
                _c.weft_request_take_output(self._request), self._kind)
        elif self._target is not None:
            self._result = _tensors.copy_back(self._target, self._result)
        request, self._request = self._request, None
        _c.weft_request_free(request)
        self._done = True


def _handle(handle, function):
    if not isinstance(handle, Handle):
        raise TypeError(f"{function}: expected a weft.Handle (what a *_nonblocking call "
                        f"returns), got {type(handle).__name__}")
    return handle


def poll(handle):
    """Whether the op of `handle` has completed, successfully or not.

    Once it has, synchronize() returns (or raises) at once.

    Parameters
    ----------
    handle : Handle
        What a *_nonblocking call returned.

    Returns
    -------
    bool

    Raises
    ------
    TypeError
        `handle` is not a Handle.
    """
    if _handle(handle, "poll")._done:
        return True
    if not handle._lock.acquire(False):
        return False  # another thread is finishing it (synchronize)
    try:
        return handle._done or _c.weft_request_poll(handle._request)
    finally:
        handle._lock.release()


def synchronize(handle):
    """Wait for the op of `handle` and return its output; raise its error if it failed.

    Waiting again returns the same output. wait() is the same function.

    Parameters
    ----------
    handle : Handle
        What a *_nonblocking call returned.

    Returns
    -------
    object
        What the blocking form of the op returns: the result array (the input itself for
        the in-place forms), True for window puts and gets, None for send and barrier.

    Raises
    ------
    TypeError
        `handle` is not a Handle.
    WeftError
        The op failed: the subclass and message of its error, as the blocking form raises.

    Examples
    --------
    >>> h = weft.neighbor_allreduce_nonblocking(x, name="x")
    >>> y = weft.synchronize(h)
    """
    return _handle(handle, "synchronize")._finish()


wait = synchronize


def _arm(keep):
    """Hands `keep` (an op's inputs, outputs and their capsules) to the next request this
    thread starts: the C call that starts it ties them to the request before it returns, so
    that they live until the op is done, whatever happens to the Python handle, even an
    exception (a KeyboardInterrupt) arriving as the call returns."""
    _c.weft_py_arm(keep)
    return keep


def _start_into(request, keep, y, cy, kind):
    """The Handle of an op into an output from _empty_like, which may still be a bare
    capsule (y None): it is wrapped only now that the request holds the capsule (`keep`,
    armed), so that nothing can free the memory the op writes in between."""
    if y is None:
        y = _result(None, cy, kind)
        keep.append(y)
    return Handle(request, y, kind)

# ---- ops ---------------------------------------------------------------------------------

# The weft_status a Python exception stands for when an op is refused before weft sees it
# (anything else: WEFT_ERR_UNKNOWN).
_REFUSAL_CODES = ((TypeError, 1), (ValueError, 1), (NotImplementedError, 5), (MemoryError, 9))


def _refused_in_place(op, peer=None):
    """Decorates an op function whose Python-side argument handling (a tensor, weights or
    a process set it cannot convert) can fail before weft's C ABI sees the call. Such a
    failure still takes the op's place, as a refusal inside weft does: the op's other ranks
    fail with this rank's reason instead of waiting for it, and later unnamed ops stay
    paired with the right ones. `peer` names the argument holding a send's or recv's
    peer."""
    def decorate(function):
        @_functools.wraps(function)
        def call(*args, **kwargs):
            calls = _c.weft_py_calls()
            try:
                return function(*args, **kwargs)
            except Exception as error:
                if _c.weft_py_calls() == calls:  # weft never saw the call
                    _refuse(op, function, peer, args, kwargs, error)
                raise
        return call
    return decorate


def _refuse(op, function, peer, args, kwargs, error):
    import inspect  # only here: `import weft` stays quick
    try:
        arguments = inspect.signature(function).bind(*args, **kwargs)
        arguments.apply_defaults()
        given = arguments.arguments
        name = given.get("name")
        name = None if name is None else _name(name)
        ranks = given.get("ranks")
        ranks = [] if ranks is None else _ranks(ranks)
        peer_rank = -1 if peer is None else _operator.index(given[peer])
    except Exception:
        return  # which op was meant cannot be told: every rank running this code fails alike
    if isinstance(error, WeftError):  # noqa: F405
        code, message = error.status, error.message
    else:
        code = next((c for kind, c in _REFUSAL_CODES if isinstance(error, kind)), 11)
        message = f"{type(error).__name__}: {error}"
    try:
        _c.weft_comm_refuse(op, name, ranks, peer_rank, code, message)
    except WeftError:  # noqa: F405  (it always reports the refusal it made)
        pass


def _name(name):
    if name is None:
        return None
    name = str(name)
    if "\0" in name:
        # C strings end at the first NUL: two names differing after it would be one op.
        raise InvalidArgumentError(  # noqa: F405
            1, f"op names cannot contain a NUL character, got {name!r}")
    return name


def _ranks(ranks):
    # A process set as the C ABI takes it; [] (every rank) is never built from None, so
    # that calls without a set stay on the plain entry points.
    try:
        return [int(r) for r in ranks]
    except TypeError:
        raise TypeError(f"ranks: expected a sequence of ranks, got {type(ranks).__name__}") \
            from None


@_refused_in_place(_c.WEFT_OP_ALLREDUCE)
def allreduce(tensor, average=True, name=None, ranks=None):
    """Reduce `tensor` over all ranks, or over a process set: the mean or the sum.

    Collective: every rank calls it, matched by `name` (or by call order when unnamed).
    With `ranks`, a process set: only those ranks call, all with the same set, the caller
    among them; disjoint sets run independently.

    Parameters
    ----------
    tensor : numpy.ndarray, torch.Tensor or DLPack array
        This rank's values (not changed); the same dtype and shape on every rank.
    average : bool, optional
        True (the default): the mean over the ranks; False: the sum.
    name : str, optional
        The op's name, which matches it across ranks (names starting with "#" are
        reserved). None: matched by call order, and then only from the thread that called
        init().
    ranks : sequence of int, optional
        A process set; None (the default): every rank.

    Returns
    -------
    numpy.ndarray or torch.Tensor
        A new array with the input's type, dtype and shape.

    Raises
    ------
    InvalidArgumentError
        The shape or dtype differs across ranks, `ranks` lists a rank twice, out of range
        or without the caller, or `name` is reserved or contains a NUL character.
    UnimplementedError
        weft does not exchange this dtype (complex, bool, ...) or device.
    TypeError
        `tensor` is not an array, or `ranks` is not a sequence of ranks.
    DeadlineExceededError
        Another rank did not make the matching call in time (WEFT_STALL_TIMEOUT_SECONDS).

    See Also
    --------
    allreduce_ : in place.
    allreduce_nonblocking : returns a Handle.

    Examples
    --------
    >>> x = np.full(3, weft.rank(), dtype=np.float32)
    >>> weft.allreduce(x)                     # 4 ranks: (0 + 1 + 2 + 3) / 4
    array([1.5, 1.5, 1.5], dtype=float32)
    >>> weft.allreduce(x, average=False, name="sum")
    array([6., 6., 6.], dtype=float32)
    >>> weft.allreduce(x, ranks=[0, 2] if weft.rank() % 2 == 0 else [1, 3])  # rank 0
    array([1., 1., 1.], dtype=float32)
    """
    x, cx, kind = _prepare(tensor)
    y, cy = _output(x, kind)
    return _result(y, _allreduce(cx, cy, average, name, ranks), kind)


def _allreduce(cx, cy, average, name, ranks):
    """The C call; cy None: it allocates the output and returns its capsule (output())."""
    if ranks is None:
        return _c.weft_comm_allreduce(cx, cy, bool(average), _name(name))
    return _c.weft_comm_allreduce_ranks(cx, cy, bool(average), _ranks(ranks), _name(name))


def _allreduce_nonblocking(cx, cy, average, name, ranks):
    if ranks is None:
        return _c.weft_comm_allreduce_nonblocking(cx, cy, bool(average), _name(name))
    return _c.weft_comm_allreduce_ranks_nonblocking(cx, cy, bool(average), _ranks(ranks),
                                                    _name(name))


@_refused_in_place(_c.WEFT_OP_ALLREDUCE)
def allreduce_(tensor, average=True, name=None, ranks=None):
    """Allreduce `tensor` in place, as allreduce; returns `tensor`.

    Collective. The parameters and errors are allreduce's; no output is allocated (a
    non-contiguous input is reduced in a contiguous copy, then written back).

    Returns
    -------
    numpy.ndarray or torch.Tensor
        `tensor` itself, now holding the mean or sum.
    """
    x, cx, _ = _prepare(tensor)
    _allreduce(cx, cx, average, name, ranks)
    return _tensors.copy_back(tensor, x)


@_refused_in_place(_c.WEFT_OP_ALLREDUCE)
def allreduce_nonblocking(tensor, average=True, name=None, ranks=None):
    """Start an allreduce and return at once; synchronize() gives its result.

    Collective; the parameters are allreduce's. Errors found before the op starts raise
    here, the others from synchronize().

    Returns
    -------
    Handle
        synchronize(handle) returns what allreduce would.
    """
    x, cx, kind = _prepare(tensor)
    y, cy = _empty_like(x, cx, kind)
    keep = _arm([x, cx, y, cy])
    request = _allreduce_nonblocking(cx, cy, average, name, ranks)
    return _start_into(request, keep, y, cy, kind)


@_refused_in_place(_c.WEFT_OP_ALLREDUCE)
def allreduce_nonblocking_(tensor, average=True, name=None, ranks=None):
    """Start an in-place allreduce of `tensor` and return at once.

    Collective; the parameters are allreduce's. `tensor` must stay untouched until the op
    completes.

    Returns
    -------
    Handle
        synchronize(handle) returns `tensor`, holding the mean or sum.
    """
    x, cx, kind = _prepare(tensor)
    _arm([x, cx])
    request = _allreduce_nonblocking(cx, cx, average, name, ranks)
    return Handle(request, x, kind, target=tensor if x is not tensor else None)


def _broadcast(cx, cy, root_rank, name, ranks):
    """The C call, as _allreduce."""
    if ranks is None:
        return _c.weft_comm_broadcast(cx, cy, int(root_rank), _name(name))
    return _c.weft_comm_broadcast_ranks(cx, cy, int(root_rank), _ranks(ranks), _name(name))


def _broadcast_nonblocking(cx, cy, root_rank, name, ranks):
    if ranks is None:
        return _c.weft_comm_broadcast_nonblocking(cx, cy, int(root_rank), _name(name))
    return _c.weft_comm_broadcast_ranks_nonblocking(cx, cy, int(root_rank), _ranks(ranks),
                                                    _name(name))


@_refused_in_place(_c.WEFT_OP_BROADCAST)
def broadcast(tensor, root_rank, name=None, ranks=None):
    """Return root_rank's `tensor` on every rank, or on every rank of a process set.

    Collective: every rank calls it (only the ranks of `ranks` with a process set, as for
    allreduce), matched by `name` or by call order.

    Parameters
    ----------
    tensor : numpy.ndarray, torch.Tensor or DLPack array
        The values to send on root_rank (not changed); elsewhere an array of the same
        dtype and shape, whose values are not used.
    root_rank : int
        The rank whose tensor everyone gets: a rank of the world, and of `ranks` if given.
    name : str, optional
        The op's name, as for allreduce.
    ranks : sequence of int, optional
        A process set, as for allreduce; None (the default): every rank.

    Returns
    -------
    numpy.ndarray or torch.Tensor
        A new array with the input's type, dtype and shape, holding root_rank's values.

    Raises
    ------
    InvalidArgumentError
        root_rank is out of range or not in `ranks`, shapes or dtypes differ across ranks,
        or the process set or name is invalid (as for allreduce).
    UnimplementedError
        weft does not exchange this dtype or device.
    TypeError
        `tensor` is not an array.

    See Also
    --------
    broadcast_ : in place.
    broadcast_nonblocking : returns a Handle.

    Examples
    --------
    >>> x = np.full(2, weft.rank(), dtype=np.int64)
    >>> weft.broadcast(x, root_rank=0)
    array([0, 0])
    """
    x, cx, kind = _prepare(tensor)
    y, cy = _output(x, kind)
    return _result(y, _broadcast(cx, cy, root_rank, name, ranks), kind)


@_refused_in_place(_c.WEFT_OP_BROADCAST)
def broadcast_(tensor, root_rank, name=None, ranks=None):
    """Broadcast root_rank's `tensor` in place, as broadcast; returns `tensor`.

    Collective. The parameters and errors are broadcast's.

    Returns
    -------
    numpy.ndarray or torch.Tensor
        `tensor` itself, now holding root_rank's values.

    Examples
    --------
    >>> weft.broadcast_(x, root_rank=0)       # every rank now has rank 0's x
    """
    x, cx, _ = _prepare(tensor)
    _broadcast(cx, cx, root_rank, name, ranks)
    return _tensors.copy_back(tensor, x)


@_refused_in_place(_c.WEFT_OP_BROADCAST)
def broadcast_nonblocking(tensor, root_rank, name=None, ranks=None):
    """Start a broadcast and return at once; synchronize() gives its result.

    Collective; the parameters are broadcast's.

    Returns
    -------
    Handle
        synchronize(handle) returns what broadcast would.
    """
    x, cx, kind = _prepare(tensor)
    y, cy = _empty_like(x, cx, kind)
    keep = _arm([x, cx, y, cy])
    request = _broadcast_nonblocking(cx, cy, root_rank, name, ranks)
    return _start_into(request, keep, y, cy, kind)


@_refused_in_place(_c.WEFT_OP_BROADCAST)
def broadcast_nonblocking_(tensor, root_rank, name=None, ranks=None):
    """Start an in-place broadcast into `tensor` and return at once.

    Collective; the parameters are broadcast's. `tensor` must stay untouched until the op
    completes.

    Returns
    -------
    Handle
        synchronize(handle) returns `tensor`, holding root_rank's values.
    """
    x, cx, kind = _prepare(tensor)
    _arm([x, cx])
    request = _broadcast_nonblocking(cx, cx, root_rank, name, ranks)
    return Handle(request, x, kind, target=tensor if x is not tensor else None)


def _peer(rank, function, what):
    # A rank, not a tensor: recv(x, src) (the buffer first) would otherwise fail later
    # with a confusing message about `name`.
    try:
        return _operator.index(rank)
    except TypeError:
        hint = "; pass the buffer to receive into as out=" if function == "recv" else ""
        raise TypeError(f"{function}: {what} must be a rank (an int), got "
                        f"{type(rank).__name__}{hint}") from None


@_refused_in_place(_c.WEFT_OP_SEND, peer="dst")
def send(tensor, dst, name=None):
    """Send `tensor` to rank `dst`; returns once the data has left `tensor`.

    Point to point: only the two ranks call. The recv on `dst` from this rank with the
    same name receives it; unnamed, the pair's sends and receives match in call order.

    Parameters
    ----------
    tensor : numpy.ndarray, torch.Tensor or DLPack array
        The values to send (not changed).
    dst : int
        The receiving rank: another rank than this one.
    name : str, optional
        Matches the send with `dst`'s recv; None: the pair's call order.

    Returns
    -------
    None

    Raises
    ------
    InvalidArgumentError
        `dst` is this rank or out of range, or the receiver's buffer has another dtype or
        shape (an error on both ranks).
    TypeError
        `dst` is not an int, or `tensor` is not an array.
    DeadlineExceededError
        `dst` never called the matching recv (after WEFT_STALL_TIMEOUT_SECONDS).

    Examples
    --------
    >>> if weft.rank() == 0:
    ...     weft.send(np.arange(3.0), dst=1, name="data")
    ... elif weft.rank() == 1:
    ...     y = weft.recv(0, name="data")
    """
    x, cx, _ = _prepare(tensor)
    _c.weft_comm_send(cx, _peer(dst, "send", "dst"), _name(name))


@_refused_in_place(_c.WEFT_OP_SEND, peer="dst")
def send_nonblocking(tensor, dst, name=None):
    """Start a send (see send) and return at once.

    `tensor` must stay untouched until the send completes.

    Returns
    -------
    Handle
        synchronize(handle) returns None once the data has left `tensor`.
    """
    x, cx, kind = _prepare(tensor)
    _arm([x, cx])
    request = _c.weft_comm_send_nonblocking(cx, _peer(dst, "send", "dst"), _name(name))
    return Handle(request, None, kind)


def _result_kind(as_torch):
    if as_torch:
        import torch  # noqa: F401  (_tensors finds torch among the loaded modules)
        return _TORCH
    return _NUMPY


@_refused_in_place(_c.WEFT_OP_RECV, peer="src")
def recv(src, name=None, out=None, as_torch=False):
    """Receive what rank `src` sends to this rank with the same name.

    Point to point: only the two ranks call; unnamed, the pair's sends and receives match
    in call order.

    Parameters
    ----------
    src : int
        The sending rank: another rank than this one.
    name : str, optional
        Matches the sender's send; None: the pair's call order.
    out : numpy.ndarray or torch.Tensor, optional
        None (the default): receive into a new array of the sender's dtype and shape,
        allocated by weft and handed over without a copy. Otherwise `out` receives the
        data in place and is returned; the sender's dtype and shape must be out's.
    as_torch : bool, optional
        With out=None: return a torch.Tensor instead of a NumPy array (needed for
        bfloat16).

    Returns
    -------
    numpy.ndarray or torch.Tensor
        The new array, or `out`.

    Raises
    ------
    InvalidArgumentError
        `src` is this rank or out of range, or the sender's dtype or shape is not out's
        (an error on both ranks).
    TypeError
        `src` is not an int (the buffer goes to out=).
    DeadlineExceededError
        `src` never sent (after WEFT_STALL_TIMEOUT_SECONDS).

    Examples
    --------
    >>> y = weft.recv(0, name="data")                 # a new NumPy array
    >>> buf = torch.empty(3, dtype=torch.float64)
    >>> weft.recv(0, name="more", out=buf) is buf
    True
    """
    src = _peer(src, "recv", "src")
    if out is None:
        kind = _result_kind(as_torch)
        return _tensors.from_capsule(_c.weft_comm_recv_any(src, _name(name)), kind)
    x, cx, _ = _prepare(out, "out")
    _c.weft_comm_recv(cx, src, _name(name))
    return _tensors.copy_back(out, x)


@_refused_in_place(_c.WEFT_OP_RECV, peer="src")
def recv_nonblocking(src, name=None, out=None, as_torch=False):
    """Start a receive (see recv) and return at once.

    The parameters are recv's; `out`, when given, must stay untouched until the receive
    completes.

    Returns
    -------
    Handle
        synchronize(handle) returns what recv would.
    """
    src = _peer(src, "recv", "src")
    if out is None:
        kind = _result_kind(as_torch)
        # Nothing of the caller's to keep alive: weft owns the output until it is taken.
        _c.weft_py_arm(None)
        return Handle(_c.weft_comm_recv_any_nonblocking(src, _name(name)), None, kind,
                      gather=True)
    x, cx, kind = _prepare(out, "out")
    _arm([x, cx])
    request = _c.weft_comm_recv_nonblocking(cx, src, _name(name))
    return Handle(request, x, kind, target=out if x is not out else None)


@_refused_in_place(_c.WEFT_OP_ALLGATHER)
def allgather(tensor, name=None):
    """Return every rank's `tensor` concatenated along dim 0, in rank order.

    Collective: every rank calls it, matched by `name` or by call order.

    Parameters
    ----------
    tensor : numpy.ndarray, torch.Tensor or DLPack array
        This rank's part, with at least one dimension; dim 0 may differ across ranks, the
        other dimensions and the dtype may not.
    name : str, optional
        The op's name, as for allreduce.

    Returns
    -------
    numpy.ndarray or torch.Tensor
        A new array of the input's type and dtype, allocated by weft; its dim 0 is the sum
        of the ranks' dims 0.

    Raises
    ------
    InvalidArgumentError
        `tensor` is a scalar, or the dtype or trailing dimensions differ across ranks.
    UnimplementedError
        weft does not exchange this dtype or device.
    TypeError
        `tensor` is not an array.

    Examples
    --------
    >>> weft.allgather(np.array([weft.rank()]))   # 4 ranks
    array([0, 1, 2, 3])
    """
    x, cx, kind = _prepare(tensor)
    return _tensors.from_capsule(_c.weft_comm_allgather(cx, _name(name)), kind)


@_refused_in_place(_c.WEFT_OP_ALLGATHER)
def allgather_nonblocking(tensor, name=None):
    """Start an allgather and return at once; synchronize() gives its result.

    Collective; the parameters are allgather's.

    Returns
    -------
    Handle
        synchronize(handle) returns what allgather would.
    """
    x, cx, kind = _prepare(tensor)
    _arm([x, cx])
    request = _c.weft_comm_allgather_nonblocking(cx, _name(name))
    return Handle(request, None, kind, gather=True)


def _gather_options(src_ranks, dst_ranks):
    if src_ranks is None and dst_ranks is None:
        return None
    if src_ranks is None or dst_ranks is None:
        raise InvalidArgumentError(  # noqa: F405
            1, "neighbor_allgather: src_ranks and dst_ranks go together: pass both or neither")
    return (list(src_ranks), list(dst_ranks))


@_refused_in_place(_c.WEFT_OP_NEIGHBOR_ALLGATHER)
def neighbor_allgather(tensor, src_ranks=None, dst_ranks=None, enable_topo_check=True,
                       name=None):
    """Return the in-neighbors' tensors concatenated along dim 0, self excluded.

    Collective: every rank calls it, matched by `name` or by call order. The parts come in
    rank order, or in the order of `src_ranks`.

    Parameters
    ----------
    tensor : numpy.ndarray, torch.Tensor or DLPack array
        This rank's part, with at least one dimension, sent to its out-neighbors.
    src_ranks, dst_ranks : sequence of int, optional
        Receive from `src_ranks` and send to `dst_ranks` for this call instead of the
        topology's neighbors; pass both or neither.
    enable_topo_check : bool, optional
        Kept for Bluefog compatibility: weft always checks the send and receive sets.
    name : str, optional
        The op's name, as for allreduce.

    Returns
    -------
    numpy.ndarray or torch.Tensor
        A new array of the input's type and dtype, allocated by weft.

    Raises
    ------
    InvalidArgumentError
        Only one of src_ranks and dst_ranks is given, the sets do not match across ranks,
        `tensor` is a scalar, or the dtype or trailing dimensions differ.
    UnimplementedError
        weft does not exchange this dtype or device.

    Examples
    --------
    >>> weft.set_topology(topology.RingGraph(4))
    True
    >>> weft.neighbor_allgather(np.array([weft.rank()]))   # rank 0
    array([1, 3])
    """
    x, cx, kind = _prepare(tensor)
    out = _c.weft_comm_neighbor_allgather(cx, _gather_options(src_ranks, dst_ranks),
                                          _name(name))
    return _tensors.from_capsule(out, kind)


@_refused_in_place(_c.WEFT_OP_NEIGHBOR_ALLGATHER)
def neighbor_allgather_nonblocking(tensor, src_ranks=None, dst_ranks=None,
                                   enable_topo_check=True, name=None):
    """Start a neighbor_allgather and return at once; synchronize() gives its result.

    Collective; the parameters are neighbor_allgather's.

    Returns
    -------
    Handle
        synchronize(handle) returns what neighbor_allgather would.
    """
    x, cx, kind = _prepare(tensor)
    _arm([x, cx])
    request = _c.weft_comm_neighbor_allgather_nonblocking(
        cx, _gather_options(src_ranks, dst_ranks), _name(name))
    return Handle(request, None, kind, gather=True)


def _allreduce_options(self_weight, src_weights, dst_weights, enable_topo_check):
    if self_weight is None and src_weights is None and dst_weights is None:
        return None if enable_topo_check else (None, None, None, False)
    return (self_weight, src_weights, dst_weights, bool(enable_topo_check))


@_refused_in_place(_c.WEFT_OP_NEIGHBOR_ALLREDUCE)
def neighbor_allreduce(tensor, self_weight=None, src_weights=None, dst_weights=None,
                       enable_topo_check=True, name=None):
    """Combine `tensor` with the in-neighbors' tensors.

    The result is self_weight * x + sum_j src_weights[j] * (j's dst weight for this rank)
    * x_j. Without weights: the topology's receive weights (a weighted topology) or the
    uniform average over self and in-neighbors. Collective: every rank calls it, matched
    by `name` or by call order.

    Parameters
    ----------
    tensor : numpy.ndarray, torch.Tensor or DLPack array
        This rank's x (not changed); the same dtype and shape on every rank.
    self_weight : float, optional
        The weight of this rank's own x; goes together with `src_weights`.
    src_weights : dict of {int: float}, optional
        {in-neighbor rank: weight}; goes together with `self_weight`. Weights may be any
        finite numbers (negative, or above 1).
    dst_weights : dict of {int: float} or list of int, optional
        Makes the call dynamic: this rank sends to exactly those ranks, this call only,
        scaled by their weights (1 for a list). Needs self_weight and src_weights.
    enable_topo_check : bool, optional
        Kept for Bluefog compatibility: weft always checks the send and receive sets.
    name : str, optional
        The op's name, as for allreduce.

    Returns
    -------
    numpy.ndarray or torch.Tensor
        A new array with the input's type, dtype and shape.

    Raises
    ------
    ValueError
        Only one of self_weight and src_weights is given.
    InvalidArgumentError
        A weight is NaN or infinite, a rank is out of range, the ranks' send and receive
        sets do not match, or the shape or dtype differs across ranks.
    TypeError
        `src_weights` is not a dict, or `tensor` is not an array.
    UnimplementedError
        weft does not exchange this dtype or device.

    Examples
    --------
    >>> weft.set_topology(topology.RingGraph(weft.size()))
    True
    >>> y = weft.neighbor_allreduce(x)        # (x_{r-1} + x_r + x_{r+1}) / 3
    >>> send, recv = next(schedule)           # a dynamic exchange
    >>> y = weft.neighbor_allreduce(x, self_weight=0.5, src_weights={r: 0.5 / len(recv)
    ...                             for r in recv}, dst_weights=send, name="x")
    """
    x, cx, kind = _prepare(tensor)
    y, cy = _output(x, kind)
    made = _c.weft_comm_neighbor_allreduce(
        cx, cy, _allreduce_options(self_weight, src_weights, dst_weights, enable_topo_check),
        _name(name))
    return _result(y, made, kind)


@_refused_in_place(_c.WEFT_OP_NEIGHBOR_ALLREDUCE)
def neighbor_allreduce_nonblocking(tensor, self_weight=None, src_weights=None,
                                   dst_weights=None, enable_topo_check=True, name=None):
    """Start a neighbor_allreduce and return at once; synchronize() gives its result.

    Collective; the parameters are neighbor_allreduce's.

    Returns
    -------
    Handle
        synchronize(handle) returns what neighbor_allreduce would.
    """
    x, cx, kind = _prepare(tensor)
    y, cy = _empty_like(x, cx, kind)
    keep = _arm([x, cx, y, cy])
    request = _c.weft_comm_neighbor_allreduce_nonblocking(
        cx, cy, _allreduce_options(self_weight, src_weights, dst_weights, enable_topo_check),
        _name(name))
    return _start_into(request, keep, y, cy, kind)


def _hierarchical_options(self_weight, src_machine_weights, dst_machine_weights):
    if self_weight is None and src_machine_weights is None and dst_machine_weights is None:
        return None
    return (self_weight, src_machine_weights, dst_machine_weights)


@_refused_in_place(_c.WEFT_OP_HIERARCHICAL_NEIGHBOR_ALLREDUCE)
def hierarchical_neighbor_allreduce(tensor, self_weight=None, src_machine_weights=None,
                                    dst_machine_weights=None, enable_topo_check=False,
                                    name=None):
    """Neighbor-allreduce `tensor` between machines, each machine acting as one node.

    Sums inside each machine, neighbor-allreduces the sums between machines over the
    machine topology (see set_machine_topology), broadcasts back and divides by
    local_size(). Collective: every rank calls it, matched by `name` or by call order.

    Parameters
    ----------
    tensor : numpy.ndarray, torch.Tensor or DLPack array
        This rank's x (not changed); the same dtype and shape on every rank.
    self_weight : float, optional
        The weight of this machine's own sum; goes together with src_machine_weights.
    src_machine_weights : dict of {int: float}, optional
        {in-neighbor machine index: weight}, as src_weights of neighbor_allreduce.
    dst_machine_weights : dict of {int: float} or list of int, optional
        The machines to send to, this call only, as dst_weights of neighbor_allreduce.
    enable_topo_check : bool, optional
        Accepted for Bluefog compatibility; not used.
    name : str, optional
        The op's name, as for allreduce.

    Returns
    -------
    numpy.ndarray or torch.Tensor
        A new array with the input's type, dtype and shape.

    Raises
    ------
    InvalidArgumentError
        A weight is NaN or infinite, a machine index is out of range, or the shape or
        dtype differs across ranks.

    Examples
    --------
    >>> y = weft.hierarchical_neighbor_allreduce(x)
    """
    x, cx, kind = _prepare(tensor)
    y, cy = _output(x, kind)
    made = _c.weft_comm_hierarchical_neighbor_allreduce(
        cx, cy, _hierarchical_options(self_weight, src_machine_weights, dst_machine_weights),
        _name(name))
    return _result(y, made, kind)


@_refused_in_place(_c.WEFT_OP_HIERARCHICAL_NEIGHBOR_ALLREDUCE)
def hierarchical_neighbor_allreduce_nonblocking(tensor, self_weight=None,
                                                src_machine_weights=None,
                                                dst_machine_weights=None,
                                                enable_topo_check=False, name=None):
    """Start a hierarchical_neighbor_allreduce and return at once.

    Collective; the parameters are hierarchical_neighbor_allreduce's.

    Returns
    -------
    Handle
        synchronize(handle) returns what hierarchical_neighbor_allreduce would.
    """
    x, cx, kind = _prepare(tensor)
    y, cy = _empty_like(x, cx, kind)
    keep = _arm([x, cx, y, cy])
    request = _c.weft_comm_hierarchical_neighbor_allreduce_nonblocking(
        cx, cy, _hierarchical_options(self_weight, src_machine_weights, dst_machine_weights),
        _name(name))
    return _start_into(request, keep, y, cy, kind)


@_refused_in_place(_c.WEFT_OP_PAIR_GOSSIP)
def pair_gossip(tensor, target_rank, self_weight=0.5, pair_weight=0.5, name=None):
    """Combine `tensor` with one peer's: self_weight * own + pair_weight * the peer's.

    Both peers end with that combination of their own tensors. Collective: every rank
    calls it with its peer as target_rank, the two peers of a pair naming each other.

    Parameters
    ----------
    tensor : numpy.ndarray, torch.Tensor or DLPack array
        This rank's values (not changed); the same dtype and shape on both peers.
    target_rank : int
        The peer: another rank than this one.
    self_weight, pair_weight : float, optional
        The weights of this rank's and the peer's tensor; 0.5 each by default.
    name : str, optional
        The op's name, as for allreduce.

    Returns
    -------
    numpy.ndarray or torch.Tensor
        A new array with the input's type, dtype and shape.

    Raises
    ------
    InvalidArgumentError
        target_rank is this rank or out of range, or the peers' shapes or dtypes differ.

    Examples
    --------
    >>> peer = weft.rank() ^ 1                # pairs (0, 1), (2, 3), ...
    >>> y = weft.pair_gossip(x, peer)
    """
    x, cx, kind = _prepare(tensor)
    y, cy = _output(x, kind)
    made = _c.weft_comm_pair_gossip(cx, cy, int(target_rank), float(self_weight),
                                    float(pair_weight), _name(name))
    return _result(y, made, kind)


@_refused_in_place(_c.WEFT_OP_PAIR_GOSSIP)
def pair_gossip_nonblocking(tensor, target_rank, self_weight=0.5, pair_weight=0.5, name=None):
    """Start a pair_gossip and return at once; synchronize() gives its result.

    Returns
    -------
    Handle
        synchronize(handle) returns what pair_gossip would.
    """
    x, cx, kind = _prepare(tensor)
    y, cy = _empty_like(x, cx, kind)
    keep = _arm([x, cx, y, cy])
    request = _c.weft_comm_pair_gossip_nonblocking(
        cx, cy, int(target_rank), float(self_weight), float(pair_weight), _name(name))
    return _start_into(request, keep, y, cy, kind)


def barrier():
    """Wait until every rank has called barrier().

    Collective; call it from the thread that called init().

    Raises
    ------
    FailedPreconditionError
        weft is not initialized.
    InvalidArgumentError
        Called from another thread than init()'s.
    """
    _c.weft_comm_barrier()


def barrier_nonblocking():
    """Start a barrier and return at once.

    Returns
    -------
    Handle
        synchronize(handle) returns None once every rank has reached the barrier.
    """
    _c.weft_py_arm(None)
    return Handle(_c.weft_comm_barrier_nonblocking(), None, _NUMPY)


def group_start():
    """Open a group: the ops this thread starts until group_end() do not wake weft's engine.

    As NCCL's ncclGroupStart: a burst of nonblocking ops (one per parameter, say) started in
    a group reaches the engine whole at group_end() and is negotiated and fused as one,
    instead of the first op waking weft's engine thread and starting alone. A hint, not a
    barrier: an engine thread awake anyway, or a wait or poll, takes the ops as they come
    (waiting for one of them inside the group hands them over at once). The ops are matched
    and checked as any others. Groups nest and belong to the calling thread. Does not need
    init(). The `group()` context manager pairs the calls.
    """
    _c.weft_comm_group_start()


def group_end():
    """Close the group group_start() opened on this thread; the outermost one hands its ops
    to weft's engine.

    Raises
    ------
    FailedPreconditionError
        No group is open on this thread.
    """
    _c.weft_comm_group_end()


@_contextlib.contextmanager
def group():
    """A group (group_start() ... group_end()) as a context manager.

    Examples
    --------
    >>> with weft.group():
    ...     handles = [weft.allreduce_nonblocking(g, name=n) for n, g in grads.items()]
    >>> results = [weft.synchronize(h) for h in handles]
    """
    group_start()
    try:
        yield
    finally:
        group_end()

# ---- configuration and timeline -----------------------------------------------------------


def config_get(name):
    """Return the value in force of a WEFT_* setting, as text.

    Parameters
    ----------
    name : str
        The setting, e.g. "WEFT_FUSION_THRESHOLD_BYTES".

    Returns
    -------
    str

    Raises
    ------
    InvalidArgumentError
        `name` is not a weft setting.

    Examples
    --------
    >>> weft.config_get("WEFT_FUSION_THRESHOLD_BYTES")
    '67108864'
    """
    return _c.weft_config_get(name)


def config_set(name, value):
    """Override a WEFT_* setting in this process.

    The override wins over the environment and is validated at once. Most settings are
    read at init(), so set them before it.

    Parameters
    ----------
    name : str
        The setting, e.g. "WEFT_FUSION_THRESHOLD_BYTES".
    value : str, int, float or bool
        The new value; converted to text (a bool to "1" or "0").

    Raises
    ------
    InvalidArgumentError
        `name` is not a weft setting, or `value` is not valid for it.

    Examples
    --------
    >>> weft.config_set("WEFT_FUSION_THRESHOLD_BYTES", 4096)
    >>> weft.config_get("WEFT_FUSION_THRESHOLD_BYTES")
    '4096'
    """
    if isinstance(value, bool):
        value = "1" if value else "0"
    _c.weft_config_set(name, str(value))


def config_unset(name):
    """Drop the override of a WEFT_* setting made with config_set.

    The environment's value, or the default, is in force again.

    Parameters
    ----------
    name : str
        The setting.

    Raises
    ------
    InvalidArgumentError
        `name` is not a weft setting.
    """
    _c.weft_config_unset(name)


def config_describe():
    """Return a table of every WEFT_* setting: value in force, default, description.

    Returns
    -------
    str
        Text meant for printing.
    """
    return _c.weft_config_describe()


def timeline_start(path):
    """Start writing this rank's Chrome trace (open it in Perfetto).

    Ops already started show only the phases that begin after this call.

    Parameters
    ----------
    path : str or os.PathLike
        The trace file; with more than one rank, each rank writes its own file named after
        `path` (as WEFT_TIMELINE names them).

    Raises
    ------
    FailedPreconditionError
        weft is not initialized, or a timeline is already being written.
    InvalidArgumentError
        `path` is empty.

    Examples
    --------
    >>> weft.timeline_start("/tmp/trace.json")
    >>> ...                                   # ops, timeline_context(...)
    >>> weft.timeline_stop()
    """
    _c.weft_timeline_start(str(path))


def timeline_stop():
    """Finish and close the trace that is being written; nothing when none is.

    Raises
    ------
    FailedPreconditionError
        weft is not initialized.
    """
    _c.weft_timeline_stop()


def timeline_start_activity(tensor_name, activity_name):
    """Mark the start of a user activity (e.g. "forward") on tensor_name's row.

    timeline_end_activity(tensor_name) marks its end; timeline_context does both.

    Parameters
    ----------
    tensor_name : str
        The timeline row (an op name, or any name).
    activity_name : str
        The activity shown on the row.

    Raises
    ------
    FailedPreconditionError
        weft is not initialized.
    InvalidArgumentError
        `tensor_name` or `activity_name` is empty.
    """
    _c.weft_timeline_start_activity(tensor_name, activity_name)


def timeline_end_activity(tensor_name):
    """Mark the end of the activity that timeline_start_activity began on tensor_name's row.

    Parameters
    ----------
    tensor_name : str
        The timeline row.

    Raises
    ------
    FailedPreconditionError
        weft is not initialized.
    """
    _c.weft_timeline_end_activity(tensor_name)


def timeline_active():
    """Whether a timeline is being written (WEFT_TIMELINE or timeline_start).

    Returns
    -------
    bool
    """
    return bool(_c.weft_timeline_active())


@_contextlib.contextmanager
def timeline_context(tensor_name, activity_name):
    """A context manager marking its body as an activity on tensor_name's row.

    Parameters
    ----------
    tensor_name : str
        The timeline row.
    activity_name : str
        The activity shown on the row.

    Examples
    --------
    >>> with weft.timeline_context("layer1", "forward"):
    ...     y = layer1(x)
    """
    timeline_start_activity(tensor_name, activity_name)
    try:
        yield
    finally:
        timeline_end_activity(tensor_name)

# ---- one-sided windows (Bluefog's win_* names) ----------------------------------------------

# name -> (array, capsule): weft keeps a pointer to the window's memory until win_free.
_windows = {}


@_refused_in_place(_c.WEFT_OP_WIN_CREATE)
def win_create(tensor, name, zero_init=False, transport=None):
    """Create the one-sided window `name` over `tensor`.

    Collective: every rank calls it with the same name. Every rank gets one buffer per
    in-neighbor of the topology in force, starting as a copy of its own tensor (or
    zeros). The tensor itself is the window's memory: win_get reads it and win_update
    writes it in place, so it must be a contiguous, writable array; weft holds a reference
    to it until win_free. set_topology fails while windows exist.

    Parameters
    ----------
    tensor : numpy.ndarray or torch.Tensor
        The window's memory: contiguous, writable, not requiring grad; the same dtype and
        shape on every rank.
    name : str
        The window's name, unique among the live windows.
    zero_init : bool, optional
        Start the neighbor buffers as zeros instead of copies (default False).
    transport : {"mpi", "ucx"}, optional
        MPI RMA or UCX RDMA; None (the default): the WEFT_TRANSPORT setting. The same on
        every rank.

    Returns
    -------
    bool
        True.

    Raises
    ------
    InvalidArgumentError
        `tensor` is not contiguous and writable (or requires grad), the name is empty or
        taken, or the transport is unknown.

    See Also
    --------
    win_free, win_put, win_get, win_update

    Examples
    --------
    >>> x = np.zeros(4, dtype=np.float32)
    >>> weft.win_create(x, "w")
    True
    >>> weft.win_put(x, "w")                  # to every out-neighbor
    True
    >>> weft.win_update("w")                  # x <- average of x and the buffers
    >>> weft.win_free("w")
    True
    """
    x, cx, kind = _prepare(tensor)
    if x is not tensor:
        raise InvalidArgumentError(  # noqa: F405
            1, f"win_create '{name}': the tensor must be contiguous, writable and not require "
            f"grad: weft updates it in place")
    options = None if not zero_init and transport is None else (bool(zero_init), transport)
    _c.weft_win_create(cx, str(name), options)
    _windows[str(name)] = (x, cx, kind)
    return True


def win_free(name=None):
    """Free one window, or every window.

    Collective: every rank calls it. weft releases the window's tensor, which is the
    program's again.

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
    NotFoundError
        There is no window named `name`.
    """
    _c.weft_win_free(None if name is None else str(name))
    if name is None:
        _windows.clear()
    else:
        _windows.pop(str(name), None)
    return True


def _win_put_options(self_weight, dst_weights, require_mutex):
    if self_weight is None and dst_weights is None and not require_mutex:
        return None
    return (self_weight, dst_weights, bool(require_mutex))


def _win_put(call, tensor, name, self_weight, dst_weights, require_mutex):
    x, cx, _ = _prepare(tensor)
    call(cx, str(name), _win_put_options(self_weight, dst_weights, require_mutex))
    if x is not tensor and self_weight is not None:
        _tensors.copy_back(tensor, x)  # self_weight scaled the contiguous copy
    return True


def win_put(tensor, name, self_weight=None, dst_weights=None, require_mutex=False):
    """Write `tensor` into the destinations' buffers for this rank in window `name`.

    Writes dst_weights[d] * tensor into each destination d's buffer for this rank
    (default: every out-neighbor, weight 1), then multiplies the local tensor (and p, see
    win_associated_p) by self_weight. One-sided: the destinations call nothing.

    Parameters
    ----------
    tensor : numpy.ndarray or torch.Tensor
        What to put, with the window's dtype and shape (usually the window's own tensor).
    name : str
        The window.
    self_weight : float, optional
        Multiplies `tensor` (in place) and p after the put; None: unchanged.
    dst_weights : dict of {int: float} or list of int, optional
        {out-neighbor: weight}, or out-neighbors with weight 1; None: every out-neighbor
        of the topology the window was created with, weight 1.
    require_mutex : bool, optional
        Hold the destinations' window mutexes around the put (default False).

    Returns
    -------
    bool
        True.

    Raises
    ------
    NotFoundError
        There is no window named `name`.
    InvalidArgumentError
        `tensor` does not match the window, a destination is not an out-neighbor, or a
        weight is NaN or infinite.

    Examples
    --------
    >>> weft.win_put(x, "w", dst_weights={1: 0.5})
    True
    """
    return _win_put(_c.weft_win_put, tensor, name, self_weight, dst_weights, require_mutex)


def win_accumulate(tensor, name, self_weight=None, dst_weights=None, require_mutex=False):
    """Add `tensor` into the destinations' buffers for this rank, as win_put writes.

    The parameters, result and errors are win_put's; the addition is atomic per element.

    Returns
    -------
    bool
        True.
    """
    return _win_put(_c.weft_win_accumulate, tensor, name, self_weight, dst_weights,
                    require_mutex)


def _win_put_nonblocking(call, tensor, name, self_weight, dst_weights, require_mutex):
    x, cx, kind = _prepare(tensor)
    _arm([x, cx])
    request = call(cx, str(name), _win_put_options(self_weight, dst_weights, require_mutex))
    return Handle(request, True, kind)


def win_put_nonblocking(tensor, name, self_weight=None, dst_weights=None,
                        require_mutex=False):
    """Start a win_put and return at once.

    The parameters are win_put's; `tensor` must stay untouched until the put completes.

    Returns
    -------
    Handle
        synchronize(handle) (or win_wait) returns True once the put completed.
    """
    return _win_put_nonblocking(_c.weft_win_put_nonblocking, tensor, name, self_weight,
                                dst_weights, require_mutex)


def win_accumulate_nonblocking(tensor, name, self_weight=None, dst_weights=None,
                               require_mutex=False):
    """Start a win_accumulate and return at once.

    The parameters are win_put's; `tensor` must stay untouched until the op completes.

    Returns
    -------
    Handle
        synchronize(handle) (or win_wait) returns True once the op completed.
    """
    return _win_put_nonblocking(_c.weft_win_accumulate_nonblocking, tensor, name,
                                self_weight, dst_weights, require_mutex)


def _win_get_options(src_weights, require_mutex):
    if src_weights is None and not require_mutex:
        return None
    return (src_weights, bool(require_mutex))


def win_get(name, src_weights=None, require_mutex=False):
    """Read the sources' window tensors into this rank's buffers for them.

    Reads src_weights[j] * x_j of each source j (default: every in-neighbor, weight 1)
    into this rank's buffer for j. One-sided: the sources call nothing.

    Parameters
    ----------
    name : str
        The window.
    src_weights : dict of {int: float} or list of int, optional
        {in-neighbor: weight}, or in-neighbors with weight 1; None: every in-neighbor of
        the topology the window was created with, weight 1.
    require_mutex : bool, optional
        Hold the sources' window mutexes around the get (default False).

    Returns
    -------
    bool
        True.

    Raises
    ------
    NotFoundError
        There is no window named `name`.
    InvalidArgumentError
        A source is not an in-neighbor, or a weight is NaN or infinite.

    Examples
    --------
    >>> weft.win_get("w")
    True
    >>> x = weft.win_update("w")
    """
    _c.weft_win_get(str(name), _win_get_options(src_weights, require_mutex))
    return True


def win_get_nonblocking(name, src_weights=None, require_mutex=False):
    """Start a win_get and return at once.

    The parameters are win_get's.

    Returns
    -------
    Handle
        synchronize(handle) (or win_wait) returns True once the get completed.
    """
    _c.weft_py_arm(None)
    request = _c.weft_win_get_nonblocking(str(name), _win_get_options(src_weights,
                                                                      require_mutex))
    return Handle(request, True, _NUMPY)


def _window_tensor(name, clone):
    entry = _windows.get(str(name))
    if entry is None:
        return None
    x = entry[0]
    return x.clone() if clone and entry[2] == _TORCH else (x.copy() if clone else x)


def win_update(name, self_weight=None, neighbor_weights=None, reset=False, clone=False,
               require_mutex=False):
    """Combine the window's buffers into its tensor, in place, and return the tensor.

    x <- self_weight * x + sum_j neighbor_weights[j] * buffer_j; without weights, the
    topology's receive weights if it was set weighted, else the uniform average over x and
    every buffer. Local: no other rank takes part.

    Parameters
    ----------
    name : str
        The window.
    self_weight : float, optional
        The weight of x; goes together with `neighbor_weights`.
    neighbor_weights : dict of {int: float}, optional
        {in-neighbor: weight of its buffer}; goes together with `self_weight`.
    reset : bool, optional
        Zero the buffers used (default False).
    clone : bool, optional
        Return a copy of the window's tensor instead of the tensor itself (default False).
    require_mutex : bool, optional
        Hold this rank's own window mutex during the update (default False).

    Returns
    -------
    numpy.ndarray or torch.Tensor
        The window's tensor (a copy with clone=True).

    Raises
    ------
    ValueError
        Only one of self_weight and neighbor_weights is given.
    TypeError
        `neighbor_weights` is not a dict.
    NotFoundError
        There is no window named `name`.
    InvalidArgumentError
        A rank is not an in-neighbor, or a weight is NaN or infinite.

    Examples
    --------
    >>> x = weft.win_update("w")              # uniform average
    >>> x = weft.win_update("w", self_weight=0.5, neighbor_weights={1: 0.5}, reset=True)
    """
    options = None
    if self_weight is not None or neighbor_weights is not None or reset or require_mutex:
        options = (self_weight, neighbor_weights, bool(reset), bool(require_mutex))
    _c.weft_win_update(str(name), options)
    return _window_tensor(name, clone)


def win_update_then_collect(name, require_mutex=False):
    """Add every buffer into the window's tensor (a sum, not an average), then zero them.

    x <- x + sum of every buffer, in place. Local: no other rank takes part.

    Parameters
    ----------
    name : str
        The window.
    require_mutex : bool, optional
        Hold this rank's own window mutex (default False).

    Returns
    -------
    numpy.ndarray or torch.Tensor
        The window's tensor.

    Raises
    ------
    NotFoundError
        There is no window named `name`.
    """
    _c.weft_win_update_then_collect(str(name), bool(require_mutex))
    return _window_tensor(name, False)


win_poll = poll
win_wait = synchronize


def get_win_version(name):
    """Count the puts (and gets) into each of the window's buffers since its last update.

    Parameters
    ----------
    name : str
        The window.

    Returns
    -------
    dict of {int: int}
        {in-neighbor: puts into its buffer since the last update}.

    Raises
    ------
    NotFoundError
        There is no window named `name`.
    """
    return _c.weft_win_version(max(size(), 1), str(name))


def win_associated_p(name):
    """Return the scalar p that follows the window's weights (push-sum); it starts at 1.

    Window ops apply their weights to p too while turn_on_win_ops_with_associated_p() is
    in force.

    Parameters
    ----------
    name : str
        The window.

    Returns
    -------
    float

    Raises
    ------
    NotFoundError
        There is no window named `name`.
    """
    return _c.weft_win_associated_p(str(name))


def turn_on_win_ops_with_associated_p():
    """Make win_update and a put's self_weight also apply to p, for every window.

    This is weft's default; weft.torch.init() turns it off, as Bluefog starts. A
    process-wide switch, usable at any time.
    """
    _c.weft_win_set_associated_p_ops(1)


def turn_off_win_ops_with_associated_p():
    """Leave p as it is whatever the window ops do, for every window.

    A process-wide switch, usable at any time; puts still write their weighted p into the
    neighbors' buffers.
    """
    _c.weft_win_set_associated_p_ops(0)


def win_associated_p_ops():
    """Whether window ops apply their weights to p (see turn_on_win_ops_with_associated_p).

    Returns
    -------
    bool
    """
    return bool(_c.weft_win_associated_p_ops())


def win_names():
    """The names of the windows this process created with win_create and has not freed.

    Returns
    -------
    list of str
        Sorted.
    """
    return sorted(_windows)


@_contextlib.contextmanager
def win_mutex(name, for_self=False, ranks=None):
    """A context manager holding window mutexes of window `name` around its body.

    The mutexes are taken in rank order; entering waits while another rank holds one.

    Parameters
    ----------
    name : str
        The window.
    for_self : bool, optional
        Hold this rank's own mutex (default False).
    ranks : sequence of int, optional
        Hold these ranks' mutexes; None (the default): this rank's out-neighbors.

    Raises
    ------
    NotFoundError
        There is no window named `name`.

    Examples
    --------
    >>> with weft.win_mutex("w", ranks=[0]):
    ...     weft.win_put(x, "w", dst_weights=[0])
    """
    if for_self:
        ranks = [rank()]
    elif ranks is None:
        ranks = out_neighbor_ranks()
    ranks = sorted(int(r) for r in ranks)
    if not ranks:  # no out-neighbors (one rank): nothing to hold; [] would mean "self" in C
        yield
        return
    _c.weft_win_mutex_acquire(str(name), ranks)
    try:
        yield
    finally:
        _c.weft_win_mutex_release(str(name), ranks)

# ---- distributed optimizers (weft.torch, imported on first use: torch is optional) ---------

_TORCH_NAMES = frozenset([
    "CommunicationType", "StepCountWarning", "DistributedAdaptWithCombineOptimizer",
    "DistributedAdaptThenCombineOptimizer", "DistributedGradientAllreduceOptimizer",
    "DistributedWinPutOptimizer", "DistributedPushSumOptimizer", "broadcast_parameters",
    "broadcast_optimizer_state", "allreduce_parameters", "consensus_distance",
    "DistributedAllreduceOptimizer", "DistributedNeighborAllreduceOptimizer",
    "DistributedHierarchicalNeighborAllreduceOptimizer",
])


def __getattr__(name):
    import importlib

    # weft.pipe (freezing, partitions, plans) is imported at its first use: its dataclasses
    # would be a third of `import weft`.
    if name == "pipe":
        return importlib.import_module(".pipe", __name__)
    # Bluefog programs reach the optimizers as bf.DistributedAdaptWithCombineOptimizer with
    # `import weft as bf`; they live in weft.torch, which needs torch.
    if name in _TORCH_NAMES:
        return getattr(importlib.import_module(".torch", __name__), name)
    raise AttributeError(f"module 'weft' has no attribute {name!r}")
