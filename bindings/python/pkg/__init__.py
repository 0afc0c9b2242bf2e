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
import os as _os
import sys as _sys
import warnings as _warnings

from . import _errors
from . import _tensors
from . import lowlevel as _c
from ._errors import *  # noqa: F401,F403  (the exception classes)
from . import topology  # noqa: F401
from .topology import Topology
from ._step_counter import StepCounter  # noqa: F401
from . import pipe  # noqa: F401  (weft.pipe: freezing, partitions, plans)

_c.weft_py_set_error_factory(_errors.make_error)

__version__ = _c.weft_version()

_prepare = _tensors.prepare
_empty_like = _tensors.empty_like
_NUMPY, _TORCH = _tensors.NUMPY, _tensors.TORCH

# ---- process model -------------------------------------------------------------------------


_session = [0]  # how many times init() succeeded in this process: the same on every rank


def init():
    """Starts MPI (unless the program did) and weft's engine. Collective."""
    _c.weft_init()
    _session[0] += 1


def _end_job_on_uncaught_exception(kind, value, traceback, _previous=_sys.excepthook):
    # A rank that dies of an exception would otherwise run weft's shutdown at exit, which
    # waits for every rank, while the others wait in their next op for this one: the job
    # would hang forever. Print the error, then leave without MPI_Finalize: Open MPI's
    # launcher sees a rank that exited without finalizing and ends the whole job.
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
        _os._exit(1)


_sys.excepthook = _end_job_on_uncaught_exception


def shutdown():
    """Waits for every rank, then stops the engine (freeing every window). Collective."""
    _c.weft_shutdown()
    _windows.clear()  # weft freed them: their arrays are the program's again


def finalize():
    """Finalizes MPI if weft started it (after shutdown() if still initialized); init()
    fails afterwards. Python runs it at exit by itself."""
    _c.weft_finalize()
    _windows.clear()


def is_initialized():
    return bool(_c.weft_is_initialized())


rank = _c.weft_rank
size = _c.weft_size
local_rank = _c.weft_local_rank
local_size = _c.weft_local_size
machine_rank = _c.weft_machine_rank
machine_size = _c.weft_machine_size


def is_homogeneous():
    """Every machine runs the same number of ranks and each machine's ranks are consecutive
    (machine m holds ranks m * local_size() ...). Needs init()."""
    value = _c.weft_is_homogeneous()
    if value < 0:
        raise FailedPreconditionError(  # noqa: F405
            2, "is_homogeneous: weft is not initialized; call init() first")
    return bool(value)


def unified_mpi_window_model():
    """Whether MPI windows here use MPI's unified memory model. Needs init()."""
    return bool(_c.weft_unified_mpi_window_model())


def nccl_built():
    """Whether this build runs CUDA tensors on NCCL."""
    return bool(_c.weft_nccl_built())

# ---- topology ------------------------------------------------------------------------------


def set_topology(topology=None, is_weighted=False):
    """Sets the virtual topology (a weft Topology or a networkx DiGraph; None: the
    exponential graph). Collective: every rank passes an equivalent graph.

    As in Bluefog, returns True on success, and False with a RuntimeWarning giving the
    reason when the ranks refuse it, changing nothing: ops in flight on some rank, or
    graphs that differ across ranks. A graph of the wrong size raises
    InvalidArgumentError at once, and a call before init() FailedPreconditionError."""
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
    """A copy of the topology in force (a weft Topology; .to_networkx() converts it)."""
    return Topology(_c.weft_comm_load_topology())


def is_topo_weighted():
    return bool(_c.weft_comm_is_topo_weighted())


def in_neighbor_ranks():
    return _c.weft_comm_in_neighbor_ranks(max(size(), 0))


def out_neighbor_ranks():
    return _c.weft_comm_out_neighbor_ranks(max(size(), 0))


def set_machine_topology(topology, is_weighted=False):
    """The graph between machines that hierarchical_neighbor_allreduce uses; returns
    True, or False with a warning, as set_topology."""
    _require_init("set_machine_topology")
    topo = Topology.coerce(topology)
    _check_topology_size(topo, machine_size(), "set_machine_topology", "machines")
    return _refusable(_c.weft_comm_set_machine_topology, topo, is_weighted,
                      "set_machine_topology")


