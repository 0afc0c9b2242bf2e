"""Bad input: a clear WeftError on every rank, never a hang or a crash."""
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import weft


def test_error_classes():
    e = weft.InvalidArgumentError(1, "why")
    assert isinstance(e, weft.WeftError) and isinstance(e, ValueError)
    assert e.status == 1 and e.message == "why"
    assert issubclass(weft.DeadlineExceededError, TimeoutError)


def test_bad_arguments():
    x = np.ones(4, dtype=np.float32)
    with pytest.raises(weft.InvalidArgumentError, match="root_rank"):
        weft.broadcast(x, weft.size())
    with pytest.raises(weft.InvalidArgumentError, match="itself"):
        weft.pair_gossip(x, weft.rank())
    with pytest.raises(ValueError, match="go together"):
        weft.neighbor_allreduce(x, self_weight=0.5)
    with pytest.raises(weft.InvalidArgumentError, match="go together"):
        weft.neighbor_allgather(x, src_ranks=[0])
    with pytest.raises(weft.InvalidArgumentError, match="out of range"):
        weft.neighbor_allreduce(x, self_weight=0.5, src_weights={weft.size() + 3: 0.5})
    with pytest.raises(weft.InvalidArgumentError, match="reserved"):
        weft.allreduce(x, name="#mine")
    # A dtype weft does not exchange: a TypeError naming the dtype as the user wrote it.
    with pytest.raises(TypeError, match="ndarray of dtype bool"):
        weft.allreduce(np.ones(3, dtype=bool))
    with pytest.raises(weft.UnsupportedDTypeError, match="dtype complex64"):
        weft.allreduce(np.ones(3, dtype=np.complex64))
    # Another byte order than the machine's (writable or not): refused, never read as this
    # machine's numbers.
    swapped = np.ones(3, dtype=np.dtype(np.float32).newbyteorder())
    with pytest.raises(weft.UnsupportedDTypeError, match="byte order"):
        weft.allreduce(swapped)
    swapped.flags.writeable = False
    with pytest.raises(weft.UnsupportedDTypeError, match="byte order"):
        weft.allreduce(swapped)
    with pytest.raises(TypeError, match="Tensor of dtype torch.complex64"):
        weft.allreduce(torch.ones(3, dtype=torch.complex64))
    with pytest.raises(weft.UnimplementedError, match="dtype torch.bool"):
        weft.neighbor_allreduce(torch.ones(3, dtype=torch.bool))
    with pytest.raises(TypeError, match="expected a NumPy array"):
        weft.allreduce(object())
    with pytest.raises(weft.InvalidArgumentError, match="at least one dimension"):
        weft.allgather(np.float32(3.0))
    # The engine keeps working after every refusal.
    assert np.all(weft.allreduce(x, average=False) == weft.size())


def test_a_refusal_on_one_rank_fails_the_op_everywhere_and_keeps_the_order():
    if weft.size() < 2:
        pytest.skip("needs a second rank")
    n = weft.size()
    refuser = n - 1
    x = np.ones(4, dtype=np.complex64 if weft.rank() == refuser else np.float32)
    start = time.monotonic()
    with pytest.raises(weft.UnimplementedError) as info:
        weft.allreduce(x, average=False)  # unnamed: matched by call order
    if weft.rank() != refuser:
        # Told at once (no stall timeout is set: otherwise this would wait forever).
        assert time.monotonic() - start < 5
        assert f"failed on rank {refuser}, which refused it" in str(info.value)
    # The following unnamed ops pair with the right ones: no sum of different ops.
    for v in (2.0, 4.0):
        assert np.all(weft.allreduce(np.full(3, v), average=False) == v * n)


