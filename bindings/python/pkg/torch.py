"""weft.torch: a stand-in for bluefog.torch, and distributed optimizers over any
torch.optim optimizer.

    import torch
    import weft.torch as bf      # where a Bluefog program has: import bluefog.torch as bf

    bf.init()
    model = Net()
    bf.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = bf.DistributedAdaptWithCombineOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                  model, num_steps_per_communication=1)

Every public name of bluefog.torch is here with Bluefog's parameters and meaning: ops,
windows, process and topology queries (topologies as networkx DiGraphs), the timeline,
the optimizers and the graph helpers of bluefog.common.topology_util. Where weft differs
on purpose the difference is an error, never other numbers; bindings/python/README.md
lists them.
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

A distributed optimizer counts the model's computations (forward ones through a forward
hook on the model, backward ones through a hook on each parameter's gradient accumulator)
with weft.StepCounter, the C state machine every language shares: the J-th counted
computation since the last communicating step() launches the communication (nonblocking,
so that it overlaps the rest of the computation), and the next step() waits for it,
combines and updates (an "S"); a step() before is a plain local update (an "s"). A counted
computation after the J-th and before the S is a misuse, warned about with a
StepCountWarning (the rules: core/step_counter.h).

Op and window names are "weft.opt<k>.<parameter name>", k counting the distributed
optimizers this process constructed: every rank must construct them in the same order. The
C++ optimizers (optim/) implement the same algorithms with the same names and weights.
"""

import contextlib
import enum
import hashlib
import io
import itertools
import os
import sys
import warnings
import weakref

import torch

import weft as _weft
from ._step_counter import StepCounter

from ._bluefog import *  # noqa: F401,F403,E402  (Bluefog's ops, queries and graphs)
from ._bluefog import __all__ as _BLUEFOG_NAMES  # noqa: E402

__all__ = [
    "CommunicationType", "StepCountWarning", "DistributedAdaptWithCombineOptimizer",
    "DistributedAdaptThenCombineOptimizer", "DistributedGradientAllreduceOptimizer",
    "DistributedWinPutOptimizer", "DistributedPushSumOptimizer",
    "DistributedAllreduceOptimizer", "DistributedNeighborAllreduceOptimizer",
    "DistributedHierarchicalNeighborAllreduceOptimizer", "broadcast_parameters",
    "broadcast_optimizer_state", "allreduce_parameters", "consensus_distance",
] + list(_BLUEFOG_NAMES)


class CommunicationType(enum.Enum):
    """How adapt-with-combine and adapt-then-combine combine the parameters.

    neighbor_allreduce (over the topology), hierarchical_neighbor_allreduce (between
    machines), allreduce (the global average) or empty (no communication: local training).
    """
    neighbor_allreduce = "neighbor.allreduce"
    hierarchical_neighbor_allreduce = "hierarchical.neighbor.allreduce"
    allreduce = "allreduce"
    empty = "empty"  # no communication: local training


class StepCountWarning(UserWarning):
    """A warning: a counted computation came after the J-th, before the communicating step().

    The training loop and num_steps_per_communication disagree. Emitted once per occurrence,
    even from the same line (Python's "default" filter would otherwise show a repeated
    message only once per location); "ignore" and "error" filters apply as usual."""


# k of "weft.opt<k>.": the optimizers this process constructed, in order.
_optimizer_ids = itertools.count()

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _warn_misuse(message):
    # Attributed to the user's frame that ran the forward or backward (hooks run deep inside
    # torch), and shown for every occurrence: warn_explicit without a registry does not
    # remember that this location already warned.
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith((_PACKAGE_DIR,
                                                                     _TORCH_DIR)):
        frame = frame.f_back
    if frame is None:
        warnings.warn_explicit(message, StepCountWarning, "<weft>", 0, module="weft.torch")
        return
    warnings.warn_explicit(message, StepCountWarning, frame.f_code.co_filename,
                           frame.f_lineno, module=frame.f_globals.get("__name__"),
                           module_globals=frame.f_globals)


def _communication_type(value):
    if isinstance(value, CommunicationType):
        return value
    for member in CommunicationType:
        if value in (member.name, member.value):
            return member
    raise ValueError(f"communication_type must be a weft.torch.CommunicationType "
                     f"({', '.join(m.name for m in CommunicationType)}), got {value!r}")


def _parameters_hash(named):
    description = ";".join(f"{name}:{tuple(p.shape)}:{p.dtype}" for name, p in named)
    digest = hashlib.sha256(description.encode()).digest()
    return int.from_bytes(digest[:8], "little", signed=True)