def load_machine_topology():
    return Topology(_c.weft_comm_load_machine_topology())

# ---- handles -----------------------------------------------------------------------------


class Handle:
    """A nonblocking op in flight: poll() it, then synchronize() (or wait()) for its result.

    Dropping a handle early is safe: the op completes in the background and keeps its
    arrays alive until then."""

    __slots__ = ("_request", "_result", "_kind", "_gather", "_target", "_done")

    def __init__(self, request, result, kind, gather=False, target=None):
        self._request = request
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
        _c.weft_request_wait(self._request)
        if self._gather:
            self._result = _tensors.from_capsule(
                _c.weft_request_take_output(self._request), self._kind)
        elif self._target is not None:
            self._result = _tensors.copy_back(self._target, self._result)
        request, self._request = self._request, None
        _c.weft_request_free(request)
        self._done = True
        return self._result


def _handle(handle, function):
    if not isinstance(handle, Handle):
        raise TypeError(f"{function}: expected a weft.Handle (what a *_nonblocking call "
                        f"returns), got {type(handle).__name__}")
    return handle


def poll(handle):
    """True once the op has completed (then synchronize() returns at once)."""
    if _handle(handle, "poll")._done:
        return True
    return _c.weft_request_poll(handle._request)


def synchronize(handle):
    """Waits for the op and returns its output; raises its error if it failed."""
    return _handle(handle, "synchronize")._finish()


wait = synchronize


def _start(request, keep, result, kind, gather=False, target=None):
    # The C request holds `keep` (inputs, outputs and their capsules) until the op is done,
    # whatever happens to the Python handle.
    _c.weft_py_keep_alive(request, keep)
    return Handle(request, result, kind, gather, target)

# ---- ops ---------------------------------------------------------------------------------

# The weft_status a Python exception stands for when an op is refused before weft sees it.
_REFUSAL_CODES = ((WeftError, None), (TypeError, 1), (ValueError, 1),  # noqa: F405
                  (NotImplementedError, 5), (MemoryError, 9))


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
    code = next(code for kind, code in _REFUSAL_CODES + ((Exception, 11),)
                if isinstance(error, kind))
    if code is None:
        code, message = error.status, error.message
    else:
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
    """The sum (average=False) or mean of `tensor` over all ranks, or over `ranks` only
    (a process set: only those ranks call, all with the same set, the caller among
    them; disjoint sets run independently)."""
    x, cx, kind = _prepare(tensor)
    y, cy = _empty_like(x, kind)
    _allreduce(cx, cy, average, name, ranks)
    return y


def _allreduce(cx, cy, average, name, ranks):
    if ranks is None:
        _c.weft_comm_allreduce(cx, cy, bool(average), _name(name))
    else:
        _c.weft_comm_allreduce_ranks(cx, cy, bool(average), _ranks(ranks), _name(name))


def _allreduce_nonblocking(cx, cy, average, name, ranks):
    if ranks is None:
        return _c.weft_comm_allreduce_nonblocking(cx, cy, bool(average), _name(name))
    return _c.weft_comm_allreduce_ranks_nonblocking(cx, cy, bool(average), _ranks(ranks),
                                                    _name(name))


@_refused_in_place(_c.WEFT_OP_ALLREDUCE)
def allreduce_(tensor, average=True, name=None, ranks=None):
    """In-place allreduce; returns `tensor`."""
    x, cx, _ = _prepare(tensor)
    _allreduce(cx, cx, average, name, ranks)
    return _tensors.copy_back(tensor, x)


@_refused_in_place(_c.WEFT_OP_ALLREDUCE)
def allreduce_nonblocking(tensor, average=True, name=None, ranks=None):
    x, cx, kind = _prepare(tensor)
    y, cy = _empty_like(x, kind)
    request = _allreduce_nonblocking(cx, cy, average, name, ranks)
    return _start(request, (x, cx, y, cy), y, kind)


@_refused_in_place(_c.WEFT_OP_ALLREDUCE)
def allreduce_nonblocking_(tensor, average=True, name=None, ranks=None):
    x, cx, kind = _prepare(tensor)
    request = _allreduce_nonblocking(cx, cx, average, name, ranks)
    return _start(request, (x, cx), x, kind, target=tensor if x is not tensor else None)


