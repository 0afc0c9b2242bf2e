"""Every op from Python with exact values, on NumPy arrays and torch tensors."""
import threading
import time

import numpy as np
import pytest
import torch

import weft

KINDS = ["numpy", "torch"]
DTYPES = ["float32", "float64", "float16", "int32", "int64"]


def make(kind, values, dtype="float32"):
    a = np.asarray(values).astype(dtype)
    return torch.from_numpy(a) if kind == "torch" else a


def as_numpy(x):
    return x.numpy() if isinstance(x, torch.Tensor) else x


def check_type(result, like):
    assert type(result) is type(like)
    assert result.dtype == like.dtype
    assert tuple(result.shape) == tuple(like.shape)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce(kind, dtype):
    r, n = weft.rank(), weft.size()
    x = make(kind, np.full((2, 3), r + 1), dtype)
    y = weft.allreduce(x, average=False, name=f"ar.sum.{kind}.{dtype}")
    check_type(y, x)
    assert np.all(as_numpy(y) == n * (n + 1) // 2)
    assert np.all(as_numpy(x) == r + 1)  # out of place leaves the input alone
    if dtype.startswith("float"):
        y = weft.allreduce(x, name=f"ar.avg.{kind}.{dtype}")
        assert np.allclose(as_numpy(y).astype(np.float64), (n + 1) / 2)


@pytest.mark.parametrize("kind", KINDS)
def test_allreduce_in_place_and_nonblocking(kind):
    r, n = weft.rank(), weft.size()
    x = make(kind, [r, r, r], "float64")
    same = weft.allreduce_(x, average=False)
    assert same is x and np.all(as_numpy(x) == n * (n - 1) / 2)
    x = make(kind, [r, 2 * r], "float64")
    h = weft.allreduce_nonblocking(x, average=True, name="ar.nb")
    y = weft.synchronize(h)
    assert weft.poll(h)
    assert np.allclose(as_numpy(y), [(n - 1) / 2, n - 1])
    assert weft.wait(h) is y  # waiting again returns the same result
    h = weft.allreduce_nonblocking_(x, average=False)
    assert weft.synchronize(h) is x and np.allclose(as_numpy(x), [n * (n - 1) / 2, n * (n - 1)])


@pytest.mark.parametrize("kind", KINDS)
def test_group_hands_its_ops_over_together(kind):
    r, n = weft.rank(), weft.size()
    xs = [make(kind, np.full(4, (r + 1) * (k + 1))) for k in range(16)]
    with weft.group():
        handles = [weft.allreduce_nonblocking(x, average=False, name=f"group.{kind}.{k}")
                   for k, x in enumerate(xs)]
        with weft.group():  # nested: only the outermost end hands them over
            handles.append(weft.allreduce_nonblocking(xs[0], average=False))
        # Waiting inside the group hands the ops over at once instead of waiting for the end.
        first = weft.synchronize(handles[0])
    assert np.all(as_numpy(first) == n * (n + 1) // 2)
    for k, h in enumerate(handles[1:16], start=1):
        assert np.all(as_numpy(weft.synchronize(h)) == (k + 1) * n * (n + 1) // 2)
    assert np.all(as_numpy(weft.synchronize(handles[16])) == n * (n + 1) // 2)
    with pytest.raises(weft.FailedPreconditionError, match="no group is open on this thread"):
        weft.group_end()
    # A blocking op inside a group runs at once: its caller drives the engine.
    weft.group_start()
    try:
        y = weft.allreduce(xs[1], average=False, name=f"group.after.{kind}")
    finally:
        weft.group_end()
    assert np.all(as_numpy(y) == 2 * n * (n + 1) // 2)


def test_bfloat16_torch():
    n = weft.size()
    x = torch.full((4,), 1.5, dtype=torch.bfloat16)
    y = weft.allreduce(x, average=False)
    assert y.dtype == torch.bfloat16 and torch.all(y == 1.5 * n)


@pytest.mark.parametrize("kind", KINDS)
def test_broadcast(kind):
    r, n = weft.rank(), weft.size()
    for root in range(n):
        x = make(kind, [[r, 10 * r]], "int64")
        y = weft.broadcast(x, root, name=f"bc.{kind}.{root}")
        check_type(y, x)
        assert as_numpy(y).tolist() == [[root, 10 * root]]
    x = make(kind, [r], "float32")
    assert weft.broadcast_(x, n - 1) is x and as_numpy(x)[0] == n - 1
    x = make(kind, [r], "float32")
    assert as_numpy(weft.synchronize(weft.broadcast_nonblocking(x, 0)))[0] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_allgather(kind):
    r, n = weft.rank(), weft.size()
    x = make(kind, np.full((r + 1, 2), r), "float32")  # dim 0 differs per rank
    y = weft.allgather(x, name=f"ag.{kind}")
    assert type(y) is type(x) and y.dtype == x.dtype
    expected = np.concatenate([np.full((q + 1, 2), q) for q in range(n)]).astype(np.float32)
    assert np.array_equal(as_numpy(y), expected)
    h = weft.allgather_nonblocking(x)
    assert np.array_equal(as_numpy(weft.synchronize(h)), expected)


def data_address(y):
    return y.data_ptr() if isinstance(y, torch.Tensor) else y.ctypes.data


@pytest.mark.parametrize("kind", KINDS)
def test_large_outputs_are_reused_and_writable(kind):
    """Outputs of 64 KiB and more come from freed outputs of the same size: a loop of
    out-of-place ops does not fault in fresh pages on every call. Whatever their source,
    results are ordinary writable arrays that own their memory until dropped."""
    r, n = weft.rank(), weft.size()
    x = make(kind, np.full((300, 100), r + 1), "float32")  # 120,000 bytes
    y = weft.allreduce(x, average=False, name=f"big.{kind}")
    check_type(y, x)
    assert np.all(as_numpy(y) == n * (n + 1) // 2)
    y[0, 0] = -1  # writable
    assert as_numpy(y)[0, 0] == -1 and as_numpy(x)[0, 0] == r + 1
    address = data_address(y)
    del y
    y = weft.allreduce(x, average=False, name=f"big.{kind}")
    assert data_address(y) == address  # the freed output's memory again
    assert np.all(as_numpy(y) == n * (n + 1) // 2)  # and every element rewritten
    view = y[10:20]
    del y  # a view keeps the memory alive
    z = weft.allreduce(x, average=False, name=f"big.{kind}")
    assert data_address(z) != data_address(view)
    assert np.all(as_numpy(view) == n * (n + 1) // 2)
    h = weft.allreduce_nonblocking(x, name=f"big.nb.{kind}")
    assert np.allclose(as_numpy(weft.synchronize(h)), (n + 1) / 2)
    g = weft.allgather(x[:1], name=f"big.ag.{kind}")
    g[0, 0] = 7  # allgather's result is writable too
    assert as_numpy(g)[0, 0] == 7


def test_a_blocking_calls_output_can_come_from_the_call():
    """The low-level contract the package's out-of-place ops use: a blocking op given None
    for `out` allocates the output like `in` and returns its capsule; a call that fails
    raises as before; an op that starts a request, or has no `in`, takes no None."""
    from torch.utils import dlpack
    from weft import lowlevel as _c
    r, n = weft.rank(), weft.size()
    for count in (3, 70000):  # from malloc, and from weft's cache of freed outputs
        x = torch.full((count,), float(r + 1))
        made = _c.weft_comm_allreduce(dlpack.to_dlpack(x), None, False, f"made.{count}")
        y = dlpack.from_dlpack(made)
        assert y.shape == x.shape and y.dtype == x.dtype
        assert torch.all(y == n * (n + 1) / 2) and torch.all(x == r + 1)
        made = _c.weft_comm_broadcast(dlpack.to_dlpack(x), None, 0, f"made.b.{count}")
        assert torch.all(dlpack.from_dlpack(made) == 1)
    x = torch.ones(4)
    with pytest.raises(weft.InvalidArgumentError, match="reserved"):
        _c.weft_comm_allreduce(dlpack.to_dlpack(x), None, False, "#reserved")
    with pytest.raises(TypeError, match="out"):
        _c.weft_comm_allreduce_nonblocking(dlpack.to_dlpack(x), None, False, "made.nb")
    # Right after a blocking call with an input and no `out`, whose input must not stay the
    # one an `out` of None is allocated like (from itself: were an output allocated, weft
    # would refuse the call rather than wait in it).
    _c.weft_comm_allgather(dlpack.to_dlpack(x), "made.gather")
    with pytest.raises(TypeError, match="out"):
        _c.weft_comm_recv(None, r, "made.recv")
    y = weft.allreduce(x, average=False, name="made.after")  # nothing left half done
    assert torch.all(y == n)


def neighbor_average(r, values_of):
    """The uniform average over self and the in-neighbors of the topology in force."""
    ins = weft.in_neighbor_ranks()
    return (values_of(r) + sum(values_of(j) for j in ins)) / (len(ins) + 1)


@pytest.mark.parametrize("kind", KINDS)
def test_neighbor_allreduce(kind):
    r, n = weft.rank(), weft.size()
    x = make(kind, [r, 2 * r], "float64")
    y = weft.neighbor_allreduce(x, name=f"nar.{kind}")
    check_type(y, x)
    expected = neighbor_average(r, lambda q: q)
    assert np.allclose(as_numpy(y), [expected, 2 * expected])

    # Weights matched by rank: give each in-neighbor a distinct weight.
    ins = weft.in_neighbor_ranks()
    src = {j: 0.1 * (k + 1) for k, j in enumerate(ins)}
    y = weft.neighbor_allreduce(x, self_weight=0.5, src_weights=src)
    assert np.allclose(as_numpy(y)[0], 0.5 * r + sum(w * j for j, w in src.items()))

    h = weft.neighbor_allreduce_nonblocking(x, self_weight=0.5, src_weights=src)
    assert np.allclose(as_numpy(weft.synchronize(h))[0], 0.5 * r + sum(w * j for j, w in src.items()))


def test_neighbor_allreduce_dynamic():
    r, n = weft.rank(), weft.size()
    x = np.array([float(r)])
    nxt, prv = (r + 1) % n, (r - 1) % n
    if n == 1:
        y = weft.neighbor_allreduce(x, self_weight=0.5, src_weights={}, dst_weights=[])
        assert y[0] == 0.5 * r
        return
    # A list of ranks: weight 1 on the sender's side.
    y = weft.neighbor_allreduce(x, self_weight=0.5, src_weights={prv: 0.5}, dst_weights=[nxt])
    assert np.isclose(y[0], 0.5 * r + 0.5 * prv)
    # A dict: the sender scales by its weight too.
    y = weft.neighbor_allreduce(x, self_weight=0.25, src_weights={prv: 0.5},
                                dst_weights={nxt: 1.5})
    assert np.isclose(y[0], 0.25 * r + 0.5 * 1.5 * prv)


def test_neighbor_allgather():
    r, n = weft.rank(), weft.size()
    x = np.array([[r, -r]], dtype=np.int32)
    y = weft.neighbor_allgather(x)
    ins = weft.in_neighbor_ranks()
    assert y.tolist() == [[j, -j] for j in ins]
    if n > 1:
        nxt, prv = (r + 1) % n, (r - 1) % n
        y = weft.neighbor_allgather(x, src_ranks=[prv], dst_ranks=[nxt])
        assert y.tolist() == [[prv, -prv]]
        h = weft.neighbor_allgather_nonblocking(x, src_ranks=[prv], dst_ranks=[nxt])
        assert weft.synchronize(h).tolist() == [[prv, -prv]]


def test_hierarchical_neighbor_allreduce():
    # All ranks of a test run share one machine: the result is the machine average.
    r, n = weft.rank(), weft.size()
    x = torch.tensor([float(r)])
    y = weft.hierarchical_neighbor_allreduce(x)
    assert torch.allclose(y, torch.tensor([(n - 1) / 2]))
    h = weft.hierarchical_neighbor_allreduce_nonblocking(x, name="hier.nb")
    assert torch.allclose(weft.synchronize(h), torch.tensor([(n - 1) / 2]))


def test_pair_gossip():
    r, n = weft.rank(), weft.size()
    if n % 2:
        pytest.skip("pairs need an even number of ranks")
    x = np.array([float(r)])
    peer = r ^ 1
    y = weft.pair_gossip(x, peer, self_weight=0.75, pair_weight=0.25)
    assert np.isclose(y[0], 0.75 * r + 0.25 * peer)
    y = weft.synchronize(weft.pair_gossip_nonblocking(x, peer))
    assert np.isclose(y[0], 0.5 * (r + peer))


@pytest.mark.parametrize("kind", KINDS)
def test_send_recv_ring(kind):
    r, n = weft.rank(), weft.size()
    if n == 1:
        pytest.skip("needs a peer")
    nxt, prv = (r + 1) % n, (r - 1) % n
    x = make(kind, [[r, 10 * r, 100 * r]], "float64")
    # Receive first (nonblocking, into a buffer), then send: named by the sender, so that
    # on 2 ranks (prv == nxt) the two directions do not match each other.
    buf = make(kind, np.zeros((1, 3)), "float64")
    h = weft.recv_nonblocking(prv, name=f"py.ring.{kind}.{prv}", out=buf)
    s = weft.send_nonblocking(x, nxt, name=f"py.ring.{kind}.{r}")
    assert weft.synchronize(s) is None
    assert weft.synchronize(h) is buf
    assert as_numpy(buf).tolist() == [[prv, 10 * prv, 100 * prv]]
    # Blocking, the other way round the ring. A blocking send waits for its receiver to
    # call recv: even ranks send first and odd ranks receive first, so that no cycle of
    # ranks all blocked in send forms.
    if r % 2 == 0:
        weft.send(x, prv, name=f"py.back.{kind}.{r}")
        got = weft.recv(nxt, name=f"py.back.{kind}.{nxt}", out=buf)
    else:
        got = weft.recv(nxt, name=f"py.back.{kind}.{nxt}", out=buf)
        weft.send(x, prv, name=f"py.back.{kind}.{r}")
    assert got is buf and as_numpy(buf)[0, 1] == 10 * nxt


def test_recv_takes_the_senders_dtype_and_shape():
    r, n = weft.rank(), weft.size()
    if n == 1:
        pytest.skip("needs a peer")
    if r == 0:
        for dst in range(1, n):
            weft.send(np.arange(2 * dst, dtype=np.int64).reshape(dst, 2) + 10 * dst, dst,
                      name="py.any")
            weft.send(torch.full((3,), dst + 0.5, dtype=torch.bfloat16), dst, name="py.any.t")
            weft.send(np.full((2, 2), dst, dtype=np.int32), dst)  # unnamed
    else:
        y = weft.recv(0, name="py.any")
        assert isinstance(y, np.ndarray) and y.dtype == np.int64 and y.shape == (r, 2)
        assert y.tolist() == (np.arange(2 * r).reshape(r, 2) + 10 * r).tolist()
        # bfloat16 has no NumPy dtype: as_torch gives a torch.Tensor.
        h = weft.recv_nonblocking(0, name="py.any.t", as_torch=True)
        t = weft.synchronize(h)
        assert isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16
        assert torch.equal(t, torch.full((3,), r + 0.5, dtype=torch.bfloat16))
        assert weft.wait(h) is t
        assert weft.recv(np.int64(0)).tolist() == [[r, r], [r, r]]
    weft.barrier()


def test_recv_into_a_non_contiguous_buffer():
    r, n = weft.rank(), weft.size()
    if n == 1:
        pytest.skip("needs a peer")
    if r == 0:
        weft.send(torch.arange(4.0), 1, name="py.strided")
    elif r == 1:
        base = torch.zeros(8)
        weft.recv(0, name="py.strided", out=base[::2])  # received, then copied back
        assert base.tolist() == [0, 0, 1, 0, 2, 0, 3, 0]
    weft.barrier()


@pytest.mark.parametrize("kind", KINDS)
def test_process_sets(kind):
    r, n = weft.rank(), weft.size()
    group = list(range(r % 2, n, 2))  # even and odd ranks: disjoint sets, the same names
    x = make(kind, [r, 2 * r], "float64")
    y = weft.allreduce(x, name=f"py.set.{kind}", ranks=group)
    check_type(y, x)
    mean = sum(group) / len(group)
    assert np.allclose(as_numpy(y), [mean, 2 * mean])
    total = sum(q + 1 for q in group)
    z = make(kind, [r + 1], "int64")
    assert weft.allreduce_(z, average=False, ranks=reversed(group)) is z  # unnamed, any order
    assert as_numpy(z)[0] == total
    h = weft.allreduce_nonblocking(x, average=False, name=f"py.set.nb.{kind}", ranks=group)
    assert np.allclose(as_numpy(weft.synchronize(h)), [sum(group), 2 * sum(group)])
    h = weft.allreduce_nonblocking_(x, average=False, ranks=group)
    assert weft.synchronize(h) is x and as_numpy(x)[0] == sum(group)

    root = group[-1]
    b = make(kind, [r, r], "int32")
    assert as_numpy(weft.broadcast(b, root, name=f"py.set.bc.{kind}", ranks=group)).tolist() \
        == [root, root]
    assert weft.broadcast_(b, group[0], ranks=group) is b and as_numpy(b)[0] == group[0]
    b = make(kind, [r, r], "int32")
    assert as_numpy(weft.synchronize(weft.broadcast_nonblocking(b, root, ranks=group)))[1] \
        == root
    assert weft.synchronize(weft.broadcast_nonblocking_(b, root, ranks=group)) is b
    assert as_numpy(b)[0] == root
    # Listing every rank is the world: it matches ranks that pass no set.
    w = weft.allreduce(np.ones(1), average=False, name="py.set.world",
                       ranks=range(n) if r == 0 else None)
    assert w[0] == n


def test_barrier():
    weft.barrier()
    weft.synchronize(weft.barrier_nonblocking())


def test_non_contiguous_and_read_only_inputs():
    n = weft.size()
    base = np.arange(8, dtype=np.float32)
    strided = base[::2]  # not contiguous: weft works on a contiguous copy
    y = weft.allreduce(strided, average=False)
    assert np.array_equal(y, n * base[::2])
    weft.allreduce_(strided, average=False)  # the in-place result is copied back
    assert np.array_equal(base[::2], n * np.arange(0, 8, 2)) and base[1] == 1
    frozen = np.ones(3)
    frozen.setflags(write=False)
    assert np.array_equal(weft.allreduce(frozen, average=False), np.full(3, float(n)))
    t = torch.ones(2, 3).t()  # a transposed view
    assert torch.equal(weft.allreduce(t, average=False), torch.full((3, 2), float(n)))
    g = torch.ones(2, requires_grad=True)
    assert torch.equal(weft.allreduce(g, average=False), torch.full((2,), float(n)))


def test_dropped_handle_is_safe():
    # The handle goes away before the op completes: the op keeps its arrays alive.
    for i in range(20):
        weft.allreduce_nonblocking(np.ones(1000), name=f"dropped.{i}")
    weft.barrier()
    y = weft.allreduce(np.ones(4), average=False)
    assert np.all(y == weft.size())


def test_blocking_call_releases_the_gil():
    if weft.size() == 1:
        pytest.skip("needs a second rank to wait for")
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    if weft.rank() == 0:
        time.sleep(0.5)  # everyone else waits for rank 0 inside allreduce
    thread = threading.Thread(target=spin)
    thread.start()
    weft.allreduce(np.ones(1), name="gil")
    stop.set()
    thread.join()
    if weft.rank() != 0:
        # Had the GIL been held during the wait, the spinning thread would not have run.
        assert count[0] > 1000, count[0]


def test_threads_waiting_for_one_handle_all_get_its_result():
    # Several threads synchronize (and poll) one handle at once: one finishes the op and
    # frees its request, the others get the same result, not a freed request or a second
    # take of an allgather's output.
    n, r = weft.size(), weft.rank()
    expected = np.repeat(np.arange(1, n + 1, dtype=np.float32), 300)
    for i in range(40):
        x = np.full(300, r + 1.0, dtype=np.float32)
        handle = weft.allgather_nonblocking(x, name=f"threads.{i}")
        results = [None] * 3
        errors = []

        def finish(k):
            try:
                results[k] = weft.synchronize(handle)
            except Exception as error:  # noqa: BLE001  (reported below)
                errors.append(error)

        threads = [threading.Thread(target=finish, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while not weft.poll(handle) and not errors and time.monotonic() < deadline:
            pass
        for t in threads:
            t.join(timeout=30)
        assert not errors, errors
        assert results[0] is results[1] is results[2]
        assert np.array_equal(results[0], expected)


def test_arrays_of_dropped_handles_are_released_once_their_ops_are_done():
    # weft's engine thread, which often drops an op last, never waits for the GIL to release
    # the op's arrays: it hands them to Python's main thread, which drops them soon (while
    # it runs Python code) or at the next op started. This checks that they are dropped;
    # how long the engine waited before is measured in bench/README.md ("Dropped handles").
    import gc
    import weakref
    x = torch.ones(70000)
    alive = weakref.ref(x)
    handle = weft.allreduce_nonblocking_(x, name="dropped.early")
    del handle, x
    weft.barrier()  # after the allreduce on every rank: it is done
    deadline = time.monotonic() + 10
    while alive() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.001)
    assert alive() is None, "the arrays of a dropped handle stayed alive after its op"


def test_config_and_timeline(tmp_path_factory):
    assert weft.config_get("WEFT_FUSION_THRESHOLD_BYTES").isdigit()
    weft.config_set("WEFT_FUSION_THRESHOLD_BYTES", 4096)
    assert weft.config_get("WEFT_FUSION_THRESHOLD_BYTES") == "4096"
    weft.config_unset("WEFT_FUSION_THRESHOLD_BYTES")
    assert "WEFT_TIMELINE" in weft.config_describe()
    with pytest.raises(weft.InvalidArgumentError, match="an integer"):
        weft.config_set("WEFT_FUSION_THRESHOLD_BYTES", "lots")
    with pytest.raises(weft.InvalidArgumentError, match="not a weft setting"):
        weft.config_get("WEFT_NO_SUCH_THING")

    path = tmp_path_factory.mktemp(f"trace{weft.rank()}") / "trace.json"
    weft.timeline_start(str(path))
    with weft.timeline_context("py.trace", "py.compute"):
        weft.allreduce(np.ones(2), name="py.trace")
    weft.timeline_stop()
    files = list(path.parent.iterdir())
    assert len(files) == 1
    text = files[0].read_text()
    assert "py.compute" in text and '"py.trace"' in text