def _check_same_parameters(named, prefix, what):
    """Collective: every rank has the same trainable parameters (names, shapes, dtypes);
    else ValueError on every rank."""
    mine = torch.tensor([_parameters_hash(named)], dtype=torch.int64)
    hashes = _weft.allgather(mine, name=prefix + ".check").tolist()  # as the C++ optimizers
    disagreeing = [r for r, h in enumerate(hashes) if h != hashes[0]]
    if not disagreeing:
        return
    shown = ", ".join(f"{name} {tuple(p.shape)} {str(p.dtype).replace('torch.', '')}"
                      for name, p in named[:4])
    more = f", ... ({len(named)} in all)" if len(named) > 4 else ""
    raise ValueError(
        f"{what}: the trainable parameters (names, shapes, dtypes) differ across ranks: "
        f"rank{'s' if len(disagreeing) > 1 else ''} {disagreeing} "
        f"disagree{'s' if len(disagreeing) == 1 else ''} with rank 0. Every rank must build "
        f"the same model. This rank ({_weft.rank()}) has: {shown or 'none'}{more}")


def _hook_caller(ref, method, *bound):
    # Hooks hold the optimizer weakly: a dropped optimizer stops counting.
    def hook(*unused):
        optimizer = ref()
        if optimizer is not None:
            getattr(optimizer, method)(*bound)
    return hook


