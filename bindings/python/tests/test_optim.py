"""weft.StepCounter and weft.torch's distributed optimizers: where communication happens
(the step counter of core/step_counter.h), exact one-step formulas, convergence on a
least-squares problem with a known solution, helpers, and bad input."""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import weft
import weft.torch as wt
from weft import topology

AWC = wt.DistributedAdaptWithCombineOptimizer
ATC = wt.DistributedAdaptThenCombineOptimizer
GA = wt.DistributedGradientAllreduceOptimizer
WINPUT = wt.DistributedWinPutOptimizer
PUSHSUM = wt.DistributedPushSumOptimizer


@pytest.fixture(autouse=True)
def default_topology_and_cleanup():
    """Every test starts on the default (unweighted exponential) topology and closes the
    optimizers it made (hooks removed, windows freed) before the next one."""
    assert weft.set_topology(topology.ExponentialGraph(weft.size()))
    made = []
    yield made
    for opt in made:
        opt.close()
    assert weft.win_names() == []
    weft.barrier()


def make(made, cls, *args, **kwargs):
    opt = cls(*args, **kwargs)
    made.append(opt)
    return opt


def mixing_matrix():
    """M[j][i]: the weight rank j gives rank i's value in a default neighbor_allreduce (the
    uniform average over self and in-neighbors of the topology in force)."""
    topo, n = weft.load_topology(), weft.size()
    assert not weft.is_topo_weighted()
    m = np.zeros((n, n))
    for j in range(n):
        ins = topo.in_neighbors(j)
        for i in [j] + ins:
            m[j][i] = 1.0 / (len(ins) + 1)
    return m


