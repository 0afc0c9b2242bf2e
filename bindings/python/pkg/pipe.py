"""weft.pipe: elastic pipelining's pure computations (pipe/README.md), over the C ABI
(weft_pipe_* in weft.h).

- AutoFreeze: freeze_bound, next_frozen (the schedule, or the gradient-aware policy fed by
  a GradNormAccumulator);
- load balancing: parameter_costs, partition (optimal, greedy or even contiguous stages);
- AutoPipe/AutoDP: make_plan gives the pipeline length K, the partition, the replica count
  and each rank's role, and (from the previous plan) the ranks that become active;
- schedule_bubble: the idle fraction of a GPipe or 1F1B micro-batch schedule;
- Trainer: trains a TorchScript model (torch.jit.save of a scripted nn.Sequential) with
  elastic pipelining (weft_pipe_trainer_*): AutoFreeze, AutoPipe, AutoDP, AutoCache.

Layers are indexed from 0, and a frozen count F means layers 0 .. F-1 are frozen. Except for
Trainer (collective, after weft.init()), nothing here needs weft.init() or communicates:
every rank computes the same answers. Invalid arguments raise weft.InvalidArgumentError (a
ValueError) with weft's explanation.
"""

import collections
import dataclasses
import math
import operator
import os

from . import lowlevel as _c
from . import _tensors
from ._errors import InvalidArgumentError

_t = None  # weft.trainer_lowlevel, imported with the first Trainer (it loads LibTorch)


def _trainer_module():
    from . import _errors, trainer_lowlevel
    trainer_lowlevel.weft_py_set_error_factory(_errors.make_error)
    return trainer_lowlevel

__all__ = [
    "default_options", "freeze_bound", "next_frozen", "parameter_costs", "Partition",
    "partition", "Plan", "make_plan", "schedule_bubble", "GradNormAccumulator", "STRATEGIES",
    "SCHEDULES", "Trainer", "EpochMetrics", "PlanInfo", "OPTIMIZERS", "LOSSES",
]



def _set(**converters_and_values):
    """The options a caller set, converted: name -> (converter, value); None values are
    left out, so that the library's own defaults (weft_pipe_*_options_init) apply."""
    return {name: convert(value) for name, (convert, value) in converters_and_values.items()
            if value is not None}


def default_options(kind):
    """The library's defaults for the options of "plan" (make_plan), "freeze"
    (next_frozen) or "trainer" (Trainer), as a dict; enums are their C values (see
    STRATEGIES, SCHEDULES, OPTIMIZERS, LOSSES). An option passed as None, or not at all,
    takes these.

    >>> weft.pipe.default_options("plan")["k0"]
    8
    """
    if kind == "plan":
        return _c.weft_py_plan_defaults()
    if kind == "freeze":
        return _c.weft_py_freeze_defaults()
    if kind == "trainer":
        global _t
        if _t is None:
            _t = _trainer_module()
        return _t.weft_py_trainer_defaults()
    raise ValueError(f"default_options: kind must be 'plan', 'freeze' or 'trainer', got {kind!r}")

STRATEGIES = {
    "optimal": _c.WEFT_PIPE_STRATEGY_OPTIMAL,  # minimize the largest stage; no empty stage
    "greedy": _c.WEFT_PIPE_STRATEGY_GREEDY,  # PipeTransformer's walk, for comparison
    "even": _c.WEFT_PIPE_STRATEGY_EVEN,  # equal layer counts
}
SCHEDULES = {"gpipe": _c.WEFT_PIPE_SCHEDULE_GPIPE, "1f1b": _c.WEFT_PIPE_SCHEDULE_1F1B}


def _invalid(message):
    return InvalidArgumentError(_c.WEFT_ERR_INVALID_ARGUMENT, message)


def _int(value, function, name, bits=32, signed=True):
    """An integer argument that the C field holds (a larger one would wrap in C): a C int
    by default, else an int64 or uint64 (bits=64)."""
    value = operator.index(value)
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1)) if signed else (0, 2 ** bits)
    if not low <= value < high:
        kind = "a C int" if bits == 32 and signed else f"{'an int' if signed else 'a uint'}{bits}"
        raise _invalid(f"{function}: {name} = {value} does not fit {kind}")
    return value


def _floats(values, function, name):
    try:
        return [float(v) for v in values]
    except TypeError:
        raise TypeError(f"{function}: {name} must be a sequence of numbers, got "
                        f"{type(values).__name__}") from None