class _DistributedOptimizer(torch.optim.Optimizer):
    """The common part: counting, hooks, delegation to the wrapped optimizer.

    Subclasses say what they count (_COUNTS), and implement _launch(indices) (start the
    communication of those parameters, recording self._pending[i]) and _install() (wait
    for every launched op and install its result); the local update follows unless
    _UPDATE_AFTER_INSTALL is False (it then happened at launch)."""

    _COUNTS = "forward"
    _UPDATE_AFTER_INSTALL = True

    def __init__(self, optimizer, model, num_steps_per_communication):
        # No torch.optim.Optimizer.__init__: param_groups, state and defaults are the
        # wrapped optimizer's (properties below), so that isinstance checks (LR schedulers)
        # pass and both objects always agree.
        self.__dict__["optimizer"] = optimizer
        self._hook_handles = []
        self._grad_accumulators = []  # AccumulateGrad nodes: hooks live as long as they do
        self._pending = {}  # parameter index -> what _launch recorded
        self._closed = False
        self._synchronized = False  # synchronize() installed this round's results
        self._timeline = False
        what = type(self).__name__
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"{what}: expected a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        if isinstance(optimizer, _DistributedOptimizer):
            raise TypeError(f"{what}: the optimizer is already a distributed optimizer")
        # As in Bluefog, `model` may also be a list of models trained together (say a
        # generator and a discriminator): each model's forward computations are counted for
        # its own parameters.
        models = list(model) if isinstance(model, (list, tuple)) else [model]
        if not models or not all(isinstance(m, torch.nn.Module) for m in models):
            raise TypeError(f"{what}: expected the model as a torch.nn.Module or a non-empty "
                            f"list of them, got {type(model).__name__}")
        self._id = next(_optimizer_ids)  # before anything can fail: the same k everywhere
        self._prefix = f"weft.opt{self._id}"
        self.model = model
        self._models = models
        self._named = []
        self._model_params = []  # per model: the indices into _named of its parameters
        seen = {}
        for k, m in enumerate(models):
            mine = []
            for name, p in m.named_parameters():
                if not p.requires_grad:
                    continue
                if id(p) not in seen:  # a parameter shared by two models is one unit
                    seen[id(p)] = len(self._named)
                    self._named.append((name if len(models) == 1 else f"{k}.{name}", p))
                mine.append(seen[id(p)])
            self._model_params.append(mine)
        self._names = [f"{self._prefix}.{name}" for name, _ in self._named]
        units = len(self._named) if self._COUNTS == "backward" else len(models)
        # Validates J (InvalidArgumentError, a ValueError) before any collective.
        self._counter = StepCounter(num_steps_per_communication, self._COUNTS, max(units, 1))
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for name, p in self._named:
            if id(p) not in held:
                raise ValueError(f"{what}: the wrapped optimizer does not hold the model's "
                                 f"trainable parameter {name} {list(p.shape)}; build it from "
                                 f"model.parameters()")
        _check_same_parameters(self._named, self._prefix, what)
        if not self._named:
            raise ValueError(f"{what}: the model has no parameter that requires grad: there "
                             f"is nothing to train or communicate")
        # Per-round weights, None: the topology's defaults. Set before a round's counted
        # computations (e.g. from a dynamic schedule); they are read when it launches.
        self.self_weight = None
        self.src_weights = None
        self.dst_weights = None
        self.src_machine_weights = None
        self.dst_machine_weights = None
        self._setup()
        self._register_hooks()

    # -- what a subclass provides --
    def _setup(self):
        pass

    def _launch(self, indices):
        raise NotImplementedError

    def _install(self):
        raise NotImplementedError

    # -- counting --
    def _register_hooks(self):
        ref = weakref.ref(self)
        if self._COUNTS == "forward":
            for k, m in enumerate(self._models):
                self._hook_handles.append(
                    m.register_forward_hook(_hook_caller(ref, "_on_forward", k)))
            return
        with torch.enable_grad():
            for i, (_, p) in enumerate(self._named):
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                self._hook_handles.append(
                    accumulator.register_hook(_hook_caller(ref, "_on_backward", i)))
                self._grad_accumulators.append(accumulator)

    def _on_forward(self, k):
        # As Bluefog's hooks, a model in eval mode is not training: its forward passes (a
        # test loop without torch.no_grad()) neither count nor communicate.
        counted = (torch.is_grad_enabled() and self._models[k].training and
                   any(self._named[i][1].requires_grad for i in self._model_params[k]))
        self._on_event(k, self._counter.computation(k, counted))

    def _on_backward(self, index):
        # Runs after the parameter's gradient was accumulated.
        self._on_event(index, self._counter.computation(index, True))

    def _on_event(self, unit, event):
        if event == "communicate":
            if self._COUNTS == "backward":
                self._launch([unit])
            else:  # a parameter shared by two models is launched by the first to count down
                self._launch([i for i in self._model_params[unit] if i not in self._pending])
        elif event == "misuse":
            _warn_misuse(self._counter.misuse_warning)

    # -- the optimizer --
    def step(self, closure=None):
        """Take an optimizer step: communicate and update (an S), or update locally (an s).

        An S (the counter's countdown reached 0 since the last S): launch what was not
        launched (every rank communicates every parameter), wait for everything, combine
        and update. An s: a local update.

        Parameters
        ----------
        closure : callable, optional
            Re-evaluates the model and returns the loss; run first, with grad enabled.

        Returns
        -------
        object
            The closure's loss, or None without a closure.

        Raises
        ------
        FailedPreconditionError
            No computation was counted yet (the optimizer does not see the model's
            computations).
        RuntimeError
            The optimizer was closed.
        """
        if self._closed:
            raise RuntimeError(f"{type(self).__name__}: step() after close()")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with self._timeline_activity("STEP"):
            if self._counter.step():
                if not self._synchronized:
                    missing = [i for i in range(len(self._named)) if i not in self._pending]
                    if missing:
                        self._launch(missing)
                    try:
                        self._install()
                    finally:
                        self._pending.clear()
                self._synchronized = False
                if self._UPDATE_AFTER_INSTALL:
                    self.optimizer.step()
            else:
                self.optimizer.step()
        return loss

    def synchronize(self):
        """Wait for this round's communication and install its results, without updating.

        The results are the combined parameters, or the averaged gradients; use it e.g. to
        clip gradients in between; the next step() then only updates. Nothing to do when
        nothing is in flight."""
        if self._closed or not self._pending:
            return
        with self._timeline_activity("SYNCHRONIZE"):
            try:
                self._install()
            finally:
                self._pending.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """A context manager accepted around a step() after synchronize(); it changes nothing.

        Horovod's and Bluefog's spelling: weft never synchronizes twice, so step() inside
        it does what it does outside.
        """
        yield

    def turn_on_timeline(self):
        """Mark each step() and synchronize() as an activity on the timeline.

        Only when a timeline is being written; the row is named after this optimizer.
        """
        self._timeline = True

    def turn_off_timeline(self):
        """Stop marking step() and synchronize() on the timeline (see turn_on_timeline)."""
        self._timeline = False

    def _timeline_activity(self, activity):
        if self._timeline and _weft.timeline_active():
            return _weft.timeline_context(self._prefix, activity)
        return contextlib.nullcontext()

    def _wait(self):
        """[(index, result)] of every launched op (None for nothing launched)."""
        return [(i, None if h is None else _weft.synchronize(h))
                for i, h in sorted(self._pending.items())]

    @property
    def num_steps_per_communication(self):
        """J: counted computations per communication.

        Setting it takes effect at once when nothing was counted since the last
        communicating step(), else at the next one; a value below 1 raises ValueError.
        """
        return self._counter.steps_per_communication

    @num_steps_per_communication.setter
    def num_steps_per_communication(self, value):
        """Takes effect at once when nothing was counted since the last communicating
        step(), else at the next one. ValueError below 1."""
        self._counter.steps_per_communication = value

    @property
    def step_counter(self):
        """The weft.StepCounter deciding when this optimizer communicates."""
        return self._counter

    def close(self):
        """Wait for what is in flight and remove the hooks.

        Window optimizers also free their windows: collective. Idempotent; weft.shutdown()
        does it for windows.
        """
        if self._closed:
            return
        self._closed = True
        try:
            for h in self._pending.values():
                if h is not None and _weft.is_initialized():
                    _weft.synchronize(h)
        finally:
            self._pending.clear()
            self._remove_hooks()

    def _remove_hooks(self):
        for handle in self.__dict__.get("_hook_handles", ()):
            handle.remove()
        self.__dict__["_hook_handles"] = []
        self.__dict__["_grad_accumulators"] = []

    def __del__(self):
        try:
            self._remove_hooks()
        except Exception:  # interpreter shutdown
            pass

    # -- delegation to the wrapped optimizer --
    @property
    def param_groups(self):
        """The wrapped optimizer's param_groups (reading and setting both go to it)."""
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.optimizer.param_groups = value

    @property
    def state(self):
        """The wrapped optimizer's state (reading and setting both go to it)."""
        return self.optimizer.state

    @state.setter
    def state(self, value):
        self.optimizer.state = value

    @property
    def defaults(self):
        """The wrapped optimizer's defaults (reading and setting both go to it)."""
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value):
        self.optimizer.defaults = value

    def zero_grad(self, *args, **kwargs):
        """The wrapped optimizer's zero_grad(), with the same arguments."""
        return self.optimizer.zero_grad(*args, **kwargs)

    def state_dict(self):
        """The wrapped optimizer's state_dict(): save it to checkpoint the optimizer.

        Returns
        -------
        dict
        """
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        """Load a state_dict() into the wrapped optimizer.

        Parameters
        ----------
        state_dict : dict
            What state_dict() returned.
        """
        return self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group):
        """Add a parameter group to the wrapped optimizer.

        Its parameters are updated, but not communicated.

        Parameters
        ----------
        param_group : dict
            As for torch.optim.Optimizer.add_param_group.
        """
        # Parameters added later are updated, but not communicated.
        return self.optimizer.add_param_group(param_group)

    def __getattr__(self, name):
        optimizer = self.__dict__.get("optimizer")
        if optimizer is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(optimizer, name)

    def __getstate__(self):
        raise TypeError(f"{type(self).__name__} cannot be pickled: save "
                        f"state_dict() instead")

    def __repr__(self):
        return (f"{type(self).__name__}(J={self.num_steps_per_communication}, "
                f"{self.optimizer!r})")