def test_a_refusal_before_weft_sees_the_call_still_takes_the_op_place():
    # Arguments the Python layer cannot convert (not a tensor, weights that are not a dict,
    # a non-contiguous window tensor) fail before the C ABI: the other ranks are still told
    # at once, and the unnamed ops that follow stay paired.
    if weft.size() < 2:
        pytest.skip("needs a second rank")
    n, r = weft.size(), weft.rank()
    refuser = n - 1
    x = np.ones(4, dtype=np.float32)
    cases = [
        (lambda: weft.allreduce(object() if r == refuser else x, average=False),
         "tensor: expected a NumPy array"),
        (lambda: weft.neighbor_allreduce(x, self_weight=0.5,
                                         src_weights=[1] if r == refuser else {}),
         "src_weights must be a dict"),
        (lambda: weft.broadcast_nonblocking_(object() if r == refuser else x, 0,
                                             name="py.refused.named"),
         "expected a NumPy array"),
        # After weft allocated the output (host torch tensors, NumPy arrays from 64 KiB):
        # the allocation is not the op.
        (lambda: weft.neighbor_allreduce(torch.ones(4), self_weight=0.5,
                                         src_weights=[1] if r == refuser else {}),
         "src_weights must be a dict"),
        (lambda: weft.neighbor_allreduce_nonblocking(torch.ones(4), self_weight=0.5,
                                                     src_weights=[1] if r == refuser else {}),
         "src_weights must be a dict"),
        (lambda: weft.neighbor_allreduce(np.ones(1 << 15, dtype=np.float32), self_weight=0.5,
                                         src_weights=[1] if r == refuser else {}),
         "src_weights must be a dict"),
    ]
    for call, reason in cases:
        start = time.monotonic()
        with pytest.raises(Exception) as info:
            h = call()
            if isinstance(h, weft.Handle):
                weft.synchronize(h)
        assert time.monotonic() - start < 5
        assert reason in str(info.value), (r, str(info.value))
        if r != refuser:
            assert f"rank {refuser}" in str(info.value)
        assert np.all(weft.allreduce(np.full(3, 2.0 + r), average=False) == 2 * n + n * (n - 1) / 2)
    # A send whose receiver cannot take the buffer: the sender is told, not left waiting.
    if r in (0, refuser):
        start = time.monotonic()
        with pytest.raises(Exception, match="expected a NumPy array") as info:
            if r == 0:
                weft.send(x, refuser)
            else:
                weft.recv(0, out=object())
        assert time.monotonic() - start < 5
    # A window one rank cannot create over its tensor: win_create fails everywhere.
    w = np.ones((4, 4), dtype=np.float32)
    with pytest.raises(weft.InvalidArgumentError, match="contiguous"):
        weft.win_create(w[:, :2] if r == refuser else w[:, :2].copy(), "py.refused.win")
    assert "py.refused.win" not in weft.win_names()
    assert np.all(weft.allreduce(np.ones(2), average=False) == n)


def test_unnamed_ops_from_another_thread_are_refused():
    errors, results = [], []

    def worker():
        try:
            weft.allreduce(np.ones(2), average=False)
        except weft.InvalidArgumentError as e:
            errors.append(str(e))
        results.append(weft.allreduce(np.ones(2), average=False, name="from.thread"))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "thread that called init()" in errors[0], errors
    assert np.all(results[0] == weft.size())
    assert np.all(weft.allreduce(np.ones(2), average=False) == weft.size())


def test_point_to_point_and_process_set_refusals():
    r, n = weft.rank(), weft.size()
    x = np.ones(2, dtype=np.float32)
    with pytest.raises(weft.InvalidArgumentError, match="itself"):
        weft.send(x, r)
    with pytest.raises(weft.InvalidArgumentError, match="itself"):
        weft.send_nonblocking(x, r)
    with pytest.raises(weft.InvalidArgumentError, match="src"):
        weft.recv(n)
    with pytest.raises(weft.InvalidArgumentError, match="src"):
        weft.recv(n, out=x)
    with pytest.raises(weft.InvalidArgumentError, match="out of range"):
        weft.recv_nonblocking(-1)
    with pytest.raises(TypeError, match="out="):
        weft.recv(x, 0)  # the buffer goes to out=
    with pytest.raises(weft.InvalidArgumentError, match="twice"):
        weft.allreduce(x, ranks=[r, r])
    with pytest.raises(weft.InvalidArgumentError, match="out of range"):
        weft.allreduce_nonblocking(x, ranks=[r, n])
    with pytest.raises(TypeError, match="sequence of ranks"):
        weft.allreduce(x, ranks=3)
    if n > 1:
        other = (r + 1) % n
        with pytest.raises(weft.InvalidArgumentError, match="not in `ranks`"):
            weft.allreduce(x, ranks=[other])
        with pytest.raises(weft.InvalidArgumentError, match="root_rank"):
            weft.broadcast(x, other, ranks=[r])
    assert np.all(weft.allreduce(x, average=False) == n)


def test_point_to_point_mismatch_fails_on_both_ranks():
    if weft.size() == 1:
        pytest.skip("needs two ranks")
    if weft.rank() == 0:
        with pytest.raises(weft.InvalidArgumentError, match=r"\[4\]"):
            weft.send(np.ones(4, dtype=np.float32), 1, name="py.p2p.mismatch")
    elif weft.rank() == 1:
        buf = np.full(5, 2, dtype=np.float32)
        with pytest.raises(weft.InvalidArgumentError, match="py.p2p.mismatch"):
            weft.recv(0, name="py.p2p.mismatch", out=buf)
        assert np.all(buf == 2)  # untouched
    weft.barrier()