def _choice(value, table, function, name):
    try:
        return table[value]
    except (KeyError, TypeError):
        raise _invalid(f"{function}: {name} is {value!r}; expected one of "
                       f"{', '.join(repr(k) for k in table)}") from None


# ---- AutoFreeze ----------------------------------------------------------------------------


def freeze_bound(layers, alpha, t):
    """The AutoFreeze schedule's bound after freeze point t: ceil(L (1 - (1 - alpha)^t)).

    Exact at integers (L = 8, alpha = 1/2, t = 1 gives 4).

    Parameters
    ----------
    layers : int
        L, at least 1.
    alpha : float
        The freeze rate, in (0, 1].
    t : int
        The freeze point, at least 0.

    Returns
    -------
    int
        How many leading layers the schedule allows frozen.

    Raises
    ------
    InvalidArgumentError
        An argument is out of its range.

    Examples
    --------
    >>> weft.pipe.freeze_bound(8, 0.5, 1)
    4
    """
    return _c.weft_pipe_freeze_bound(_int(layers, "freeze_bound", "layers"), float(alpha),
                                     _int(t, "freeze_bound", "t"))


def next_frozen(layers, t, previous, grad_norms=None, alpha=None, gradient_aware=None,
                freeze_last=None):
    """The frozen count after freeze point t, given the count before it (`previous`).

    The schedule: the bound of freeze_bound(layers, alpha, t). gradient_aware: at most 1 +
    the trainable layer (index >= previous) whose accumulated gradient norm is the smallest
    (grad_norms: one per layer, e.g. GradNormAccumulator.take()). Never below previous
    (layers never unfreeze) and, unless freeze_last, at most layers - 1 (the head keeps
    training).

    Parameters
    ----------
    layers : int
        The number of layers.
    t : int
        The freeze point.
    previous : int
        The frozen count before it.
    grad_norms : sequence of float, optional
        One accumulated gradient norm per layer; used with gradient_aware.
    alpha : float, optional
        The freeze rate (default 1/3).
    gradient_aware : bool, optional
        Use the gradient-aware policy (default False: the schedule alone).
    freeze_last : bool, optional
        Allow freezing the last layer too (default False).

    Returns
    -------
    int
        The new frozen count F: layers 0 .. F-1 are frozen.

    Raises
    ------
    InvalidArgumentError
        An argument is out of range, or grad_norms is missing or has the wrong length
        where the policy needs it.

    Examples
    --------
    >>> frozen = weft.pipe.next_frozen(12, t=1, previous=0)
    """
    fn = "next_frozen"
    norms = None if grad_norms is None else _floats(grad_norms, fn, "grad_norms")
    options = _set(alpha=(float, alpha), gradient_aware=(bool, gradient_aware),
                   freeze_last=(bool, freeze_last))
    return _c.weft_pipe_next_frozen(_int(layers, fn, "layers"), _int(t, fn, "t"),
                                    _int(previous, fn, "previous"), norms, options)