# The first entries of every distributed optimizer's Parameters section.
_OPTIMIZER_AND_MODEL = """\
    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        The wrapped optimizer, built from model.parameters(): it makes the local updates,
        and its param_groups, state and defaults are the wrapper's.
    model : torch.nn.Module or list of torch.nn.Module
        The model whose computations are counted and whose trainable parameters are
        communicated; as in Bluefog, a list of models trained together (each model's
        forward computations count for its own parameters).
"""

# The Parameters, Attributes and Raises sections of the two combining optimizers, whose
# constructors take the same arguments and fail alike.
_COMBINING_SECTIONS = _OPTIMIZER_AND_MODEL + """\
    communication_type : CommunicationType or str, optional
        How the parameters are combined: neighbor_allreduce (the default),
        hierarchical_neighbor_allreduce, allreduce, or empty (no communication: local
        training); a member's name or value is accepted too.
    num_steps_per_communication : int, optional
        J, the counted computations per communication (default 1).

    Attributes
    ----------
    self_weight, src_weights, dst_weights : optional
        The weights of neighbor_allreduce for the next round; None (the default): the
        topology's. Set them before the round's counted computations.
    src_machine_weights, dst_machine_weights : optional
        The same for hierarchical_neighbor_allreduce.

    Raises
    ------
    TypeError
        `optimizer` is not a torch.optim.Optimizer (or is already a distributed one), or
        `model` is not a torch.nn.Module or a non-empty list of them.
    ValueError
        num_steps_per_communication is below 1 (weft.InvalidArgumentError), the model has
        no parameter that requires grad, the wrapped optimizer does not hold one of them,
        the trainable parameters (names, shapes, dtypes) differ across ranks (raised on
        every rank), or `communication_type` is unknown.
"""


class _CombiningOptimizer(_DistributedOptimizer):
    """Adapt-with-combine and adapt-then-combine: one communication type."""

    def __init__(self, optimizer, model, communication_type, num_steps_per_communication):
        self.__dict__["communication_type"] = _communication_type(communication_type)
        super().__init__(optimizer, model, num_steps_per_communication)

    def __setattr__(self, name, value):
        if name == "communication_type":
            value = _communication_type(value)
        super().__setattr__(name, value)

    def _combine_nonblocking(self, tensor, name):
        kind = self.communication_type
        if kind is CommunicationType.neighbor_allreduce:
            return _weft.neighbor_allreduce_nonblocking(
                tensor, self.self_weight, self.src_weights, self.dst_weights, name=name)
        if kind is CommunicationType.hierarchical_neighbor_allreduce:
            return _weft.hierarchical_neighbor_allreduce_nonblocking(
                tensor, self.self_weight, self.src_machine_weights, self.dst_machine_weights,
                name=name)
        if kind is CommunicationType.allreduce:
            return _weft.allreduce_nonblocking(tensor, average=True, name=name)
        return None  # empty

    def _install_combined(self):
        for i, result in self._wait():
            if result is not None:
                self._named[i][1].data.copy_(result)