def param_values(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# ---- weft.StepCounter ------------------------------------------------------------------------


def run_counter(counter, sequence):
    """Events of F (computation) and results of s/S (step) along `sequence`."""
    out = []
    for c in sequence:
        out.append(counter.computation() if c == "F" else counter.step())
    return out


def test_step_counter_admissible_and_misuse():
    for seq in ["FFFS", "FsFsFS", "FFsFS", "FsFFS"]:
        c = weft.StepCounter(3)
        events = run_counter(c, seq.replace("s", "S"))
        assert "misuse" not in events, seq
        assert events[-1] is True and events.count(True) == 1, seq  # only the last step is an S
        assert events[[i for i, x in enumerate(seq) if x == "F"][2]] == "communicate"
    c = weft.StepCounter(3, counts="forward")
    assert run_counter(c, "FFFFS") == ["counted", "counted", "communicate", "misuse", True]
    assert "number 4" in c.misuse_warning and "num_steps_per_communication" in c.misuse_warning
    assert "forward" in c.misuse_warning and "backward" not in c.misuse_warning
    c = weft.StepCounter(3, counts="backward")
    assert run_counter(c, "FFSFFS") == ["counted", "counted", False, "communicate",
                                        "misuse", True]
    assert "backward" in c.misuse_warning
    # The drift of docs/optim.md, rule 5: no warning, communication at the 2nd mini-batch.
    c = weft.StepCounter(3)
    events = run_counter(c, "FSFSFSFS" + "FSFSFSFS")
    assert "misuse" not in events
    assert [i for i, e in enumerate(events) if e is True] == [5, 11]


def test_step_counter_accessors():
    c = weft.StepCounter(2, counts="backward", units=3)
    assert (c.steps_per_communication, c.counts, c.units) == (2, "backward", 3)
    assert c.misuse_warning == ""
    assert c.computation(1, counted=False) == "ignored"
    assert c.countdown(1) == 2 and c.computations == 0
    assert c.computation(0) == "counted" and c.computation(1) == "counted"
    assert c.computations == 1 and c.computations_since_communication == 1
    assert c.computation(0) == "communicate" and c.countdown(0) == 0 and c.countdown(2) == 2
    c.steps_per_communication = 4  # counted since the last S: at the next S
    assert c.steps_per_communication == 2
    assert c.step() is True
    assert c.steps_per_communication == 4 and c.computations_since_communication == 0
    assert c.computations == 2
    with pytest.raises(weft.InvalidArgumentError, match="out of range"):
        c.computation(3)
    assert "J=4" in repr(c)


def test_step_counter_bad_input():
    with pytest.raises(ValueError, match="at least 1"):
        weft.StepCounter(0)
    with pytest.raises(weft.InvalidArgumentError, match="at least one unit"):
        weft.StepCounter(1, units=0)
    with pytest.raises(ValueError, match="forward"):
        weft.StepCounter(1, counts="sideways")
    with pytest.raises(TypeError):
        weft.StepCounter(1.5)
    c = weft.StepCounter(1)
    with pytest.raises(weft.FailedPreconditionError, match="forward computation") as e:
        c.step()
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(ValueError, match="at least 1"):
        c.steps_per_communication = 0
    assert c.steps_per_communication == 1


# ---- where communication happens -----------------------------------------------------------

SEQUENCES = ["FFFS", "FsFsFS", "FFsFS", "FsFFS", "FFFFS", "FFsFFS", "FsFsFSFs" + "FsFSFsFs"]


def rank_model(value):
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    return model


def forward_backward(model):
    model(torch.ones(4, 2)).sum().backward()


def check_sequence(made, cls, sequence, communication_type=None, mix=None):
    r, n = weft.rank(), weft.size()
    mix = mixing_matrix() if mix is None else mix
    model = rank_model(float(r))
    kwargs = {} if communication_type is None else {"communication_type": communication_type}
    opt = make(made, cls, torch.optim.SGD(model.parameters(), lr=0.0), model,
               num_steps_per_communication=3, **kwargs)
    values = np.arange(n, dtype=np.float64)  # every rank's parameter value
    since_s = 0
    for position, c in enumerate(sequence):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if c == "F":
                opt.zero_grad()
                forward_backward(model)
                since_s += 1
            else:
                opt.step()
                if c == "S":
                    values = mix @ values
                    since_s = 0
        ours = [w for w in caught if issubclass(w.category, wt.StepCountWarning)]
        where = f"{sequence} at {position} ({c})"
        # The 4th F since the last S (J = 3) warns, once; nothing else does.
        assert len(ours) == (1 if c == "F" and since_s > 3 else 0), where
        if ours:
            assert "num_steps_per_communication" in str(ours[0].message)
            # Attributed to the training loop's line, not to torch's or weft's.
            assert os.path.basename(ours[0].filename) == os.path.basename(__file__)
        assert torch.allclose(param_values(model).double(),
                              torch.full((3,), values[r], dtype=torch.float64)), where
    return opt


@pytest.mark.parametrize("cls", [AWC, ATC], ids=["awc", "atc"])
@pytest.mark.parametrize("sequence", SEQUENCES)
def test_where_communication_happens(default_topology_and_cleanup, cls, sequence):
    check_sequence(default_topology_and_cleanup, cls, sequence)


@pytest.mark.parametrize("cls", [AWC, ATC], ids=["awc", "atc"])
@pytest.mark.parametrize("kind", list(wt.CommunicationType))
def test_communication_types(default_topology_and_cleanup, cls, kind):
    n = weft.size()
    mix = {
        wt.CommunicationType.neighbor_allreduce: None,
        # One machine: the hierarchical one is the machine's (everyone's) average.
        wt.CommunicationType.hierarchical_neighbor_allreduce: np.full((n, n), 1.0 / n),
        wt.CommunicationType.allreduce: np.full((n, n), 1.0 / n),
        wt.CommunicationType.empty: np.eye(n),
    }[kind]
    check_sequence(default_topology_and_cleanup, cls, "FFFSFsFFS", kind, mix)
    # The names and values of Bluefog's enum are accepted too.
    assert wt.CommunicationType(kind.value) is kind


class TwoHeads(torch.nn.Module):
    """One head is never used: its parameters are never counted."""

    def __init__(self, value):
        super().__init__()
        self.used = rank_model(value)
        self.unused = rank_model(value)

    def forward(self, x):
        return self.used(x)


@pytest.mark.parametrize("cls", [AWC, ATC, GA], ids=["awc", "atc", "ga"])
def test_parameters_without_gradient_are_communicated_too(default_topology_and_cleanup, cls):
    # Every rank communicates every parameter at an S, also those whose count never moved.
    made = default_topology_and_cleanup
    r, n = weft.rank(), weft.size()
    model = TwoHeads(float(r))
    opt = make(made, cls, torch.optim.SGD(model.parameters(), lr=0.0), model)
    opt.zero_grad(set_to_none=True)
    forward_backward(model)
    opt.step()
    if cls is GA:
        assert torch.all(model.unused.weight.grad == 0)  # zeros, averaged
        assert torch.all(model.used.weight.grad == 4.0)  # the same gradient on every rank
        expected = float(r)
    else:
        expected = mixing_matrix()[r] @ np.arange(n, dtype=np.float64)
        assert model.unused.weight.grad is None
    for p in model.parameters():
        assert torch.allclose(p.double(), torch.full_like(p, expected).double())


def test_forward_without_grad_is_not_counted(default_topology_and_cleanup):
    made = default_topology_and_cleanup
    r = weft.rank()
    model = rank_model(float(r))
    opt = make(made, AWC, torch.optim.SGD(model.parameters(), lr=0.0), model)
    with torch.no_grad():
        model(torch.ones(1, 2))
    with pytest.raises(weft.FailedPreconditionError, match="forward"):
        opt.step()
    assert opt.step_counter.computations == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(torch.ones(1, 2))
        with torch.no_grad():
            model(torch.ones(1, 2))  # not counted: no misuse with J = 1
        assert opt.step_counter.computations == 1
        opt.step()
        # No parameter requires grad: not counted either.
        for p in model.parameters():
            p.requires_grad_(False)
        model(torch.ones(1, 2))
        assert opt.step_counter.computations == 1
    assert not [w for w in caught if issubclass(w.category, wt.StepCountWarning)]
    expected = mixing_matrix()[r] @ np.arange(weft.size(), dtype=np.float64)
    assert torch.allclose(param_values(model).double(), torch.full((3,), expected).double())


def test_every_misuse_is_shown_under_the_default_filter(default_topology_and_cleanup):
    made = default_topology_and_cleanup
    model = rank_model(1.0)
    opt = make(made, AWC, torch.optim.SGD(model.parameters(), lr=0.0), model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(2):  # the same message from the same line, twice
            model(torch.ones(1, 2))
            model(torch.ones(1, 2))
            opt.step()
    assert len([w for w in caught if issubclass(w.category, wt.StepCountWarning)]) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", wt.StepCountWarning)
        model(torch.ones(1, 2))
        with pytest.raises(wt.StepCountWarning):
            model(torch.ones(1, 2))
        opt.step()


def test_num_steps_per_communication_setter(default_topology_and_cleanup):
    made = default_topology_and_cleanup
    model = rank_model(float(weft.rank()))
    opt = make(made, ATC, torch.optim.SGD(model.parameters(), lr=0.0), model,
               num_steps_per_communication=2)
    assert opt.num_steps_per_communication == 2
    opt.num_steps_per_communication = 1
    assert opt.num_steps_per_communication == 1 and opt.step_counter.steps_per_communication == 1
    with pytest.raises(ValueError, match="at least 1"):
        opt.num_steps_per_communication = 0


# ---- one step, computed by hand ---------------------------------------------------------------


def local_problem(rank):
    """Rank `rank`'s starting weights and data (every rank can rebuild every other's)."""
    g = torch.Generator().manual_seed(100 + rank)
    weight = torch.randn(1, 3, generator=g, dtype=torch.float64)
    bias = torch.randn(1, generator=g, dtype=torch.float64)
    x = torch.randn(5, 3, generator=g, dtype=torch.float64)
    y = torch.randn(5, 1, generator=g, dtype=torch.float64)
    return weight, bias, x, y


def gradient(weight, bias, x, y):
    w, b = weight.clone().requires_grad_(), bias.clone().requires_grad_()
    torch.nn.functional.mse_loss(x @ w.t() + b, y).backward()
    return w.grad, b.grad


def one_step(made, cls, same_start=False):
    r = weft.rank()
    weight, bias, x, y = local_problem(0 if same_start else r)
    _, _, x, y = local_problem(r)
    model = torch.nn.Linear(3, 1).double()
    with torch.no_grad():
        model.weight.copy_(weight)
        model.bias.copy_(bias)
    opt = make(made, cls, torch.optim.SGD(model.parameters(), lr=0.25), model)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    return model


def test_one_step_adapt_with_combine(default_topology_and_cleanup):
    r, n, m = weft.rank(), weft.size(), mixing_matrix()
    model = one_step(default_topology_and_cleanup, AWC)
    w_mix = sum(m[r][i] * local_problem(i)[0] for i in range(n))
    b_mix = sum(m[r][i] * local_problem(i)[1] for i in range(n))
    gw, gb = gradient(*local_problem(r))  # the pre-combine gradient
    assert torch.allclose(model.weight.detach(), w_mix - 0.25 * gw)
    assert torch.allclose(model.bias.detach(), b_mix - 0.25 * gb)


def test_one_step_adapt_then_combine(default_topology_and_cleanup):
    r, n, m = weft.rank(), weft.size(), mixing_matrix()
    model = one_step(default_topology_and_cleanup, ATC)
    adapted = []
    for i in range(n):
        w, b, _, _ = local_problem(i)
        gw, gb = gradient(*local_problem(i))
        adapted.append((w - 0.25 * gw, b - 0.25 * gb))
    assert torch.allclose(model.weight.detach(), sum(m[r][i] * adapted[i][0] for i in range(n)))
    assert torch.allclose(model.bias.detach(), sum(m[r][i] * adapted[i][1] for i in range(n)))


def test_one_step_gradient_allreduce(default_topology_and_cleanup):
    n = weft.size()
    model = one_step(default_topology_and_cleanup, GA, same_start=True)
    w, b, _, _ = local_problem(0)
    grads = []
    for i in range(n):
        _, _, x, y = local_problem(i)
        grads.append(gradient(w, b, x, y))
    assert torch.allclose(model.weight.detach(), w - 0.25 * sum(g[0] for g in grads) / n)
    assert torch.allclose(model.bias.detach(), b - 0.25 * sum(g[1] for g in grads) / n)


def test_adapt_then_combine_with_momentum_updates_each_parameter_once(
        default_topology_and_cleanup):
    # A stateful optimizer: every parameter's local update happens exactly once per round
    # (once in its own gradient hook, hidden in the others').
    made = default_topology_and_cleanup
    r = weft.rank()
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)).double()
    reference = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)).double()
    reference.load_state_dict(model.state_dict())
    opt = make(made, ATC, torch.optim.Adam(model.parameters(), lr=0.1), model,
               communication_type=wt.CommunicationType.empty)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.1)
    x = torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(r))
    for _ in range(3):
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            m(x).pow(2).mean().backward()
            o.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p, q)
    assert all(s["step"].item() == 3 for s in opt.state.values())