class GradNormAccumulator:
    """Per-group gradient norms summed over a freeze interval, for next_frozen.

    They feed the gradient-aware policy (the C++ accumulator is LibTorch-only; this is its
    pure-Python twin).

    groups: one entry per layer group, each an nn.Module, a parameter, or a list of
    modules and parameters. Call add() once per iteration after backward (after any
    gradient synchronization, before the optimizer zeroes the gradients): each group's
    gradient L2 norm, sqrt(sum over its parameters of ||grad||^2) in double precision, is
    added to its running sum (parameters without a gradient are skipped; a group with none
    adds 0). take() returns the sums and starts a new interval:

        norms = weft.pipe.GradNormAccumulator([model.embed, *model.blocks, model.head])
        ...  loss.backward(); norms.add(); optimizer.step()
        frozen = weft.pipe.next_frozen(len(norms), t, frozen, norms.take(),
                                       gradient_aware=True)
    """

    __slots__ = ("_groups", "_sums", "_iterations")

    def __init__(self, groups):
        self._groups = [self._parameters(g, k) for k, g in enumerate(groups)]
        self._sums = [0.0] * len(self._groups)
        self._iterations = 0

    @staticmethod
    def _parameters(group, k):
        import torch

        items = [group] if isinstance(group, (torch.nn.Module, torch.Tensor)) else group
        params = []
        try:
            for item in items:
                if isinstance(item, torch.nn.Module):
                    params.extend(item.parameters())
                elif isinstance(item, torch.Tensor):
                    params.append(item)
                else:
                    raise TypeError
        except TypeError:
            raise TypeError(f"GradNormAccumulator: group {k} must be an nn.Module, a "
                            f"parameter, or a list of them; got {type(group).__name__}") \
                from None
        return params

    @staticmethod
    def _norm(params):
        import torch

        squares = 0.0
        for p in params:
            grad = p.grad
            if grad is None:
                continue
            values = grad.coalesce().values() if grad.is_sparse else grad
            squares += float(torch.linalg.vector_norm(values.detach(), 2,
                                                      dtype=torch.float64)) ** 2
        return math.sqrt(squares)

    def add(self):
        """Add each group's current gradient norm to its sum (one iteration).

        Returns
        -------
        list of float
            This iteration's norms, one per group.

        Raises
        ------
        InvalidArgumentError
            A norm is NaN or infinite; nothing is added then.
        """
        norms = [self._norm(params) for params in self._groups]
        for k, norm in enumerate(norms):
            if not math.isfinite(norm):
                raise _invalid(f"GradNormAccumulator.add: group {k} has a non-finite gradient "
                               f"norm ({norm}); check its gradients for NaN/Inf; nothing was "
                               f"accumulated")
        for k, norm in enumerate(norms):
            self._sums[k] += norm
        self._iterations += 1
        return norms

    def take(self):
        """The sums of this interval (a list, one per group); the accumulator restarts."""
        sums, self._sums = self._sums, [0.0] * len(self._groups)
        self._iterations = 0
        return sums

    @property
    def sums(self):
        """A copy of the running sums."""
        return list(self._sums)

    @property
    def iterations(self):
        """add() calls since the last take()."""
        return self._iterations

    def __len__(self):
        return len(self._groups)

    def __repr__(self):
        return (f"<weft.pipe.GradNormAccumulator: {len(self._groups)} groups, "
                f"{self._iterations} iterations>")


# ---- load balancing ------------------------------------------------------------------------


def parameter_costs(sizes, frozen=0, lam=None):
    """Per-layer costs from parameter counts, frozen layers discounted.

    A trainable layer costs its count, each of the first `frozen` layers lam times it
    (frozen layers run forward only).

    Parameters
    ----------
    sizes : sequence of float
        The parameter count of each layer.
    frozen : int, optional
        Leading layers frozen (default 0).
    lam : float, optional
        The relative cost of a frozen layer (default 1/6).

    Returns
    -------
    list of float
        One cost per layer.

    Examples
    --------
    >>> weft.pipe.parameter_costs([6, 6, 6], frozen=1)
    [1.0, 6.0, 6.0]
    """
    sizes = _floats(sizes, "parameter_costs", "sizes")
    return _c.weft_pipe_parameter_costs(len(sizes), sizes,
                                        _int(frozen, "parameter_costs", "frozen"),
                                        float(_c.weft_py_plan_defaults()["lambda"]
                                              if lam is None else lam))


class Partition:
    """Layers in contiguous stages, as partition returns them.

    Stage s holds layers boundaries[s] .. boundaries[s+1]-1 (len(boundaries) == stages +
    1); stage_costs[s] is its cost, max_cost the largest.
    """

    __slots__ = ("boundaries", "stage_costs", "max_cost")

    def __init__(self, boundaries, stage_costs, max_cost):
        self.boundaries = list(boundaries)
        self.stage_costs = list(stage_costs)
        self.max_cost = max_cost

    @property
    def num_stages(self):
        """The number of stages: len(boundaries) - 1."""
        return len(self.boundaries) - 1

    def stages(self):
        """The layers of each stage, as ranges."""
        b = self.boundaries
        return [range(b[s], b[s + 1]) for s in range(len(b) - 1)]

    def __eq__(self, other):
        if not isinstance(other, Partition):
            return NotImplemented
        return (self.boundaries, self.stage_costs, self.max_cost) == \
            (other.boundaries, other.stage_costs, other.max_cost)

    def __repr__(self):
        return (f"Partition(boundaries={self.boundaries}, stage_costs={self.stage_costs}, "
                f"max_cost={self.max_cost})")