class DistributedAdaptWithCombineOptimizer(_CombiningOptimizer):
    __doc__ = """Adapt-with-combine: x <- W x - lr * g(x), over any torch.optim optimizer.

    Counts forward computations: the J-th launches the combination of (a snapshot of) the
    parameters, overlapping the backward pass; the next step() waits, installs W x, then
    applies the local update computed from the pre-combine gradient. Construction is
    collective: every rank constructs its distributed optimizers in the same order.

""" + _COMBINING_SECTIONS + """
    Examples
    --------
    >>> import weft.torch as wt
    >>> opt = wt.DistributedAdaptWithCombineOptimizer(
    ...     torch.optim.SGD(model.parameters(), lr=0.1), model,
    ...     communication_type=wt.CommunicationType.neighbor_allreduce)
    >>> for x, y in batches:
    ...     opt.zero_grad()
    ...     loss_fn(model(x), y).backward()
    ...     opt.step()
    """

    _COUNTS = "forward"

    def __init__(self, optimizer, model,
                 communication_type=CommunicationType.neighbor_allreduce,
                 num_steps_per_communication=1):
        super().__init__(optimizer, model, communication_type, num_steps_per_communication)

    def _launch(self, indices):
        # One group: the parameters' combinations reach weft's engine together and fuse.
        with _weft.group():
            for i in indices:
                p = self._named[i][1]
                # A snapshot: nothing the training loop does before step() can race the op.
                self._pending[i] = self._combine_nonblocking(p.data.clone(), self._names[i])

    def _install(self):
        self._install_combined()


class DistributedAdaptThenCombineOptimizer(_CombiningOptimizer):
    __doc__ = """Adapt-then-combine: x <- W (x - lr * g(x)), over any torch.optim optimizer.

    Counts backward computations per parameter: in the J-th, as soon as a parameter's
    gradient is accumulated, its local update is applied (the wrapped optimizer's step()
    with every other gradient hidden) and its combination launched, overlapping the rest
    of the backward pass; the next step() waits and installs W x. Construction is
    collective.

""" + _COMBINING_SECTIONS + """
    Examples
    --------
    >>> opt = wt.DistributedAdaptThenCombineOptimizer(
    ...     torch.optim.Adam(model.parameters()), model,
    ...     communication_type=wt.CommunicationType.allreduce)
    """

    _COUNTS = "backward"
    _UPDATE_AFTER_INSTALL = False  # applied per parameter at launch

    def __init__(self, optimizer, model,
                 communication_type=CommunicationType.neighbor_allreduce,
                 num_steps_per_communication=1):
        super().__init__(optimizer, model, communication_type, num_steps_per_communication)

    def _launch(self, indices):
        for i in indices:  # one at a time, as in the gradient hooks (and the C++ optimizer)
            p = self._named[i][1]
            if p.grad is not None:
                self._masked_step([p])
            self._pending[i] = self._combine_nonblocking(p.data, self._names[i])

    def _masked_step(self, params):
        """The wrapped optimizer's step() on `params` only: every other parameter's gradient
        is None meanwhile, so that it is neither updated nor decayed."""
        if not params:
            return
        updating = {id(p) for p in params}
        hidden = []
        for group in self.optimizer.param_groups:
            for q in group["params"]:
                if id(q) not in updating and q.grad is not None:
                    hidden.append((q, q.grad))
                    q.grad = None
        try:
            self.optimizer.step()
        finally:
            for q, grad in hidden:
                q.grad = grad

    def _install(self):
        self._install_combined()  # the local updates were applied at launch


class DistributedGradientAllreduceOptimizer(_DistributedOptimizer):
    __doc__ = """Data parallelism: x <- x - lr * mean over ranks of g.

    Counts backward computations per parameter: in the J-th, each gradient's allreduce
    starts as soon as it is accumulated; the next step() waits, installs the averages and
    applies the update. Construction is collective.

""" + _OPTIMIZER_AND_MODEL + """\
    num_steps_per_communication : int, optional
        J, the counted computations per communication (default 1).

    Raises
    ------
    TypeError
        `optimizer` is not a torch.optim.Optimizer (or is already a distributed one), or
        `model` is not a torch.nn.Module or a non-empty list of them.
    ValueError
        num_steps_per_communication is below 1 (weft.InvalidArgumentError), the model has
        no parameter that requires grad, the wrapped optimizer does not hold one of them,
        or the trainable parameters (names, shapes, dtypes) differ across ranks (raised on
        every rank).

    Examples
    --------
    >>> opt = wt.DistributedGradientAllreduceOptimizer(
    ...     torch.optim.SGD(model.parameters(), lr=0.1), model)
    """

    _COUNTS = "backward"

    def __init__(self, optimizer, model, num_steps_per_communication=1):
        super().__init__(optimizer, model, num_steps_per_communication)

    def _launch(self, indices):
        for i in indices:
            p = self._named[i][1]
            # A copy: a (misused) further backward accumulating into p.grad must not race
            # the allreduce. A parameter without gradient contributes zeros.
            grad = torch.zeros_like(p.data) if p.grad is None else p.grad.detach().clone()
            self._pending[i] = _weft.allreduce_nonblocking_(grad, average=True,
                                                            name=self._names[i])

    def _install(self):
        for i, average in self._wait():
            p = self._named[i][1]
            if p.grad is None:
                p.grad = average
            else:
                p.grad.copy_(average)


