"""weft.pipe: freezing, partitions, AutoPipe/AutoDP plans and schedules (pure computations,
no communication: every rank computes the same answers), and GradNormAccumulator."""
import math
import re

import pytest
import torch

import weft
import weft.pipe as wp
from weft import lowlevel as _c


def _ceil_bound(layers, num, den, t):
    """ceil(L (1 - (1 - num/den)^t)) in exact integer arithmetic."""
    keep_num, keep_den = (den - num) ** t, den ** t
    return -(-layers * (keep_den - keep_num) // keep_den)


def test_is_a_submodule_of_weft():
    assert weft.pipe is wp


# ---- AutoFreeze --------------------------------------------------------------------------


def test_freeze_bound_schedule():
    # L = 12, alpha = 1/3: ceil(12 (1 - (2/3)^t)) = 0, 4, 7 (6.67), 9 (8.44), 10 (9.63).
    expected = [0, 4, 7, 9, 10, 11]
    assert [_ceil_bound(12, 1, 3, t) for t in range(6)] == expected
    assert [wp.freeze_bound(12, 1 / 3, t) for t in range(6)] == expected
    # Exact at integers: 8 (1 - 1/2) is 4, not 5; 10 (1 - 0.7) is 3.
    assert wp.freeze_bound(8, 0.5, 1) == 4
    assert wp.freeze_bound(8, 0.5, 3) == _ceil_bound(8, 1, 2, 3) == 7
    assert wp.freeze_bound(10, 0.3, 1) == 3
    assert wp.freeze_bound(12, 1.0, 1) == 12


@pytest.mark.parametrize("args, fragment", [
    ((12, 0.0, 1), "alpha"),
    ((12, 1.5, 1), "alpha"),
    ((0, 0.5, 1), "layer"),
    ((12, 0.5, -1), "-1"),
    ((2 ** 40, 0.5, 1), "C int"),
])
def test_freeze_bound_errors(args, fragment):
    with pytest.raises(weft.InvalidArgumentError, match=fragment) as info:
        wp.freeze_bound(*args)
    assert isinstance(info.value, ValueError)
    assert info.value.status == _c.WEFT_ERR_INVALID_ARGUMENT


def test_next_frozen_schedule():
    assert wp.next_frozen(12, 2, 4) == 7
    assert wp.next_frozen(12, 1, 9) == 9  # layers never unfreeze
    assert wp.next_frozen(12, 1, 0, alpha=1.0) == 11  # the last layer keeps training
    assert wp.next_frozen(12, 1, 0, alpha=1.0, freeze_last=True) == 12
    # The frozen counts of a run, point after point.
    frozen, seen = 0, []
    for t in range(1, 7):
        frozen = wp.next_frozen(12, t, frozen)
        seen.append(frozen)
    assert seen == [4, 7, 9, 10, 11, 11]


def test_next_frozen_gradient_aware():
    norms = [10.0 + i for i in range(12)]
    norms[5] = 1.0
    norms[2] = 0.5  # already frozen (below previous = 4): not a candidate
    assert wp.next_frozen(12, 2, 4, norms, gradient_aware=True) == 6
    norms[5], norms[9] = 10.0, 1.0  # 1 + 9 is above the bound 7
    assert wp.next_frozen(12, 2, 4, norms, gradient_aware=True) == 7
    norms[6] = norms[9] = 0.25  # a tie: the earliest
    assert wp.next_frozen(12, 2, 4, norms, gradient_aware=True) == 7
    norms[4] = 0.25
    assert wp.next_frozen(12, 2, 4, tuple(norms), gradient_aware=True) == 5
    assert wp.next_frozen(12, 2, 4, norms) == 7  # without the policy, norms are ignored


def test_next_frozen_errors():
    with pytest.raises(weft.InvalidArgumentError, match="12"):
        wp.next_frozen(12, 2, 4, gradient_aware=True)  # no norms
    with pytest.raises(weft.InvalidArgumentError, match="5"):
        wp.next_frozen(12, 2, 4, [1.0] * 5, gradient_aware=True)
    norms = [1.0] * 12
    norms[8] = -1.0
    with pytest.raises(weft.InvalidArgumentError, match="layer 8"):
        wp.next_frozen(12, 2, 4, norms, gradient_aware=True)
    with pytest.raises(weft.InvalidArgumentError, match="13"):
        wp.next_frozen(12, 2, 13)
    with pytest.raises(weft.InvalidArgumentError, match="alpha"):
        wp.next_frozen(12, 2, 4, alpha=0.0)
    with pytest.raises(TypeError):
        wp.next_frozen(12, 2, 4, grad_norms=3)


def test_option_struct_versions_are_checked():
    # The low-level dicts may carry a version, only so that this can be tested.
    assert _c.weft_pipe_next_frozen(12, 2, 4, None, {"version": 1}) == 7
    with pytest.raises(weft.InvalidArgumentError, match="WEFT_PIPE_FREEZE_OPTIONS_INIT"):
        _c.weft_pipe_next_frozen(12, 2, 4, None, {"version": 0})
    with pytest.raises(weft.InvalidArgumentError, match="WEFT_PIPE_PLAN_OPTIONS_INIT"):
        _c.weft_pipe_plan_create([1.0] * 12, 0, {"version": 2}, None)


def test_options_default_to_the_library_s():
    # Options not passed (or passed as None) take the C library's defaults, which Python
    # reads from weft_pipe_*_options_init instead of repeating them.
    plan = wp.default_options("plan")
    assert plan == {"version": 1, "machines": 1, "devices_per_machine": 8, "k0": 8,
                    "lambda": 1 / 6, "strategy": wp.STRATEGIES["optimal"],
                    "micro_batches": 0}
    assert wp.default_options("freeze") == {"version": 1, "alpha": 1 / 3,
                                             "gradient_aware": False, "freeze_last": False}
    sizes = [1e6] * 16
    a = wp.make_plan(sizes, frozen=0)
    b = wp.make_plan(sizes, frozen=0, machines=plan["machines"],
                     devices_per_machine=plan["devices_per_machine"], k0=plan["k0"],
                     lam=plan["lambda"], strategy="optimal",
                     micro_batches=plan["micro_batches"])
    assert repr(a) == repr(b)
    assert wp.next_frozen(12, 2, 4) == wp.next_frozen(12, 2, 4, alpha=1 / 3)
    assert wp.parameter_costs([6, 12], frozen=1) == wp.parameter_costs([6, 12], 1, 1 / 6)
    with pytest.raises(TypeError, match="unknown option 'alpah'"):
        _c.weft_pipe_next_frozen(12, 2, 4, None, {"alpah": 0.5})
    with pytest.raises(TypeError, match="must be a dict"):
        _c.weft_pipe_next_frozen(12, 2, 4, None, (1 / 3, False, False))
    with pytest.raises(ValueError, match="kind"):
        wp.default_options("planner")
    # Out-of-range integers are refused before anything is loaded, naming the C type.
    for options, kind in (({"seed": -1}, "a uint64"), ({"batch_size": 2 ** 63}, "an int64"),
                          ({"k0": 2 ** 31}, "a C int")):
        with pytest.raises(weft.InvalidArgumentError, match=f"does not fit {kind}"):
            wp.Trainer("/nonexistent/model.pt", **options)


# ---- costs and partitions ----------------------------------------------------------------


def test_parameter_costs():
    costs = wp.parameter_costs([6, 12, 18, 24, 30, 36], frozen=2)
    assert costs == pytest.approx([1, 2, 18, 24, 30, 36])
    assert wp.parameter_costs([6, 12], frozen=2, lam=0.5) == [3.0, 6.0]
    assert wp.parameter_costs((1, 2, 3)) == [1.0, 2.0, 3.0]
    with pytest.raises(weft.InvalidArgumentError, match="layer 1"):
        wp.parameter_costs([1, -1, 1])
    with pytest.raises(weft.InvalidArgumentError, match="7"):
        wp.parameter_costs([1] * 6, frozen=7)
    with pytest.raises(weft.InvalidArgumentError, match="lambda"):
        wp.parameter_costs([1] * 6, lam=2.0)
    with pytest.raises(TypeError):
        wp.parameter_costs(5)


def test_partition_optimal_by_hand():
    c = [1, 2, 3, 4, 5]
    # Two stages: cutting after 1, 2, 3 or 4 layers gives largest stages 14, 12, 9, 10.
    p = wp.partition(c, 2)
    assert p.boundaries == [0, 3, 5] and p.max_cost == 9 and p.stage_costs == [6, 9]
    assert p.num_stages == 2 and p.stages() == [range(0, 3), range(3, 5)]
    # Three stages: 1 + 2 + 3 = 6, then 4 and 5 alone.
    p = wp.partition(c, 3, "optimal")
    assert p == wp.Partition([0, 3, 4, 5], [6, 4, 5], 6)


def test_partition_even_and_greedy():
    c = [1, 2, 3, 4, 5]
    p = wp.partition(c, 3, "even")  # the first L mod K stages get one layer more
    assert p.boundaries == [0, 2, 4, 5] and p.max_cost == 7
    g = wp.partition(c, 3, "greedy")
    assert len(g.boundaries) == 4 and g.boundaries[0] == 0 and g.boundaries[-1] == 5
    assert g.boundaries == sorted(g.boundaries) and g.max_cost >= 6
    assert g.max_cost == max(g.stage_costs)
    # Greedy may leave stages empty, so it takes more stages than layers.
    g = wp.partition(c, 6, "greedy")
    assert len(g.boundaries) == 7 and any(len(s) == 0 for s in g.stages())


@pytest.mark.parametrize("costs, stages, strategy, fragment", [
    ([1, 2, 3, 4, 5], 0, "optimal", "stages"),
    ([1, 2, 3, 4, 5], -3, "optimal", "stages"),
    ([1, 2, 3, 4, 5], 6, "optimal", "6 stages for 5 layers"),
    ([1, 2, 3, 4, 5], 6, "even", "6 stages for 5 layers"),
    ([1, -1, 1], 2, "optimal", "layer 1"),
    ([], 2, "optimal", "no layers"),
    ([1, 2], 1, "fastest", "strategy"),
])
def test_partition_errors(costs, stages, strategy, fragment):
    with pytest.raises(weft.InvalidArgumentError, match=fragment):
        wp.partition(costs, stages, strategy)


# ---- AutoPipe/AutoDP plans ---------------------------------------------------------------

SIZES = [1.0] * 12  # 12 equal layers on 1 machine of 8 devices, k0 = 8


def _check(plan, frozen, k, replicas, micro_batches, boundaries, stage_costs, newly_active,
           roles):
    assert (plan.frozen, plan.k, plan.replicas, plan.micro_batches, plan.world) == \
        (frozen, k, replicas, micro_batches, 8)
    assert plan.m0 == pytest.approx(2.0)
    assert plan.boundaries == boundaries
    assert plan.stage_costs == pytest.approx(stage_costs)
    assert plan.max_cost == pytest.approx(max(stage_costs))
    assert plan.newly_active == newly_active
    assert plan.roles == roles
    assert [plan.role(r) for r in range(8)] == roles
    assert plan.stages() == [range(boundaries[s], boundaries[s + 1]) for s in range(k)]


def test_plans_as_layers_freeze():
    one = [(0, s) for s in range(8)]
    two = [(r, s) for r in range(2) for s in range(4)]
    four = [(r, s) for r in range(4) for s in range(2)]
    # F = 0: K = 8, one replica; M0 = ceil(12 / 8) = 2; the smallest boundaries first.
    p0 = wp.make_plan(SIZES)
    _check(p0, 0, 8, 1, 32, [0, 1, 2, 3, 4, 6, 8, 10, 12], [1, 1, 1, 1, 2, 2, 2, 2], [], one)
    # F = 4: 4/6 + 8 does not fit 4 stages of 2, K stays 8.
    p4 = wp.make_plan(SIZES, 4, previous=p0)
    _check(p4, 4, 8, 1, 32, [0, 5, 6, 7, 8, 9, 10, 11, 12], [4 / 6 + 1] + [1] * 7, [], one)
    # F = 7: K halves to 4, replicas double, ranks 4-7 become active.
    p7 = wp.make_plan(SIZES, 7, previous=p4)
    _check(p7, 7, 4, 2, 16, [0, 1, 8, 10, 12], [1 / 6, 2, 2, 2], [4, 5, 6, 7], two)
    assert p7.replica_ranks(1) == [4, 5, 6, 7]
    # F = 9: 9/6 + 3 does not fit 2 stages: no change, nobody new.
    p9 = wp.make_plan(SIZES, 9, previous=p7)
    _check(p9, 9, 4, 2, 16, [0, 8, 10, 11, 12], [8 / 6, 1 / 6 + 1, 1, 1], [], two)
    # F = 10: K = 2, 4 replicas; replicas 2 and 3 (ranks 4-7) are new.
    p10 = wp.make_plan(SIZES, 10, previous=p9)
    _check(p10, 10, 2, 4, 8, [0, 10, 12], [10 / 6, 2], [4, 5, 6, 7], four)
    assert p10.replica_ranks(3) == [6, 7]
    assert "k=2" in repr(p10)


def test_plans_follow_the_freeze_schedule():
    plan, frozen, ks = wp.make_plan(SIZES), 0, []
    for t in range(1, 5):
        frozen = wp.next_frozen(12, t, frozen)
        plan = wp.make_plan(SIZES, frozen, previous=plan)
        ks.append((plan.frozen, plan.k, plan.replicas))
    assert ks == [(4, 8, 1), (7, 4, 2), (9, 4, 2), (10, 2, 4)]


def test_plan_idle_ranks_and_options():
    p = wp.make_plan(SIZES, devices_per_machine=6, k0=4, micro_batches=6)
    assert (p.k, p.replicas, p.micro_batches, p.world, p.m0) == (4, 1, 6, 6, 3.0)
    assert p.boundaries == [0, 3, 6, 9, 12] and p.stage_costs == [3, 3, 3, 3]
    assert p.roles == [(0, 0), (0, 1), (0, 2), (0, 3), (-1, -1), (-1, -1)]
    assert p.replica_ranks(0) == [0, 1, 2, 3]
    e = wp.make_plan(SIZES, strategy="even", k0=4)
    assert e.boundaries == [0, 3, 6, 9, 12] and e.replicas == 2


def test_plan_errors():
    p = wp.make_plan(SIZES, 9)
    bad = list(SIZES)
    bad[3] = -1.0
    cases = [
        (lambda: wp.make_plan(bad), "sizes[3]"),
        (lambda: wp.make_plan(SIZES[:4]), "stages"),  # k0 = 8 stages for 4 layers
        (lambda: wp.make_plan(SIZES, 13), "13"),
        (lambda: wp.make_plan([]), "layer"),
        (lambda: wp.make_plan(SIZES, k0=0), "k0"),
        (lambda: wp.make_plan(SIZES, k0=9), "k0"),
        (lambda: wp.make_plan(SIZES, micro_batches=-1), "micro_batches"),
        (lambda: wp.make_plan(SIZES, machines=0), "machine"),
        (lambda: wp.make_plan(SIZES, strategy="best"), "strategy"),
        (lambda: wp.make_plan(SIZES, 8, previous=p), "never"),
        (lambda: wp.make_plan(SIZES, 10, machines=2, previous=p), "16"),
        (lambda: p.role(8), "8"),
        (lambda: p.role(-1), "-1"),
    ]
    for make, fragment in cases:
        with pytest.raises(weft.InvalidArgumentError, match=re.escape(fragment)):
            make()
    with pytest.raises(TypeError):
        wp.make_plan(SIZES, previous="plan")


# ---- schedules ---------------------------------------------------------------------------


def test_schedule_bubble():
    # (K - 1) / (M + K - 1) idle, 2 (M + K - 1) clock cycles, for both kinds.
    for kind in ("gpipe", "1f1b"):
        bubble, cycles = wp.schedule_bubble(kind, 4, 8)
        assert bubble == pytest.approx(3 / 11) and cycles == 22
    assert wp.schedule_bubble("gpipe", 8, 32)[0] == pytest.approx(7 / 39)
    assert wp.schedule_bubble("gpipe", 1, 5) == (0.0, 10)
    for args, fragment in [(("gpipe", 0, 8), "K = 0"), (("1f1b", 4, 0), "M = 0"),
                           (("zb", 4, 8), "kind")]:
        with pytest.raises(weft.InvalidArgumentError, match=fragment):
            wp.schedule_bubble(*args)


# ---- GradNormAccumulator -----------------------------------------------------------------


def _model():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
        model[0].bias.zero_()
        model[1].weight.copy_(torch.tensor([[3.0, 4.0]]))
        model[1].bias.zero_()
    return model


def _expected_norms(model):
    return [math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in m.parameters()))
            for m in model]