# ---- convergence ----------------------------------------------------------------------------

SOLUTION = torch.tensor([[1.0, -2.0, 3.0, 0.5]], dtype=torch.float64)


def shard(rank, size):
    """Rank `rank`'s data: y = A x* exactly, so x* is the global optimum; with several ranks
    each shard lacks one feature, so no rank can find x* alone."""
    g = torch.Generator().manual_seed(1000 + rank)
    a = torch.randn(32, 4, generator=g, dtype=torch.float64)
    if size > 1:
        a[:, rank % 4] = 0.0
    return a, a @ SOLUTION.t()


def train(made, cls, dynamic, rounds=500, lr=0.1):
    r, n = weft.rank(), weft.size()
    a, y = shard(r, n)
    model = torch.nn.Linear(4, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.randn(1, 4, generator=torch.Generator().manual_seed(r),
                                       dtype=torch.float64))
    if cls is GA:
        wt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = make(made, cls, torch.optim.SGD(model.parameters(), lr=lr), model)
    schedule = topology.GetDynamicOnePeerSendRecvRanks(weft.load_topology(), r)
    for _ in range(rounds):
        if dynamic:
            send, recv = next(schedule)
            opt.self_weight = 1.0 / (len(recv) + 1)
            opt.src_weights = {j: 1.0 / (len(recv) + 1) for j in recv}
            opt.dst_weights = send
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(a), y).backward()
        opt.step()
        if cls in (WINPUT, PUSHSUM):
            # One-sided ops never wait for the destination: on oversubscribed cores one rank
            # could run all its rounds against another's stale values. Keep them in step.
            weft.barrier()
    return model