class _WindowOptimizer(_DistributedOptimizer):
    """Window optimizers own one window per trainable parameter (named like the ops);
    close() frees them (collective), and weft.shutdown() frees them too."""

    def __init__(self, optimizer, model, num_steps_per_communication):
        self._windows = []
        super().__init__(optimizer, model, num_steps_per_communication)

    def _window_tensor(self, i):
        return self._named[i][1].data

    def _window_options(self):
        return {}

    def _setup(self):
        what = type(self).__name__
        for name, p in self._named:
            if not p.data.is_contiguous():
                raise ValueError(f"{what}: parameter {name} is not contiguous: a window "
                                 f"needs contiguous memory")
        try:
            for i, name in enumerate(self._names):
                _weft.win_create(self._window_tensor(i), name, **self._window_options())
                self._windows.append(name)
        except BaseException:
            self._free_windows()
            raise

    def _free_windows(self):
        windows, self._windows = self._windows, []
        for name in windows:
            if _weft.is_initialized() and name in _weft._windows:
                _weft.win_free(name)

    def close(self):
        """Wait for what is in flight, remove the hooks and free the windows.

        Collective (every rank closes); idempotent; a no-op for windows after
        weft.shutdown().
        """
        try:
            super().close()
        finally:
            self._free_windows()


class DistributedWinPutOptimizer(_WindowOptimizer):
    __doc__ = """Asynchronous training over one-sided windows: put, then update from the buffers.

    Each parameter is the memory of a window (created at construction, collective).
    Counts forward computations: the J-th puts the parameters into the out-neighbors'
    buffers (dst_weights: {rank: weight} or ranks, default every out-neighbor, weight 1);
    the next step() waits for the puts, then under the window mutex x <- self_weight * x
    + sum_j src_weights[j] * buffer_j (default: the uniform average over self and every
    in-neighbor buffer; self_weight and src_weights go together), then applies the local
    update.

    Construct it after the model is in place, and do not replace p.data afterwards. close()
    (or unregister_window()) frees the windows.

""" + _OPTIMIZER_AND_MODEL + """\
    num_steps_per_communication : int, optional
        J, the counted computations per communication (default 1).
    window_prefix : str, optional
        Windows are named "<window_prefix>.<parameter name>"; None (the default): as the
        ops, "weft.opt<k>.<parameter name>".

    Attributes
    ----------
    self_weight, src_weights, dst_weights : optional
        The weights described above, for the next round; None (the default): the
        defaults. Set them before the round's counted computations.

    Raises
    ------
    TypeError
        `optimizer` is not a torch.optim.Optimizer (or is already a distributed one), or
        `model` is not a torch.nn.Module or a non-empty list of them.
    ValueError
        num_steps_per_communication is below 1 (weft.InvalidArgumentError), the model has
        no parameter that requires grad, the wrapped optimizer does not hold one of them,
        the trainable parameters (names, shapes, dtypes) differ across ranks (raised on
        every rank), or a parameter is not contiguous (a window needs contiguous memory).

    Examples
    --------
    >>> opt = wt.DistributedWinPutOptimizer(
    ...     torch.optim.SGD(model.parameters(), lr=0.1), model)
    >>> ...                                   # train as with any optimizer
    >>> opt.close()                           # collective: frees the windows
    """

    _COUNTS = "forward"

    def __init__(self, optimizer, model, num_steps_per_communication=1, window_prefix=None):
        # Windows are named "<window_prefix>.<parameter name>" (default: as the ops).
        self.__dict__["_window_prefix"] = window_prefix
        super().__init__(optimizer, model, num_steps_per_communication)

    def _setup(self):
        if self._window_prefix is not None:
            self._names = [f"{self._window_prefix}.{name}" for name, _ in self._named]
        super()._setup()

    def unregister_window(self):
        """Frees the windows (collective): Bluefog's name for close()."""
        self.close()

    def _launch(self, indices):
        for i in indices:
            self._pending[i] = _weft.win_put_nonblocking(
                self._named[i][1].data, self._names[i], None, self.dst_weights,
                require_mutex=True)

    def _install(self):
        self._wait()
        for i, name in enumerate(self._names):
            window = _weft._windows.get(name)
            if window is None or window[0].data_ptr() != self._named[i][1].data_ptr():
                raise RuntimeError(
                    f"{type(self).__name__}: parameter {self._named[i][0]} no longer is the "
                    f"memory of window {name} (replaced, moved, or the window freed): "
                    f"construct the optimizer after the model is in place")
            _weft.win_update(name, self.self_weight, self.src_weights, require_mutex=True)