def partition(costs, stages, strategy="optimal"):
    """Partition the layers (one cost each) into `stages` contiguous stages.

    Parameters
    ----------
    costs : sequence of float
        One cost per layer (see parameter_costs).
    stages : int
        The number of stages.
    strategy : {"optimal", "greedy", "even"}, optional
        "optimal" (the default: minimizes the largest stage, never an empty stage, the
        lexicographically smallest boundaries among the optimal ones), "greedy" (the
        PipeTransformer walk, which may leave stages empty) or "even" (equal layer
        counts).

    Returns
    -------
    Partition

    Raises
    ------
    InvalidArgumentError
        `stages` or a cost is invalid, or `strategy` is unknown.

    Examples
    --------
    >>> weft.pipe.partition([1, 1, 2], 2)
    Partition(boundaries=[0, 2, 3], stage_costs=[2.0, 2.0], max_cost=2.0)
    """
    fn = "partition"
    costs = _floats(costs, fn, "costs")
    stages = _int(stages, fn, "stages")
    code = _choice(strategy, STRATEGIES, fn, "strategy")
    # stages + 1 boundaries when stages is valid; weft rejects it otherwise.
    boundaries, max_cost = _c.weft_pipe_partition(max(stages + 1, 0), costs, stages, code)
    stage_costs = [math.fsum(costs[boundaries[s]:boundaries[s + 1]])
                   for s in range(len(boundaries) - 1)]
    return Partition(boundaries, stage_costs, max_cost)


# ---- AutoPipe/AutoDP plans -----------------------------------------------------------------


class Plan:
    """An AutoPipe/AutoDP plan; make_plan makes one.

    It holds the pipeline length k, the partition of every layer (frozen ones at lam) into
    k stages, the replicas, and each rank's role. A plan is immutable; its values are read
    once when it is made.
    """

    __slots__ = ("_ptr", "_info", "_boundaries", "_stage_costs", "_newly_active", "_roles")

    def __init__(self, ptr):
        self._ptr = ptr
        self._info = _c.weft_pipe_plan_get_info(ptr)
        k, world = self._info[1], self._info[4]
        self._boundaries = _c.weft_pipe_plan_boundaries(k + 1, ptr)
        self._stage_costs = _c.weft_pipe_plan_stage_costs(k, ptr)
        self._newly_active = _c.weft_pipe_plan_newly_active(world, ptr)
        self._roles = [tuple(_c.weft_pipe_plan_role(ptr, r)) for r in range(world)]

    def __del__(self):
        ptr = getattr(self, "_ptr", None)
        if ptr is not None:
            self._ptr = None
            _c.weft_pipe_plan_destroy(ptr)

    @property
    def frozen(self):
        """Leading layers frozen."""
        return self._info[0]

    @property
    def k(self):
        """The pipeline length (stages per replica)."""
        return self._info[1]

    @property
    def replicas(self):
        """Pipeline replicas (data-parallel width)."""
        return self._info[2]

    @property
    def micro_batches(self):
        """Micro-batches per mini-batch of the pipeline."""
        return self._info[3]

    @property
    def world(self):
        """Ranks (devices) of the cluster: machines * devices_per_machine."""
        return self._info[4]

    @property
    def m0(self):
        """The largest stage of the initial partition: what one device holds."""
        return self._info[5]

    @property
    def max_cost(self):
        """The largest stage of this plan's partition."""
        return self._info[6]

    @property
    def boundaries(self):
        """k + 1 entries: stage s holds layers boundaries[s] .. boundaries[s+1]-1."""
        return list(self._boundaries)

    @property
    def stage_costs(self):
        """The cost of each of the k stages."""
        return list(self._stage_costs)

    @property
    def newly_active(self):
        """Ranks (sorted) that this plan makes active and the previous plan did not use.

        They are in a replica that the previous plan did not have, or were idle before:
        they receive their layers from an existing replica. Empty for an initial plan.
        """
        return list(self._newly_active)

    @property
    def roles(self):
        """(replica, stage) per rank; (-1, -1) for an idle rank."""
        return list(self._roles)

    def role(self, rank):
        """(replica, stage) of `rank`, (-1, -1) when idle.

        Parameters
        ----------
        rank : int
            A rank in [0, world).

        Returns
        -------
        tuple of (int, int)

        Raises
        ------
        InvalidArgumentError
            `rank` is outside [0, world).
        """
        return tuple(_c.weft_pipe_plan_role(self._ptr, _int(rank, "Plan.role", "rank")))

    def stages(self):
        """The layers of each stage, as ranges."""
        b = self._boundaries
        return [range(b[s], b[s + 1]) for s in range(self.k)]

    def replica_ranks(self, replica):
        """The ranks of `replica`, by stage."""
        ranks = [-1] * self.k
        for rank, (r, s) in enumerate(self._roles):
            if r == replica:
                ranks[s] = rank
        return ranks

    def __repr__(self):
        return (f"<weft.pipe.Plan: frozen={self.frozen}, k={self.k}, "
                f"replicas={self.replicas}, micro_batches={self.micro_batches}, "
                f"boundaries={self._boundaries}, newly_active={self._newly_active}>")


