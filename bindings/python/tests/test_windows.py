"""One-sided windows from Python: exact values on NumPy and torch, versions, p, mutexes,
errors."""
import numpy as np
import pytest
import torch

import weft
from weft import topology


@pytest.fixture(autouse=True)
def no_windows_left():
    yield
    weft.win_free()
    weft.barrier()


def value(r):
    return (r + 1.0) * np.arange(1, 4)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_put_update_average(kind):
    r = weft.rank()
    x = value(r)
    if kind == "torch":
        x = torch.from_numpy(x)
    assert weft.win_create(x, f"py.win.{kind}")
    ins = weft.in_neighbor_ranks()
    weft.barrier()
    assert weft.win_put(x, f"py.win.{kind}")
    weft.barrier()
    assert weft.get_win_version(f"py.win.{kind}") == {j: 1 for j in ins}
    y = weft.win_update(f"py.win.{kind}")
    assert y is x  # in place on the window's tensor
    expected = (value(r) + sum(value(j) for j in ins)) / (len(ins) + 1)
    assert np.allclose(np.asarray(y), expected)
    assert weft.get_win_version(f"py.win.{kind}") == {j: 0 for j in ins}
    assert weft.win_associated_p(f"py.win.{kind}") == pytest.approx(1.0)
    assert weft.win_free(f"py.win.{kind}")


def test_weights_self_weight_and_p():
    r = weft.rank()
    x = value(r)
    weft.win_create(x, "py.w")
    outs, ins = weft.out_neighbor_ranks(), weft.in_neighbor_ranks()
    weft.win_put(x, "py.w", self_weight=0.5, dst_weights={d: 0.5 for d in outs})
    assert np.allclose(x, 0.5 * value(r))
    weft.barrier()
    y = weft.win_update("py.w", self_weight=1.0, neighbor_weights={j: 1.0 for j in ins},
                        clone=True)
    expected = 0.5 * value(r) + sum(0.5 * value(j) for j in ins)
    assert np.allclose(y, expected) and y is not x
    assert weft.win_associated_p("py.w") == pytest.approx(0.5 * (1 + len(ins)))


@pytest.mark.parametrize("transport", ["mpi", "ucx"])
def test_accumulate_collect_and_get_nonblocking(transport):
    r = weft.rank()
    x = np.array([r, 10 * r], dtype=np.int64)
    weft.win_create(x, "py.acc", zero_init=True, transport=transport)
    ins = weft.in_neighbor_ranks()
    weft.win_accumulate(x, "py.acc")
    weft.win_wait(weft.win_accumulate_nonblocking(x, "py.acc"))
    weft.barrier()
    y = weft.win_update_then_collect("py.acc")
    assert y.tolist() == [r + 2 * sum(ins), 10 * (r + 2 * sum(ins))]
    weft.barrier()
    h = weft.win_get_nonblocking("py.acc", src_weights={j: 1.0 for j in ins})
    assert weft.win_wait(h) is True
    assert weft.get_win_version("py.acc") == {j: 1 for j in ins}


def test_mutex_guarded_accumulates_lose_nothing():
    n = weft.size()
    if n < 2:
        pytest.skip("needs a second rank")
    weft.set_topology(topology.FullyConnectedGraph(n))
    try:
        x = np.zeros(1, dtype=np.int64)
        weft.win_create(x, "py.mutex", zero_init=True)
        rounds = 30
        if weft.rank() == 0:
            for _ in range(rounds):
                weft.win_update_then_collect("py.mutex", require_mutex=True)
        else:
            one = np.ones(1, dtype=np.int64)
            for _ in range(rounds):
                weft.win_accumulate(one, "py.mutex", dst_weights=[0], require_mutex=True)
        weft.barrier()
        if weft.rank() == 0:
            assert weft.win_update_then_collect("py.mutex")[0] == rounds * (n - 1)
        with weft.win_mutex("py.mutex", for_self=True):
            pass
        weft.win_free("py.mutex")
    finally:
        weft.set_topology()


def test_window_errors():
    x = np.ones(3)
    with pytest.raises(weft.NotFoundError, match="no window named 'py.none'"):
        weft.win_put(x, "py.none")
    with pytest.raises(weft.NotFoundError):
        weft.win_free("py.none")
    with pytest.raises(weft.InvalidArgumentError, match="not one of mpi, ucx"):
        weft.win_create(np.ones(2), "py.bogus", transport="bogus")
    with pytest.raises(weft.InvalidArgumentError, match="contiguous"):
        weft.win_create(np.ones(6)[::2], "py.strided")
    weft.win_create(x, "py.err")
    with pytest.raises(weft.InvalidArgumentError, match="the window holds float64"):
        weft.win_put(np.ones(4), "py.err")
    with pytest.raises(ValueError, match="go together"):
        weft.win_update("py.err", self_weight=0.5)
    with pytest.warns(RuntimeWarning, match="windows exist"):
        assert weft.set_topology(topology.RingGraph(weft.size())) is False
    assert weft.win_names() == ["py.err"]