def test_mismatch_across_ranks_fails_everywhere():
    if weft.size() == 1:
        pytest.skip("needs two ranks")
    shape = 5 if weft.rank() == 0 else 4
    with pytest.raises(weft.InvalidArgumentError, match="shape differs across ranks"):
        weft.allreduce(np.ones(shape), name="py.mismatch")
    dtype = torch.float64 if weft.rank() == 0 else torch.float32
    h = weft.allreduce_nonblocking(torch.ones(3, dtype=dtype), name="py.mismatch.dtype")
    with pytest.raises(weft.InvalidArgumentError, match="dtype"):
        weft.synchronize(h)


def test_set_topology_refusals():
    n = weft.size()
    default = weft.topology.ExponentialGraph(n)
    with pytest.raises(weft.InvalidArgumentError, match="ranks but weft runs"):
        weft.set_topology(weft.topology.RingGraph(n + 1))
    if n < 3:
        return
    # Different graphs on different ranks: refused everywhere, nothing changes.
    ring = weft.topology.RingGraph(n, connect_style=1 if weft.rank() == 0 else 2)
    with pytest.warns(RuntimeWarning, match="did not change the topology"):
        assert weft.set_topology(ring) is False
    assert weft.topology.IsTopologyEquivalent(weft.load_topology(), default)
    # An op in flight on the last rank: refused everywhere (Bluefog's False).
    x = np.ones(2, dtype=np.float32)
    last = weft.rank() == n - 1
    pending = weft.allreduce_nonblocking(x, name="held") if last else None
    with pytest.warns(RuntimeWarning, match="in flight on rank"):
        assert weft.set_topology(weft.topology.RingGraph(n)) is False
    if last:
        weft.synchronize(pending)
    else:
        weft.allreduce(x, name="held")
    assert weft.topology.IsTopologyEquivalent(weft.load_topology(), default)


def test_calls_before_init_fail_clearly():
    code = (
        "import numpy as np, weft\n"
        "assert weft.rank() == -1 and not weft.is_initialized()\n"
        "try:\n"
        "    weft.allreduce(np.ones(2))\n"
        "except weft.FailedPreconditionError as e:\n"
        "    assert 'call init() first' in str(e), e\n"
        "try:\n"
        "    weft.set_topology(weft.topology.RingGraph(2))\n"
        "    raise SystemExit('set_topology before init did not raise')\n"
        "except weft.FailedPreconditionError as e:\n"
        "    assert 'call init() first' in str(e), e\n"
        "import warnings, weft.torch as bf\n"
        "with warnings.catch_warnings():\n"
        "    warnings.simplefilter('ignore')\n"
        "    assert bf.set_topology(bf.RingGraph(2)) is False  # Bluefog's answer\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_small_misuses_are_clear_errors():
    with pytest.raises(TypeError, match="expected a weft.Handle"):
        weft.synchronize(None)
    with pytest.raises(TypeError, match="expected a weft.Handle"):
        weft.poll("handle")
    with pytest.raises(weft.InvalidArgumentError, match="NUL"):
        weft.allreduce(np.ones(2), name="a\0b")
    # An empty tensor is contiguous whatever its strides say.
    empty = torch.empty(0, 3)
    assert weft.allreduce(empty, name="empty.rows").shape == (0, 3)
    assert weft.allgather(torch.empty(0, 3), name="empty.gather").shape == (0, 3)


def test_an_interrupt_as_a_nonblocking_op_starts_leaves_its_arrays_alive(monkeypatch):
    # A KeyboardInterrupt can arrive as soon as the C call that started the op returns,
    # before Python builds the Handle: the op runs on, so its arrays must already be held by
    # the request (armed before the call), not left to the garbage collector.
    import gc
    import weakref

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    for i, (start, wrapper) in enumerate([(weft.allreduce_nonblocking, "_start_into"),
                                          (weft.allreduce_nonblocking_, "Handle"),
                                          (weft.allgather_nonblocking, "Handle")]):
        x = torch.full((70000,), float(weft.rank() + 1))  # outputs of 64 KiB and more: pooled
        alive = weakref.ref(x)
        with monkeypatch.context() as patch:
            patch.setattr(weft, wrapper, interrupted)
            with pytest.raises(KeyboardInterrupt):
                start(x, name=f"interrupted.{i}")
        del x
        gc.collect()
        assert alive() is not None, f"{start.__name__}: the op's input was freed while it ran"
    weft.barrier()



def test_a_nonblocking_call_weft_refuses_keeps_nothing_alive():
    # The arrays armed for a nonblocking call are tied to its request, and only to its
    # request: a call weft refuses starts none, and they are let go.
    import gc
    import weakref
    x = torch.ones(16)
    alive = weakref.ref(x)
    with pytest.raises(weft.InvalidArgumentError, match="reserved"):
        weft.allreduce_nonblocking(x, name="#reserved")
    del x
    deadline = time.monotonic() + 10
    while alive() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.001)
    assert alive() is None, "a refused nonblocking call kept its input alive"