def make_plan(sizes, frozen=0, machines=None, devices_per_machine=None, k0=None, lam=None,
              strategy=None, micro_batches=None, previous=None):
    """Make the AutoPipe/AutoDP plan for `frozen` leading layers frozen.

    The model's layers have `sizes` parameters; the cluster has machines *
    devices_per_machine devices.

    previous None: the initial plan, K = k0 (M0, the largest stage of the optimal
    partition of all layers on k0 stages, stands for what a device holds). Otherwise K
    starts from previous.k and halves while the balanced partition on K/2 stages still fits
    under M0; the freed devices host more replicas (their ranks are newly_active). Pass the
    same sizes and options for every plan of a run. micro_batches 0 means 4 K.

    Parameters
    ----------
    sizes : sequence of float
        The parameter count of each layer.
    frozen : int, optional
        Leading layers frozen (default 0).
    machines, devices_per_machine : int, optional
        The cluster (default 1 machine of 8 devices).
    k0 : int, optional
        The initial pipeline length (default 8).
    lam : float, optional
        The relative cost of a frozen layer (default 1/6).
    strategy : {"optimal", "greedy", "even"}, optional
        As for partition.
    micro_batches : int, optional
        Micro-batches per mini-batch; 0 (the default): 4 K.
    previous : Plan, optional
        The previous plan of the run; None: the initial plan.

    Returns
    -------
    Plan

    Raises
    ------
    InvalidArgumentError
        An argument is out of range.
    TypeError
        `previous` is not a Plan.

    Examples
    --------
    >>> plan = weft.pipe.make_plan([1e6] * 16, devices_per_machine=8, k0=8)
    >>> plan = weft.pipe.make_plan([1e6] * 16, frozen=12, previous=plan)
    >>> plan.k, plan.replicas, plan.newly_active
    (4, 2, [4, 5, 6, 7])
    """
    fn = "make_plan"
    if previous is not None and not isinstance(previous, Plan):
        raise TypeError(f"{fn}: previous must be a weft.pipe.Plan or None, got "
                        f"{type(previous).__name__}")
    sizes = _floats(sizes, fn, "sizes")
    options = _set(machines=(lambda v: _int(v, fn, "machines"), machines),
                   devices_per_machine=(lambda v: _int(v, fn, "devices_per_machine"),
                                        devices_per_machine),
                   k0=(lambda v: _int(v, fn, "k0"), k0), **{"lambda": (float, lam)},
                   strategy=(lambda v: _choice(v, STRATEGIES, fn, "strategy"), strategy),
                   micro_batches=(lambda v: _int(v, fn, "micro_batches"), micro_batches))
    ptr = _c.weft_pipe_plan_create(sizes, _int(frozen, fn, "frozen"), options,
                                   None if previous is None else previous._ptr)
    return Plan(ptr)


def schedule_bubble(kind, stages, micro_batches):
    """The idle fraction and length of a GPipe or 1F1B micro-batch schedule.

    (bubble, cycles) of a micro-batch schedule, kind "gpipe" (fill-drain) or "1f1b",
    with unit time per forward and backward: bubble = (K - 1) / (M + K - 1), the idle
    fraction of the stage-slots, and cycles = 2 (M + K - 1), its length in clock cycles.

    Parameters
    ----------
    kind : {"gpipe", "1f1b"}
    stages : int
        K.
    micro_batches : int
        M.

    Returns
    -------
    tuple of (float, int)
        (bubble, cycles).

    Raises
    ------
    InvalidArgumentError
        `kind` is unknown, or stages or micro_batches is below 1.

    Examples
    --------
    >>> weft.pipe.schedule_bubble("gpipe", 4, 12)
    (0.2, 30)
    """
    fn = "schedule_bubble"
    bubble, cycles = _c.weft_pipe_schedule_bubble(_choice(kind, SCHEDULES, fn, "kind"),
                                                  _int(stages, fn, "stages"),
                                                  _int(micro_batches, fn, "micro_batches"))
    return bubble, cycles