def _broadcast(cx, cy, root_rank, name, ranks):
    if ranks is None:
        _c.weft_comm_broadcast(cx, cy, int(root_rank), _name(name))
    else:
        _c.weft_comm_broadcast_ranks(cx, cy, int(root_rank), _ranks(ranks), _name(name))


def _broadcast_nonblocking(cx, cy, root_rank, name, ranks):
    if ranks is None:
        return _c.weft_comm_broadcast_nonblocking(cx, cy, int(root_rank), _name(name))
    return _c.weft_comm_broadcast_ranks_nonblocking(cx, cy, int(root_rank), _ranks(ranks),
                                                    _name(name))


@_refused_in_place(_c.WEFT_OP_BROADCAST)
def broadcast(tensor, root_rank, name=None, ranks=None):
    """root_rank's `tensor` on every rank, or on every rank of `ranks` (a process set, as
    for allreduce; root_rank is a rank of the world and of the set)."""
    x, cx, kind = _prepare(tensor)
    y, cy = _empty_like(x, kind)
    _broadcast(cx, cy, root_rank, name, ranks)
    return y


@_refused_in_place(_c.WEFT_OP_BROADCAST)
def broadcast_(tensor, root_rank, name=None, ranks=None):
    x, cx, _ = _prepare(tensor)
    _broadcast(cx, cx, root_rank, name, ranks)
    return _tensors.copy_back(tensor, x)


@_refused_in_place(_c.WEFT_OP_BROADCAST)
def broadcast_nonblocking(tensor, root_rank, name=None, ranks=None):
    x, cx, kind = _prepare(tensor)
    y, cy = _empty_like(x, kind)
    request = _broadcast_nonblocking(cx, cy, root_rank, name, ranks)
    return _start(request, (x, cx, y, cy), y, kind)


@_refused_in_place(_c.WEFT_OP_BROADCAST)
def broadcast_nonblocking_(tensor, root_rank, name=None, ranks=None):
    x, cx, kind = _prepare(tensor)
    request = _broadcast_nonblocking(cx, cx, root_rank, name, ranks)
    return _start(request, (x, cx), x, kind, target=tensor if x is not tensor else None)


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
    """Sends `tensor` to rank `dst`, whose recv from this rank with the same name receives
    it (unnamed: the pair's unnamed sends and receives match in call order). Only the two
    ranks call. Returns once the data has left `tensor`."""
    x, cx, _ = _prepare(tensor)
    _c.weft_comm_send(cx, _peer(dst, "send", "dst"), _name(name))


@_refused_in_place(_c.WEFT_OP_SEND, peer="dst")
def send_nonblocking(tensor, dst, name=None):
    """A Handle whose synchronize() returns None once the data has left `tensor`."""
    x, cx, kind = _prepare(tensor)
    request = _c.weft_comm_send_nonblocking(cx, _peer(dst, "send", "dst"), _name(name))
    return _start(request, (x, cx), None, kind)


def _result_kind(as_torch):
    if as_torch:
        import torch  # noqa: F401  (_tensors finds torch among the loaded modules)
        return _TORCH
    return _NUMPY


@_refused_in_place(_c.WEFT_OP_RECV, peer="src")
def recv(src, name=None, out=None, as_torch=False):
    """Receives what rank `src` sends with the same name.

    out=None: a new array of the sender's dtype and shape (NumPy; a torch.Tensor with
    as_torch=True, needed for bfloat16), allocated by weft and handed over without a
    copy. Otherwise `out` (a NumPy array or torch.Tensor) receives it in place and is
    returned; the sender's dtype and shape must be out's (an error on both ranks
    otherwise)."""
    src = _peer(src, "recv", "src")
    if out is None:
        kind = _result_kind(as_torch)
        return _tensors.from_capsule(_c.weft_comm_recv_any(src, _name(name)), kind)
    x, cx, _ = _prepare(out, "out")
    _c.weft_comm_recv(cx, src, _name(name))
    return _tensors.copy_back(out, x)