CONVERGING = [(AWC, False), (AWC, True), (ATC, False), (ATC, True), (GA, False),
              (WINPUT, False), (WINPUT, True), (PUSHSUM, False), (PUSHSUM, True)]


@pytest.mark.parametrize("cls,dynamic", CONVERGING,
                         ids=[f"{c.__name__[11:-9]}-{'dynamic' if d else 'static'}"
                              for c, d in CONVERGING])
def test_converges_to_the_least_squares_solution(default_topology_and_cleanup, cls, dynamic):
    model = train(default_topology_and_cleanup, cls, dynamic)
    error = (model.weight.detach() - SOLUTION).abs().max().item()
    assert error < 1e-6, f"{cls.__name__}: max error {error}"
    assert wt.consensus_distance(model.state_dict()) < 1e-6


def test_local_training_alone_does_not_converge(default_topology_and_cleanup):
    # The check above means something: with several ranks, no shard determines x*.
    if weft.size() == 1:
        pytest.skip("one rank has every feature")
    r, n = weft.rank(), weft.size()
    a, y = shard(r, n)
    model = torch.nn.Linear(4, 1, bias=False).double()
    torch.nn.init.zeros_(model.weight)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(100):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(a), y).backward()
        opt.step()
    assert (model.weight.detach() - SOLUTION).abs().max().item() > 0.4