def test_grad_norm_accumulator():
    model = _model()
    groups = [model[0], list(model[1].parameters())]  # a module, and a list of parameters
    norms = wp.GradNormAccumulator(groups)
    assert len(norms) == 2 and norms.sums == [0.0, 0.0] and norms.iterations == 0
    x = torch.tensor([[1.0, 1.0]])
    total = [0.0, 0.0]
    for step in range(3):
        model.zero_grad()
        (model(x * (step + 1)).sum()).backward()
        expected = _expected_norms(model)
        assert norms.add() == pytest.approx(expected)
        total = [a + b for a, b in zip(total, expected)]
    # Layer 0's gradient: d/dW0 = outer([3, 4], x) (2x2), d/db0 = [3, 4]: norm 5 sqrt(1 + 2 s^2)
    # with x = s (1, 1); layer 1's: h = (s, 2 s), norm sqrt(5 s^2 + 1).
    assert total[0] == pytest.approx(sum(5 * math.sqrt(2 * s * s + 1) for s in (1, 2, 3)))
    assert total[1] == pytest.approx(sum(math.sqrt(5 * s * s + 1) for s in (1, 2, 3)))
    assert norms.iterations == 3
    taken = norms.take()
    assert taken == pytest.approx(total)
    assert norms.sums == [0.0, 0.0] and norms.iterations == 0
    # The sums feed the gradient-aware policy.
    assert wp.next_frozen(2, 1, 0, taken, alpha=1.0, gradient_aware=True,
                          freeze_last=True) == (1 if taken[0] < taken[1] else 2)


def test_grad_norm_accumulator_skips_missing_gradients_and_rejects_nan():
    model = _model()
    norms = wp.GradNormAccumulator([model[0], model[1]])
    assert norms.add() == [0.0, 0.0]  # no backward yet: no gradients
    model(torch.ones(1, 2)).sum().backward()
    with torch.no_grad():
        model[1].bias.grad.fill_(float("nan"))
    before = norms.sums
    with pytest.raises(weft.InvalidArgumentError, match="group 1"):
        norms.add()
    assert norms.sums == before and norms.iterations == 1  # nothing was accumulated
    with pytest.raises(TypeError, match="group 0"):
        wp.GradNormAccumulator([3])