@_refused_in_place(_c.WEFT_OP_RECV, peer="src")
def recv_nonblocking(src, name=None, out=None, as_torch=False):
    """A Handle whose synchronize() returns what recv() would."""
    src = _peer(src, "recv", "src")
    if out is None:
        kind = _result_kind(as_torch)
        # Nothing of the caller's to keep alive: weft owns the output until it is taken.
        return Handle(_c.weft_comm_recv_any_nonblocking(src, _name(name)), None, kind,
                      gather=True)
    x, cx, kind = _prepare(out, "out")
    request = _c.weft_comm_recv_nonblocking(cx, src, _name(name))
    return _start(request, (x, cx), x, kind, target=out if x is not out else None)


@_refused_in_place(_c.WEFT_OP_ALLGATHER)
def allgather(tensor, name=None):
    """Every rank's `tensor` concatenated along dim 0 in rank order (dim 0 may differ)."""
    x, cx, kind = _prepare(tensor)
    return _tensors.from_capsule(_c.weft_comm_allgather(cx, _name(name)), kind)


@_refused_in_place(_c.WEFT_OP_ALLGATHER)
def allgather_nonblocking(tensor, name=None):
    x, cx, kind = _prepare(tensor)
    request = _c.weft_comm_allgather_nonblocking(cx, _name(name))
    return _start(request, (x, cx), None, kind, gather=True)


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
    """The in-neighbors' tensors (or src_ranks', in that order) concatenated along dim 0,
    self excluded. weft always checks send and receive sets; enable_topo_check is kept
    for Bluefog compatibility."""
    x, cx, kind = _prepare(tensor)
    out = _c.weft_comm_neighbor_allgather(cx, _gather_options(src_ranks, dst_ranks),
                                          _name(name))
    return _tensors.from_capsule(out, kind)


@_refused_in_place(_c.WEFT_OP_NEIGHBOR_ALLGATHER)
def neighbor_allgather_nonblocking(tensor, src_ranks=None, dst_ranks=None,
                                   enable_topo_check=True, name=None):
    x, cx, kind = _prepare(tensor)
    request = _c.weft_comm_neighbor_allgather_nonblocking(
        cx, _gather_options(src_ranks, dst_ranks), _name(name))
    return _start(request, (x, cx), None, kind, gather=True)


def _allreduce_options(self_weight, src_weights, dst_weights, enable_topo_check):
    if self_weight is None and src_weights is None and dst_weights is None:
        return None if enable_topo_check else (None, None, None, False)
    return (self_weight, src_weights, dst_weights, bool(enable_topo_check))


@_refused_in_place(_c.WEFT_OP_NEIGHBOR_ALLREDUCE)
def neighbor_allreduce(tensor, self_weight=None, src_weights=None, dst_weights=None,
                       enable_topo_check=True, name=None):
    """self_weight * x + sum_j src_weights[j] * (j's dst weight for this rank) * x_j.

    Without weights: the topology's receive weights (weighted topology) or the uniform
    average over self and in-neighbors. dst_weights ({rank: weight} or a list of ranks)
    makes the call dynamic: this rank sends to exactly those ranks, this call only."""
    x, cx, kind = _prepare(tensor)
    y, cy = _empty_like(x, kind)
    _c.weft_comm_neighbor_allreduce(
        cx, cy, _allreduce_options(self_weight, src_weights, dst_weights, enable_topo_check),
        _name(name))
    return y


@_refused_in_place(_c.WEFT_OP_NEIGHBOR_ALLREDUCE)
def neighbor_allreduce_nonblocking(tensor, self_weight=None, src_weights=None,
                                   dst_weights=None, enable_topo_check=True, name=None):
    x, cx, kind = _prepare(tensor)
    y, cy = _empty_like(x, kind)
    request = _c.weft_comm_neighbor_allreduce_nonblocking(
        cx, cy, _allreduce_options(self_weight, src_weights, dst_weights, enable_topo_check),
        _name(name))
    return _start(request, (x, cx, y, cy), y, kind)


def _hierarchical_options(self_weight, src_machine_weights, dst_machine_weights):
    if self_weight is None and src_machine_weights is None and dst_machine_weights is None:
        return None
    return (self_weight, src_machine_weights, dst_machine_weights)