# ---- the elastic pipeline trainer ----------------------------------------------------------

# weft/trainer.h's enum values, written out so that importing weft.pipe does not load the
# trainer's library (a test checks them against trainer_lowlevel).
OPTIMIZERS = {
    "sgd": 0,  # WEFT_PIPE_OPTIMIZER_SGD: lr, momentum, weight_decay
    "adam": 1,  # WEFT_PIPE_OPTIMIZER_ADAM: lr, weight_decay (L2 in the gradient)
    "adamw": 2,  # WEFT_PIPE_OPTIMIZER_ADAMW: lr, weight_decay (decoupled)
}
LOSSES = {
    "cross_entropy": 0,  # WEFT_PIPE_LOSS_CROSS_ENTROPY: logits [N, C], class indices [N]
    "mse": 1,  # WEFT_PIPE_LOSS_MSE: targets shaped like the outputs
}


@dataclasses.dataclass(frozen=True)
class EpochMetrics:
    """What Trainer.train_epoch reports about one epoch.

    The configuration it trained with (frozen, k, replicas, micro_batches), its
    throughput, and the transition at its end (transitioned; the next_* and transition_*
    fields are 0 when none ran). line is the machine-readable "PIPE epoch=..." line, which
    also has the per-stage layers and costs and the newly active ranks.
    """

    epoch: int
    frozen: int
    k: int
    replicas: int
    micro_batches: int
    bubble_fraction: float
    train_seconds: float
    samples: int
    samples_per_second: float
    loss: float
    syncs_per_second: float
    cache_hit_rate: float
    transitioned: bool
    next_frozen: int
    next_k: int
    next_replicas: int
    transition_seconds: float
    transition_bytes: int
    line: str


PlanInfo = collections.namedtuple(
    "PlanInfo", ["frozen", "k", "replicas", "micro_batches", "world", "m0", "max_cost"])
PlanInfo.__doc__ = "The trainer's current plan: what the next epoch trains with."