# ---- helpers ----------------------------------------------------------------------------


def test_broadcast_and_allreduce_parameters():
    r, n = weft.rank(), weft.size()
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(r + 1.0)
    wt.broadcast_parameters(model.state_dict(), root_rank=n - 1)
    assert all(torch.all(p == n) for p in model.parameters())
    for p in model.parameters():
        p.data.fill_(r)
    wt.allreduce_parameters(list(model.named_parameters()))
    assert all(torch.allclose(p, torch.full_like(p, (n - 1) / 2)) for p in model.parameters())
    assert model[0].weight.requires_grad  # still the same leaf parameters
    x = [torch.full((2,), float(r))]
    wt.broadcast_parameters(x, root_rank=0)
    assert torch.all(x[0] == 0)


def test_consensus_distance():
    r, n = weft.rank(), weft.size()
    params = {"a": torch.full((2,), float(r)), "b": torch.tensor([2.0 * r])}
    # Each rank's x = (r, r, 2r); the mean (m, m, 2m) with m = (n-1)/2.
    expected = np.sqrt(sum(6.0 * (i - (n - 1) / 2) ** 2 for i in range(n)) / n)
    d = wt.consensus_distance(params)
    assert d == pytest.approx(expected)
    everyone = weft.allgather(torch.tensor([d], dtype=torch.float64))
    assert torch.all(everyone == d)  # exactly the same on every rank
    assert wt.consensus_distance([torch.ones(3)]) == 0.0


def optimizer_state_vector(optimizer):
    state = optimizer.state_dict()
    values = []
    for index in sorted(state["state"]):
        for key in sorted(state["state"][index]):
            value = state["state"][index][key]
            values.append(torch.as_tensor(value, dtype=torch.float64).reshape(-1))
    for group in state["param_groups"]:
        values.append(torch.tensor([float(group["lr"])], dtype=torch.float64))
    return torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad"])
def test_broadcast_optimizer_state(name):
    r = weft.rank()
    torch.manual_seed(3)
    model = torch.nn.Linear(3, 2)
    kwargs = {"SGD": {"momentum": 0.9}}.get(name, {})
    # The root's optimizer has stepped (and another learning rate); the others have not.
    optimizer = getattr(torch.optim, name)(model.parameters(), lr=0.01 if r == 0 else 0.5,
                                           **kwargs)
    if r == 0:
        for i in range(3):
            optimizer.zero_grad()
            model(torch.full((4, 3), float(i))).pow(2).sum().backward()
            optimizer.step()
    wt.broadcast_parameters(model.state_dict(), root_rank=0)
    wt.broadcast_optimizer_state(optimizer, root_rank=0)
    mine = optimizer_state_vector(optimizer)
    everyone = weft.allgather(mine.reshape(1, -1))
    assert torch.equal(everyone, mine.expand_as(everyone)), name
    # The state is usable: one more identical step keeps every rank identical.
    optimizer.zero_grad()
    model(torch.ones(4, 3)).pow(2).sum().backward()
    optimizer.step()
    mine = param_values(model)
    everyone = weft.allgather(mine.reshape(1, -1))
    assert torch.equal(everyone, mine.expand_as(everyone)), name


def test_broadcast_optimizer_state_of_a_distributed_optimizer(default_topology_and_cleanup):
    made = default_topology_and_cleanup
    model = rank_model(1.0)
    opt = make(made, AWC, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5), model)
    if weft.rank() == 0:  # the local optimizer alone (a forward would be counted)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.optimizer.step()
    opt.zero_grad()
    wt.broadcast_optimizer_state(opt, root_rank=0)
    assert len(opt.state) == 2 and opt.optimizer.state is opt.state


# ---- bad input and API ----------------------------------------------------------------------