@_refused_in_place(_c.WEFT_OP_HIERARCHICAL_NEIGHBOR_ALLREDUCE)
def hierarchical_neighbor_allreduce(tensor, self_weight=None, src_machine_weights=None,
                                    dst_machine_weights=None, enable_topo_check=False,
                                    name=None):
    """Sum inside each machine, neighbor-allreduce between machines (machine-level weights,
    keyed by machine index), broadcast back, divide by local_size()."""
    x, cx, kind = _prepare(tensor)
    y, cy = _empty_like(x, kind)
    _c.weft_comm_hierarchical_neighbor_allreduce(
        cx, cy, _hierarchical_options(self_weight, src_machine_weights, dst_machine_weights),
        _name(name))
    return y


@_refused_in_place(_c.WEFT_OP_HIERARCHICAL_NEIGHBOR_ALLREDUCE)
def hierarchical_neighbor_allreduce_nonblocking(tensor, self_weight=None,
                                                src_machine_weights=None,
                                                dst_machine_weights=None,
                                                enable_topo_check=False, name=None):
    x, cx, kind = _prepare(tensor)
    y, cy = _empty_like(x, kind)
    request = _c.weft_comm_hierarchical_neighbor_allreduce_nonblocking(
        cx, cy, _hierarchical_options(self_weight, src_machine_weights, dst_machine_weights),
        _name(name))
    return _start(request, (x, cx, y, cy), y, kind)


@_refused_in_place(_c.WEFT_OP_PAIR_GOSSIP)
def pair_gossip(tensor, target_rank, self_weight=0.5, pair_weight=0.5, name=None):
    """Both peers end with self_weight * own + pair_weight * the peer's tensor."""
    x, cx, kind = _prepare(tensor)
    y, cy = _empty_like(x, kind)
    _c.weft_comm_pair_gossip(cx, cy, int(target_rank), float(self_weight), float(pair_weight),
                             _name(name))
    return y


@_refused_in_place(_c.WEFT_OP_PAIR_GOSSIP)
def pair_gossip_nonblocking(tensor, target_rank, self_weight=0.5, pair_weight=0.5, name=None):
    x, cx, kind = _prepare(tensor)
    y, cy = _empty_like(x, kind)
    request = _c.weft_comm_pair_gossip_nonblocking(
        cx, cy, int(target_rank), float(self_weight), float(pair_weight), _name(name))
    return _start(request, (x, cx, y, cy), y, kind)


def barrier():
    _c.weft_comm_barrier()


def barrier_nonblocking():
    return Handle(_c.weft_comm_barrier_nonblocking(), None, _NUMPY)

# ---- configuration and timeline -----------------------------------------------------------


def config_get(name):
    """The value in force of a WEFT_* setting, as text."""
    return _c.weft_config_get(name)


def config_set(name, value):
    """Overrides a WEFT_* setting in this process (most are read at init())."""
    if isinstance(value, bool):
        value = "1" if value else "0"
    _c.weft_config_set(name, str(value))


def config_unset(name):
    _c.weft_config_unset(name)


def config_describe():
    """A table of every WEFT_* setting: value in force, default, description."""
    return _c.weft_config_describe()


def timeline_start(path):
    """Starts writing this rank's Chrome trace (open it in Perfetto)."""
    _c.weft_timeline_start(str(path))


def timeline_stop():
    _c.weft_timeline_stop()


def timeline_start_activity(tensor_name, activity_name):
    """Marks the start of a user activity (e.g. "forward") on tensor_name's row."""
    _c.weft_timeline_start_activity(tensor_name, activity_name)


def timeline_end_activity(tensor_name):
    _c.weft_timeline_end_activity(tensor_name)


def timeline_active():
    """Whether a timeline is being written (WEFT_TIMELINE or timeline_start)."""
    return bool(_c.weft_timeline_active())


@_contextlib.contextmanager
def timeline_context(tensor_name, activity_name):
    """with weft.timeline_context("layer1", "forward"): ..."""
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
    """Creates the window `name` over `tensor` (collective). Every rank gets one buffer per
    in-neighbor, a copy of its own tensor (or zeros). The tensor itself is the window's
    memory: win_get reads it and win_update writes it in place, so it must be a contiguous,
    writable array; weft holds a reference to it until win_free. transport: "mpi" or "ucx"
    (default: WEFT_TRANSPORT), the same on every rank. Returns True."""
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
    """Frees one window, or every window (collective). Returns True."""
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
    """Writes dst_weights[d] * tensor into each destination d's buffer for this rank
    (default: every out-neighbor, weight 1), then multiplies the local tensor (and p) by
    self_weight. One-sided: the destinations call nothing. Returns True."""
    return _win_put(_c.weft_win_put, tensor, name, self_weight, dst_weights, require_mutex)