class Trainer:
    """Elastic pipeline training of a TorchScript model (pipe/runtime's ElasticTrainer).

    path: a file written by torch.jit.save of a module whose children, in order, are the
    layers (each child's forward takes and returns one tensor):

        model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), ...)
        torch.jit.save(torch.jit.script(model), "model.pt")
        trainer = weft.pipe.Trainer("model.pt", alpha=0.5, batch_size=32, lr=1e-2)
        for epoch in range(epochs):
            m = trainer.train_epoch(x, y)   # x: [N, ...] floats, y: [N] class indices
            print(m.line)
        accuracy = trainer.evaluate(x_test, y_test)

    Collective: every rank makes the trainer and calls each method, after weft.init(),
    passing the whole data set (NumPy arrays or CPU torch tensors, dim 0 = samples; not
    copied unless they need another dtype). The model's parameters start from rank 0's
    (the trained ones are in weft's copy, not in the file). Options left out, or None,
    take the library's defaults (default_options("trainer")):
    k0 (0: min(world, layers)), freeze, alpha, gradient_aware, freeze_every_epochs,
    autopipe, autodp, cache, cache_dir, schedule ("gpipe" or "1f1b"), micro_batches (0: 2
    K), batch_size (over all replicas), seed, optimizer ("sgd", "adam", "adamw"), lr,
    momentum (sgd), weight_decay, loss ("cross_entropy" or "mse"), name (the op name
    prefix; two trainers alive at once need different names), decentralized (replicas
    average parameters with one peer replica per step instead of allreducing gradients).
    close() frees it (also
    `with` and garbage collection)."""

    def __init__(self, path, *, k0=None, freeze=None, alpha=None, gradient_aware=None,
                 freeze_every_epochs=None, autopipe=None, autodp=None, cache=None,
                 cache_dir=None, schedule=None, micro_batches=None, batch_size=None, seed=None,
                 optimizer=None, lr=None, momentum=None, weight_decay=None, loss=None,
                 name=None, decentralized=None):
        fn = "Trainer"
        self._ptr = None
        path = os.fspath(path)
        options = _set(
            k0=(lambda v: _int(v, fn, "k0"), k0), freeze=(bool, freeze),
            alpha=(float, alpha), gradient_aware=(bool, gradient_aware),
            freeze_every_epochs=(lambda v: _int(v, fn, "freeze_every_epochs"),
                                 freeze_every_epochs),
            autopipe=(bool, autopipe), autodp=(bool, autodp), cache=(bool, cache),
            cache_dir=(os.fspath, cache_dir),
            schedule=(lambda v: _choice(v, SCHEDULES, fn, "schedule"), schedule),
            micro_batches=(lambda v: _int(v, fn, "micro_batches"), micro_batches),
            batch_size=(lambda v: _int(v, fn, "batch_size", bits=64), batch_size),
            seed=(lambda v: _int(v, fn, "seed", bits=64, signed=False), seed),
            optimizer=(lambda v: _choice(v, OPTIMIZERS, fn, "optimizer"), optimizer),
            lr=(float, lr), momentum=(float, momentum), weight_decay=(float, weight_decay),
            loss=(lambda v: _choice(v, LOSSES, fn, "loss"), loss), name=(str, name),
            decentralized=(bool, decentralized))
        global _t
        if _t is None:
            _t = _trainer_module()
        self._ptr = _t.weft_pipe_trainer_create(path, options)
        self._line = ""

    def _handle(self, method):
        if self._ptr is None:
            from ._errors import FailedPreconditionError
            raise FailedPreconditionError(_c.WEFT_ERR_FAILED_PRECONDITION,
                                          f"Trainer.{method}: the trainer was closed")
        return self._ptr

    def train_epoch(self, inputs, targets):
        """Train one epoch over (inputs, targets), then run the freeze point's transition.

        Collective: every rank calls it with the whole data set.

        Parameters
        ----------
        inputs : numpy.ndarray or torch.Tensor
            float32 or float64, dim 0 = samples.
        targets : numpy.ndarray or torch.Tensor
            int64 or int32 class indices (cross-entropy), or floats shaped like the
            outputs (mse).

        Returns
        -------
        EpochMetrics

        Raises
        ------
        FailedPreconditionError
            The trainer was closed.
        """
        ptr = self._handle("train_epoch")
        x, x_capsule, _ = _tensors.prepare(inputs, "inputs")
        y, y_capsule, _ = _tensors.prepare(targets, "targets")
        values = _t.weft_pipe_trainer_train_epoch(ptr, x_capsule, y_capsule)
        del x, y  # kept alive until weft returned
        self._line = _t.weft_pipe_trainer_last_line(
            _t.weft_pipe_trainer_last_line(0, ptr), ptr)
        values = list(values)
        values[12] = bool(values[12])
        return EpochMetrics(*values, line=self._line)

    def evaluate(self, inputs, targets):
        """The fraction of samples whose argmax output is the target.

        Collective: every rank calls it with the whole data set. For a cross-entropy
        trainer.

        Parameters
        ----------
        inputs : numpy.ndarray or torch.Tensor
            dim 0 = samples.
        targets : numpy.ndarray or torch.Tensor
            Class indices.

        Returns
        -------
        float

        Raises
        ------
        FailedPreconditionError
            The trainer was closed.
        """
        ptr = self._handle("evaluate")
        x, x_capsule, _ = _tensors.prepare(inputs, "inputs")
        y, y_capsule, _ = _tensors.prepare(targets, "targets")
        accuracy = _t.weft_pipe_trainer_evaluate(ptr, x_capsule, y_capsule)
        del x, y
        return accuracy

    @property
    def line(self):
        """The last epoch's "PIPE epoch=..." line ("" before the first)."""
        self._handle("line")
        return self._line

    @property
    def role(self):
        """This rank's (replica, stage) in the current plan; (-1, -1) when idle."""
        return tuple(_t.weft_pipe_trainer_role(self._handle("role")))

    @property
    def plan(self):
        """The current plan's PlanInfo (what the next epoch trains with)."""
        return PlanInfo(*_t.weft_pipe_trainer_get_plan_info(self._handle("plan")))

    def close(self):
        """Frees the trainer (not collective); later calls raise. Twice is fine."""
        ptr, self._ptr = getattr(self, "_ptr", None), None
        if ptr is not None:
            _t.weft_pipe_trainer_destroy(ptr)

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self._ptr is None:
            return "<weft.pipe.Trainer: closed>"
        info = self.plan
        return (f"<weft.pipe.Trainer: frozen={info.frozen}, k={info.k}, "
                f"replicas={info.replicas}>")