class DistributedPushSumOptimizer(_WindowOptimizer):
    __doc__ = """Push-sum, for directed (column-stochastic) mixing, over one-sided windows.

    Each parameter x has a window over a numerator x * p (buffers start at zero) whose
    associated scalar p starts at 1.
    Counts forward computations: the J-th accumulates w * [x p, p] into each destination
    (dst_weights' ranks, default every out-neighbor) and keeps w of it, with
    w = 1 / (destinations + 1); the next step() waits, collects what arrived (the sum of
    the buffers), installs x = numerator / p, then applies the local update. It turns on
    turn_on_win_ops_with_associated_p() for the process.

""" + _OPTIMIZER_AND_MODEL + """\
    num_steps_per_communication : int, optional
        J, the counted computations per communication (default 1).

    Attributes
    ----------
    dst_weights : dict or list of int, optional
        The destinations of the next round (their ranks are used; weights are uniform);
        None (the default): every out-neighbor.

    Raises
    ------
    TypeError
        `optimizer` is not a torch.optim.Optimizer (or is already a distributed one), or
        `model` is not a torch.nn.Module or a non-empty list of them.
    ValueError
        num_steps_per_communication is below 1 (weft.InvalidArgumentError), the model has
        no parameter that requires grad, the wrapped optimizer does not hold one of them,
        the trainable parameters (names, shapes, dtypes) differ across ranks (raised on
        every rank), or a parameter is not contiguous (a window needs contiguous memory).

    Examples
    --------
    >>> weft.set_topology(topology.ExponentialGraph(weft.size()))
    True
    >>> opt = wt.DistributedPushSumOptimizer(
    ...     torch.optim.SGD(model.parameters(), lr=0.1), model)
    """

    _COUNTS = "forward"

    def __init__(self, optimizer, model, num_steps_per_communication=1):
        self._numerators = []
        # Push-sum is p's reason to exist: the window ops must carry it (a process-wide
        # switch, which weft.torch.init() turns off as Bluefog starts).
        _weft.turn_on_win_ops_with_associated_p()
        super().__init__(optimizer, model, num_steps_per_communication)

    def _window_tensor(self, i):
        numerator = self._named[i][1].data.clone(memory_format=torch.contiguous_format)
        self._numerators.append(numerator)
        return numerator

    def _window_options(self):
        return {"zero_init": True}

    def _launch(self, indices):
        dst = self.dst_weights
        ranks = [int(r) for r in (_weft.out_neighbor_ranks() if dst is None else dst)]
        w = 1.0 / (len(ranks) + 1)
        for i in indices:
            name = self._names[i]
            numerator = self._numerators[i]
            numerator.copy_(self._named[i][1].data * _weft.win_associated_p(name))
            self._pending[i] = _weft.win_accumulate_nonblocking(
                numerator, name, self_weight=w, dst_weights={r: w for r in ranks},
                require_mutex=True)

    def _install(self):
        self._wait()
        for i, name in enumerate(self._names):
            _weft.win_update_then_collect(name, require_mutex=True)
            self._named[i][1].data.copy_(self._numerators[i] / _weft.win_associated_p(name))

# ---- Bluefog's deprecated spellings of adapt-with-combine ----------------------------------


def _deprecated(name, communication_type):
    def make(optimizer, model, num_steps_per_communication=1):
        warnings.warn(f"{name} is deprecated (as in Bluefog): use "
                      f"DistributedAdaptWithCombineOptimizer(..., communication_type="
                      f"CommunicationType.{communication_type.name})",
                      PendingDeprecationWarning, stacklevel=2)
        return DistributedAdaptWithCombineOptimizer(optimizer, model, communication_type,
                                                    num_steps_per_communication)
    make.__name__ = make.__qualname__ = name
    make.__doc__ = (f"Adapt-with-combine over {communication_type.value} (deprecated: "
                    f"DistributedAdaptWithCombineOptimizer says the same).")
    return make


DistributedAllreduceOptimizer = _deprecated("DistributedAllreduceOptimizer",
                                            CommunicationType.allreduce)
DistributedNeighborAllreduceOptimizer = _deprecated("DistributedNeighborAllreduceOptimizer",
                                                    CommunicationType.neighbor_allreduce)
DistributedHierarchicalNeighborAllreduceOptimizer = _deprecated(
    "DistributedHierarchicalNeighborAllreduceOptimizer",
    CommunicationType.hierarchical_neighbor_allreduce)

# ---- helpers -----------------------------------------------------------------------------