def win_accumulate(tensor, name, self_weight=None, dst_weights=None, require_mutex=False):
    """As win_put, but adds into the destinations' buffers."""
    return _win_put(_c.weft_win_accumulate, tensor, name, self_weight, dst_weights,
                    require_mutex)


def _win_put_nonblocking(call, tensor, name, self_weight, dst_weights, require_mutex):
    x, cx, kind = _prepare(tensor)
    request = call(cx, str(name), _win_put_options(self_weight, dst_weights, require_mutex))
    return _start(request, (x, cx), True, kind)


def win_put_nonblocking(tensor, name, self_weight=None, dst_weights=None,
                        require_mutex=False):
    return _win_put_nonblocking(_c.weft_win_put_nonblocking, tensor, name, self_weight,
                                dst_weights, require_mutex)


def win_accumulate_nonblocking(tensor, name, self_weight=None, dst_weights=None,
                               require_mutex=False):
    return _win_put_nonblocking(_c.weft_win_accumulate_nonblocking, tensor, name,
                                self_weight, dst_weights, require_mutex)


def _win_get_options(src_weights, require_mutex):
    if src_weights is None and not require_mutex:
        return None
    return (src_weights, bool(require_mutex))


def win_get(name, src_weights=None, require_mutex=False):
    """Reads src_weights[j] * x_j of each source j (default: every in-neighbor, weight 1)
    into this rank's buffer for j. Returns True."""
    _c.weft_win_get(str(name), _win_get_options(src_weights, require_mutex))
    return True


def win_get_nonblocking(name, src_weights=None, require_mutex=False):
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
    """x <- self_weight * x + sum_j neighbor_weights[j] * buffer_j (default: the topology's
    receive weights if it was set weighted, else the uniform average over x and every
    buffer), in place on the window's tensor, which it returns (clone=True: a copy). reset
    zeroes the buffers used."""
    options = None
    if self_weight is not None or neighbor_weights is not None or reset or require_mutex:
        options = (self_weight, neighbor_weights, bool(reset), bool(require_mutex))
    _c.weft_win_update(str(name), options)
    return _window_tensor(name, clone)


def win_update_then_collect(name, require_mutex=False):
    """x <- x + sum of every buffer (a sum, not an average), then zeroes the buffers;
    returns the window's tensor."""
    _c.weft_win_update_then_collect(str(name), bool(require_mutex))
    return _window_tensor(name, False)


win_poll = poll
win_wait = synchronize


def get_win_version(name):
    """{in_neighbor: puts into its buffer since the last update}."""
    return _c.weft_win_version(max(size(), 1), str(name))


def win_associated_p(name):
    """The scalar p that follows the window's weights (push-sum); starts at 1."""
    return _c.weft_win_associated_p(str(name))


def turn_on_win_ops_with_associated_p():
    """win_update and a put's self_weight also apply to p, for every window (weft's
    default; weft.torch.init() turns it off, as Bluefog starts)."""
    _c.weft_win_set_associated_p_ops(1)


def turn_off_win_ops_with_associated_p():
    """p stays as it is whatever the window ops do."""
    _c.weft_win_set_associated_p_ops(0)


def win_associated_p_ops():
    return bool(_c.weft_win_associated_p_ops())


def win_names():
    return sorted(_windows)


@_contextlib.contextmanager
def win_mutex(name, for_self=False, ranks=None):
    """with weft.win_mutex(name, ranks=[0]): ... holds those ranks' window mutexes (default:
    this rank's out-neighbors; for_self=True: this rank's own)."""
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
    # Bluefog programs reach the optimizers as bf.DistributedAdaptWithCombineOptimizer with
    # `import weft as bf`; they live in weft.torch, which needs torch.
    if name in _TORCH_NAMES:
        import importlib

        return getattr(importlib.import_module(".torch", __name__), name)
    raise AttributeError(f"module 'weft' has no attribute {name!r}")