ALL = [AWC, ATC, GA, WINPUT, PUSHSUM]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_bad_construction(default_topology_and_cleanup, cls):
    made = default_topology_and_cleanup
    model = torch.nn.Linear(2, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    for j in (0, -1):
        with pytest.raises(ValueError, match="at least 1"):
            cls(sgd, model, num_steps_per_communication=j)
    frozen = torch.nn.Linear(2, 1).requires_grad_(False)
    with pytest.raises(ValueError, match="no parameter that requires grad"):
        cls(torch.optim.SGD(frozen.parameters(), lr=0.1), frozen)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        cls(object(), model)
    with pytest.raises(TypeError, match="nn.Module"):
        cls(sgd, object())
    other = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="does not hold the model's trainable parameter"):
        cls(torch.optim.SGD(other.parameters(), lr=0.1), model)
    opt = make(made, cls, sgd, model)
    with pytest.raises(TypeError, match="already"):
        cls(opt, model)
    # step() before any counted computation: the optimizer is not seeing the model.
    counts = "backward" if cls in (ATC, GA) else "forward"
    with pytest.raises(weft.FailedPreconditionError, match=f"{counts} computation"):
        opt.step()
    assert weft.win_names() == ([] if cls not in (WINPUT, PUSHSUM) else sorted(
        f"{opt._prefix}.{name}" for name in ("weight", "bias")))


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_parameters_that_differ_across_ranks(cls):
    r, n = weft.rank(), weft.size()
    if n == 1:
        pytest.skip("needs two ranks")
    model = torch.nn.Linear(3 if r == n - 1 else 2, 1)
    with pytest.raises(ValueError, match=rf"differ across ranks: rank \[{n - 1}\] disagrees") \
            as e:
        cls(torch.optim.SGD(model.parameters(), lr=0.1), model)
    assert f"This rank ({r}) has: weight (1, {3 if r == n - 1 else 2}) float32" in str(e.value)
    assert weft.win_names() == []
    # Names differ (same shapes): refused too.
    model = torch.nn.Sequential(torch.nn.Linear(2, 1)) if r == 0 else torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="differ across ranks"):
        cls(torch.optim.SGD(model.parameters(), lr=0.1), model)
    weft.barrier()


def test_communication_type_and_weights(default_topology_and_cleanup):
    made = default_topology_and_cleanup
    model = rank_model(1.0)
    with pytest.raises(ValueError, match="communication_type"):
        AWC(torch.optim.SGD(model.parameters(), lr=0.1), model, communication_type="gossip")
    opt = make(made, AWC, torch.optim.SGD(model.parameters(), lr=0.1), model,
               communication_type="allreduce")
    assert opt.communication_type is wt.CommunicationType.allreduce
    opt.communication_type = "neighbor.allreduce"
    assert opt.communication_type is wt.CommunicationType.neighbor_allreduce
    opt.self_weight = 0.5  # without src_weights: refused when the round launches
    with pytest.raises(ValueError, match="go together"):
        model(torch.ones(1, 2))
    opt.self_weight = None
    opt.step()  # an S: the parameters the refused launch missed are launched here
    expected = mixing_matrix()[weft.rank()] @ np.ones(weft.size())
    assert torch.allclose(param_values(model).double(), torch.full((3,), expected).double())


def test_the_wrapper_delegates(default_topology_and_cleanup):
    made = default_topology_and_cleanup
    model = rank_model(1.0)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = make(made, GA, sgd, model)
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.param_groups is sgd.param_groups and opt.state is sgd.state
    assert opt.defaults is sgd.defaults
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt.zero_grad()
    forward_backward(model)
    loss = opt.step(closure=lambda: torch.tensor(3.0))
    scheduler.step()
    assert loss.item() == 3.0 and sgd.param_groups[0]["lr"] == pytest.approx(0.05)
    assert set(opt.state_dict()) == {"state", "param_groups"}
    assert weft.DistributedGradientAllreduceOptimizer is GA  # `import weft as bf` works too
    opt.close()
    with pytest.raises(RuntimeError, match="after close"):
        opt.step()


def test_windows_are_freed_at_shutdown(tmp_path):
    # In a process of its own (one rank): an optimizer's windows at weft.shutdown().
    if weft.rank() != 0:
        return
    code = (
        "import torch, weft, weft.torch as wt\n"
        "weft.init()\n"
        "m = torch.nn.Linear(2, 1)\n"
        "a = wt.DistributedWinPutOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m)\n"
        "b = wt.DistributedPushSumOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m)\n"
        "m(torch.ones(1, 2)).sum().backward(); a.step(); b.step()\n"
        "weft.shutdown()\n"
        "assert weft.win_names() == []\n"
        "a.close()\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_WORLD", "OMPI_MCA_ess", "OMPI_MCA_orte", "PMIX_",
                                "OMPI_UNIVERSE", "OMPI_FILE_LOCATION", "OMPI_APP_CTX"))}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")