def _named_tensors(params, what):
    """[(name, tensor)] from a state_dict (sorted by name), named_parameters() pairs, or
    tensors."""
    if isinstance(params, torch.nn.Module):
        raise TypeError(f"{what}: pass model.state_dict() or model.named_parameters(), not "
                        f"the module")
    if isinstance(params, torch.Tensor):
        params = [params]
    if hasattr(params, "items"):
        items = sorted(params.items())
    else:
        items = []
        for i, entry in enumerate(params):
            if isinstance(entry, torch.Tensor):
                items.append((str(i), entry))
            elif isinstance(entry, (tuple, list)) and len(entry) == 2:
                items.append((str(entry[0]), entry[1]))
            else:
                raise TypeError(f"{what}: expected tensors or (name, tensor) pairs, got "
                                f"{type(entry).__name__}")
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}: {name} is a {type(t).__name__}, not a torch.Tensor")
    return items


def _inplace_view(t):
    data = t.detach()
    return data.view(1) if data.dim() == 0 else data


def broadcast_parameters(params, root_rank):
    """Overwrite, in place, every tensor of `params` with root_rank's. Collective.

    Parameters
    ----------
    params : dict, iterable of (str, torch.Tensor), or list of torch.Tensor
        A state_dict(), named_parameters(), or a list of tensors; the same names, shapes
        and dtypes on every rank.
    root_rank : int
        The rank whose values everyone gets.

    Raises
    ------
    TypeError
        `params` is a module (pass model.state_dict()) or holds something other than
        tensors.

    Examples
    --------
    >>> wt.broadcast_parameters(model.state_dict(), root_rank=0)
    """
    items = _named_tensors(params, "broadcast_parameters")
    with _weft.group():
        handles = [_weft.broadcast_nonblocking_(_inplace_view(t), root_rank,
                                                name=f"weft.broadcast_parameters.{i}.{name}")
                   for i, (name, t) in enumerate(items)]
    for h in handles:
        _weft.synchronize(h)


def allreduce_parameters(params):
    """Replace, in place, every floating-point tensor of `params` with its average over ranks.

    Other tensors (e.g. BatchNorm's counters) are left alone. Collective.

    Parameters
    ----------
    params : dict, iterable of (str, torch.Tensor), or list of torch.Tensor
        As for broadcast_parameters.

    Raises
    ------
    TypeError
        As for broadcast_parameters.

    Examples
    --------
    >>> wt.allreduce_parameters(model.state_dict())
    """
    items = [(name, t) for name, t in _named_tensors(params, "allreduce_parameters")
             if t.is_floating_point()]
    with _weft.group():
        handles = [_weft.allreduce_nonblocking_(_inplace_view(t), average=True,
                                                name=f"weft.allreduce_parameters.{i}.{name}")
                   for i, (name, t) in enumerate(items)]
    for h in handles:
        _weft.synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank):
    """Give every rank root_rank's optimizer state. Collective.

    The state is state_dict(): per-parameter state such as momentum buffers and steps, and
    hyperparameters; ranks whose optimizer has not stepped yet get it too. Works for any
    optimizer whose state_dict() torch.save can write.

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        A plain or a distributed optimizer; its load_state_dict() receives the state on
        the other ranks.
    root_rank : int
        The rank whose state everyone gets.

    Examples
    --------
    >>> wt.broadcast_optimizer_state(opt, root_rank=0)
    """
    root = _weft.rank() == root_rank
    payload = None
    if root:
        buffer = io.BytesIO()
        torch.save(optimizer.state_dict(), buffer)
        payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    length = torch.tensor([payload.numel() if root else 0], dtype=torch.int64)
    _weft.broadcast_(length, root_rank, name="weft.broadcast_optimizer_state.length")
    if not root:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    _weft.broadcast_(payload, root_rank, name="weft.broadcast_optimizer_state.bytes")
    if not root:
        state = torch.load(io.BytesIO(payload.numpy().tobytes()), map_location="cpu")
        optimizer.load_state_dict(state)


def consensus_distance(params):
    """How far the ranks' parameters are from their average. Collective.

    sqrt(sum over ranks i of ||x_i - mean_j x_j||^2 / size), x all the floating-point
    tensors of `params` (as in broadcast_parameters) concatenated: how far the ranks'
    parameters are from their average. The same value on every rank. Collective.

    Parameters
    ----------
    params : dict, iterable of (str, torch.Tensor), or list of torch.Tensor
        As for broadcast_parameters.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        `params` holds no floating-point tensor.

    Examples
    --------
    >>> wt.consensus_distance(model.state_dict())
    0.0123
    """
    tensors = [t.detach().reshape(-1).to(torch.float64)
               for _, t in _named_tensors(params, "consensus_distance")
               if t.is_floating_point()]
    if not tensors:
        raise ValueError("consensus_distance: no floating-point tensor given")
    x = torch.cat(tensors)
    mean = _weft.allreduce(x, average=True, name="weft.consensus_distance.mean")
    mine = torch.sum((x - mean) ** 2).reshape(1)
    # Every rank sums the same gathered values in the same order: the same result.
    squares = _weft.allgather(mine, name="weft.consensus_distance.squares")
    return float(torch.sqrt(squares.sum() / squares.numel()))
