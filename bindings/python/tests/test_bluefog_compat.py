"""weft.torch as a stand-in for bluefog.torch: every name Bluefog exports, its parameters and
return types, written from Bluefog's documented API (1, 2 and 4 ranks)."""
import warnings

import networkx as nx
import numpy as np
import pytest
import torch

import weft
import weft.torch as bf
from weft import topology as topology_util

# bluefog.torch's exports (ops, windows, queries, timeline, optimizers, helpers, graphs).
BLUEFOG_TORCH_NAMES = """
init shutdown size local_size rank local_rank machine_size machine_rank is_homogeneous
load_topology set_topology load_machine_topology set_machine_topology in_neighbor_ranks
out_neighbor_ranks in_neighbor_machine_ranks out_neighbor_machine_ranks
mpi_threads_supported unified_mpi_window_model_supported nccl_built suspend resume
set_skip_negotiate_stage get_skip_negotiate_stage
allreduce allreduce_ allreduce_nonblocking allreduce_nonblocking_ broadcast broadcast_
broadcast_nonblocking broadcast_nonblocking_ allgather allgather_nonblocking
neighbor_allgather neighbor_allgather_nonblocking neighbor_allreduce
neighbor_allreduce_nonblocking hierarchical_neighbor_allreduce
hierarchical_neighbor_allreduce_nonblocking poll synchronize wait barrier
win_create win_free win_update win_update_then_collect win_put win_put_nonblocking
win_accumulate win_accumulate_nonblocking win_get win_get_nonblocking neighbor_win_put
neighbor_win_put_nonblocking neighbor_win_accumulate neighbor_win_accumulate_nonblocking
neighbor_win_get neighbor_win_get_nonblocking win_poll win_wait win_mutex get_win_version
get_current_created_window_names win_associated_p turn_on_win_ops_with_associated_p
turn_off_win_ops_with_associated_p
timeline_start_activity timeline_end_activity timeline_context
CommunicationType DistributedAdaptWithCombineOptimizer DistributedAdaptThenCombineOptimizer
DistributedGradientAllreduceOptimizer DistributedWinPutOptimizer
DistributedAllreduceOptimizer DistributedNeighborAllreduceOptimizer
DistributedHierarchicalNeighborAllreduceOptimizer
broadcast_parameters allreduce_parameters broadcast_optimizer_state
GetRecvWeights GetSendWeights IsRegularGraph IsTopologyEquivalent ExponentialTwoGraph
ExponentialGraph FullyConnectedGraph MeshGrid2DGraph RingGraph StarGraph
SymmetricExponentialGraph GetDynamicOnePeerSendRecvRanks GetExp2DynamicSendRecvMachineRanks
GetInnerOuterRingDynamicSendRecvRanks GetInnerOuterExpo2DynamicSendRecvRanks
InferSourceFromDestinationRanks InferDestinationFromSourceRanks
""".split()

TOPOLOGY_UTIL_NAMES = """
isPowerOf ExponentialTwoGraph ExponentialGraph SymmetricExponentialGraph MeshGrid2DGraph
StarGraph RingGraph FullyConnectedGraph GetRecvWeights GetSendWeights IsRegularGraph
IsTopologyEquivalent GetDynamicOnePeerSendRecvRanks GetExp2DynamicSendRecvMachineRanks
GetInnerOuterRingDynamicSendRecvRanks GetInnerOuterExpo2DynamicSendRecvRanks
""".split()


@pytest.fixture(autouse=True)
def default_topology():
    yield
    bf.set_topology(bf.ExponentialGraph(bf.size()))


def test_every_bluefog_name_is_there():
    assert [n for n in BLUEFOG_TORCH_NAMES if not hasattr(bf, n)] == []
    assert [n for n in TOPOLOGY_UTIL_NAMES if not hasattr(topology_util, n)] == []
    assert set(BLUEFOG_TORCH_NAMES) <= set(bf.__all__)


def test_generators_return_weighted_digraphs():
    ring = topology_util.RingGraph(4)
    assert isinstance(ring, nx.DiGraph)
    assert sorted(ring.nodes()) == [0, 1, 2, 3]
    # Self weights are self loops; every weight of the bidirectional ring is 1/3.
    assert ring.has_edge(2, 2) and ring.has_edge(2, 1) and ring.has_edge(2, 3)
    assert all(abs(d["weight"] - 1 / 3) < 1e-12 for _, _, d in ring.edges(data=True))
    w = nx.to_numpy_array(topology_util.ExponentialTwoGraph(8))
    assert np.allclose(w.sum(axis=1), 1.0)
    assert topology_util.MeshGrid2DGraph(6).number_of_nodes() == 6
    # Both ways between networkx and weft's own Topology.
    back = weft.Topology.from_networkx(ring).to_networkx()
    assert topology_util.IsTopologyEquivalent(back, ring)


def test_equivalence_compares_weights_and_regularity_counts_both_directions():
    ring = topology_util.RingGraph(5)
    heavier = ring.copy()
    heavier[0][1]["weight"] = 0.5
    assert topology_util.IsTopologyEquivalent(ring, ring.copy())
    assert not topology_util.IsTopologyEquivalent(ring, heavier)
    assert not topology_util.IsTopologyEquivalent(ring, None)
    assert topology_util.IsRegularGraph(topology_util.ExponentialTwoGraph(8))
    assert not topology_util.IsRegularGraph(topology_util.StarGraph(4))


def test_is_power_of():
    assert topology_util.isPowerOf(1, 2) and topology_util.isPowerOf(8, 2)
    assert topology_util.isPowerOf(81, 3) and not topology_util.isPowerOf(12, 2)
    assert not topology_util.isPowerOf(0, 2)
    with pytest.raises(ValueError):
        topology_util.isPowerOf(4, 1)


def test_load_topology_returns_the_graph_set():
    n = bf.size()
    g = bf.RingGraph(n)
    assert bf.set_topology(g) is True
    assert bf.load_topology() is g
    assert list(bf.load_topology().nodes()) == list(range(n))
    # The same graph, weights included: True, nothing changes.
    assert bf.set_topology(bf.RingGraph(n)) is True
    assert bf.IsTopologyEquivalent(bf.load_topology(), g)


def test_set_topology_refuses_what_is_not_a_graph_of_the_world():
    with pytest.raises(TypeError):
        bf.set_topology("ring")
    with pytest.raises(TypeError):
        bf.set_topology(bf.RingGraph(bf.size() + 1))
    with pytest.raises(TypeError):
        bf.set_machine_topology(bf.RingGraph(bf.machine_size() + 1))
    with pytest.raises(ValueError):
        bf.set_machine_topology(None)


def test_init_again_resets_the_topology():
    n = bf.size()
    bf.set_topology(bf.RingGraph(n))
    bf.init()  # a second call: only the topology, back to the default
    assert weft.is_initialized()
    assert bf.IsTopologyEquivalent(bf.load_topology(), bf.ExponentialGraph(n))
    assert not bf.is_topo_weighted()
    def lopsided(size):  # never the default graph, whatever the size
        g = bf.ExponentialGraph(size)
        for i in range(size):
            g[i][i]["weight"] = 0.6
        return g

    bf.init(topology_fn=lopsided, is_weighted=True)
    assert bf.IsTopologyEquivalent(bf.load_topology(), lopsided(n))
    assert bf.is_topo_weighted()
    # The weighted ring is what neighbor_allreduce uses by default.
    x = torch.full((3,), float(bf.rank()))
    self_weight, src = bf.GetRecvWeights(bf.load_topology(), bf.rank())
    expected = self_weight * bf.rank() + sum(w * r for r, w in src.items())
    assert torch.allclose(bf.neighbor_allreduce(x), torch.full((3,), expected))


def test_win_update_uses_a_weighted_topologys_weights():
    n, me = bf.size(), bf.rank()
    g = bf.ExponentialGraph(n)
    for i in range(n):
        g[i][i]["weight"] = 0.6  # never uniform
    assert bf.set_topology(g, is_weighted=True)
    x = torch.full((3,), float(me), dtype=torch.float64)
    assert bf.win_create(x, "compat.weighted")
    try:
        bf.win_put(x, "compat.weighted")
        bf.barrier()
        got = bf.win_update("compat.weighted", clone=True)
        self_weight, src = bf.GetRecvWeights(g, me)
        expected = self_weight * me + sum(w * r for r, w in src.items())
        assert torch.allclose(got, torch.full((3,), expected, dtype=torch.float64))
    finally:
        bf.win_free("compat.weighted")


def test_uniform_averages_are_a_sum_then_a_division():
    n = bf.size()
    torch.manual_seed(11)
    x = torch.rand(n, 1000)[bf.rank()].clone()
    total = bf.allreduce(x, average=False, name="compat.sum")
    assert torch.equal(bf.allreduce(x, name="compat.avg"), total / n)
    # The uniform neighbor average: self plus in-neighbors in rank order, then / (k + 1).
    gathered = bf.neighbor_allgather(x.reshape(1, -1), name="compat.gather")
    expected = x.clone()
    for row in gathered:
        expected += row
    expected /= len(bf.in_neighbor_ranks()) + 1
    assert torch.equal(bf.neighbor_allreduce(x, name="compat.navg"), expected)


def test_allreduce_takes_is_hierarchical_local_third():
    n = bf.size()
    x = torch.full((4,), float(bf.rank() + 1))
    # On one machine, this machine's ranks are every rank.
    local = bf.allreduce(x, True, True)
    assert torch.allclose(local, torch.full((4,), (n + 1) / 2))
    summed = bf.allreduce(x, False, False, "compat.sum")
    assert torch.allclose(summed, torch.full((4,), n * (n + 1) / 2))
    y = x.clone()
    bf.allreduce_(y, average=True, is_hierarchical_local=True, name="compat.local")
    assert torch.allclose(y, local)
    h = bf.allreduce_nonblocking(x, True, False, "compat.nb")
    assert torch.allclose(bf.synchronize(h), torch.full((4,), (n + 1) / 2))


def test_process_queries():
    assert bf.is_homogeneous() is True  # one host, or machines of consecutive ranks
    assert bf.mpi_threads_supported() is True
    assert isinstance(bf.unified_mpi_window_model_supported(), bool)
    assert isinstance(bf.nccl_built(), bool)
    assert bf.in_neighbor_machine_ranks() == [] and bf.out_neighbor_machine_ranks() == []
    assert isinstance(bf.load_machine_topology(), nx.DiGraph)
    assert not bf.get_skip_negotiate_stage()
    bf.set_skip_negotiate_stage(True)
    assert bf.get_skip_negotiate_stage()
    bf.set_skip_negotiate_stage(False)
    with pytest.raises(EnvironmentError):
        bf.suspend()
    with pytest.raises(EnvironmentError):
        bf.resume()


def test_timeline_markers_say_whether_a_timeline_is_written():
    assert bf.timeline_start_activity("x", "forward") is False
    assert bf.timeline_end_activity("x") is False
    with bf.timeline_context("x", "forward"):
        pass


def test_window_names_and_neighbor_win_spellings():
    assert bf.neighbor_win_put is bf.win_put
    assert bf.neighbor_win_get_nonblocking is bf.win_get_nonblocking
    a, b = torch.zeros(3), torch.zeros(2)
    assert bf.win_create(b, "compat.b") and bf.win_create(a, "compat.a")
    try:
        assert bf.get_current_created_window_names() == ["compat.a", "compat.b"]
        assert bf.neighbor_win_put(a, "compat.a")
        assert bf.win_wait(bf.neighbor_win_accumulate_nonblocking(b, "compat.b")) is True
    finally:
        bf.win_free()
    assert bf.get_current_created_window_names() == []
    with pytest.raises(KeyError):
        bf.win_free("compat.never")


def test_infer_the_other_side_of_a_dynamic_exchange():
    n, me = bf.size(), bf.rank()
    dst = [(me + 1) % n] if n > 1 else []
    src = bf.InferSourceFromDestinationRanks(dst)
    assert src == ([(me - 1) % n] if n > 1 else [])
    src, w = bf.InferSourceFromDestinationRanks(dst, construct_adjacency_matrix=True)
    assert w.shape == (n, n) and np.allclose(w.sum(axis=0), 1.0)
    if n > 1:
        assert w[me, (me + 1) % n] > 0 and w[me, me] > 0
    assert bf.InferDestinationFromSourceRanks(src) == dst
    # A star (not regular): each receiver's weights sum to 1, so rank 0's column is 1/n
    # and every other column 1/2.
    star_dst = list(range(1, n)) if me == 0 else [0]
    src, w = bf.InferSourceFromDestinationRanks(star_dst, construct_adjacency_matrix=True)
    assert src == star_dst
    expected = np.eye(n)
    expected[0, :] = 1.0
    expected[:, 0] = 1.0
    expected /= expected.sum(axis=0, keepdims=True)
    assert np.allclose(w, expected)
    dst_back, w_back = bf.InferDestinationFromSourceRanks(src, construct_adjacency_matrix=True)
    assert dst_back == star_dst and np.allclose(w_back, expected)
    with pytest.raises(ValueError):
        bf.InferSourceFromDestinationRanks([me])


def _model():
    torch.manual_seed(7)
    return torch.nn.Linear(4, 2)


def test_deprecated_optimizers_warn_and_adapt_with_combine():
    model = _model()
    with pytest.warns(PendingDeprecationWarning):
        opt = bf.DistributedNeighborAllreduceOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), model)
    assert isinstance(opt, bf.DistributedAdaptWithCombineOptimizer)
    assert opt.communication_type is bf.CommunicationType.neighbor_allreduce
    opt.close()
    with pytest.warns(PendingDeprecationWarning):
        opt = bf.DistributedAllreduceOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                               model)
    assert opt.communication_type is bf.CommunicationType.allreduce
    opt.close()


def _train_eval_train(eval_without_no_grad):
    model = _model()
    bf.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = bf.DistributedAdaptWithCombineOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                  model, bf.CommunicationType.allreduce)
    x = torch.full((3, 4), float(bf.rank() + 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a StepCountWarning fails the test
        for epoch in range(2):
            model.train()
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            model.eval()  # a test loop, as Bluefog's examples write it
            if eval_without_no_grad:
                model(x)
                model(x)
            else:
                with torch.no_grad():
                    model(x)
    opt.close()
    return [p.detach().clone() for p in model.parameters()]


def test_forward_passes_in_eval_mode_neither_count_nor_communicate():
    # Bluefog's hooks skip modules that are not training: the same numbers as under no_grad.
    for a, b in zip(_train_eval_train(True), _train_eval_train(False)):
        assert torch.equal(a, b)


def test_an_optimizer_over_a_list_of_models_communicates_each():
    n, me = bf.size(), bf.rank()
    bf.set_topology(topology_util.ExponentialGraph(n))
    models = [torch.nn.Linear(2, 2), torch.nn.Linear(3, 1)]
    for m in models:
        for p in m.parameters():
            p.data.fill_(me + 1.0)
    params = [p for m in models for p in m.parameters()]
    opt = bf.DistributedAdaptWithCombineOptimizer(torch.optim.SGD(params, lr=0.0), models,
                                                  bf.CommunicationType.neighbor_allreduce)
    for m in models:
        m(torch.ones(1, m.in_features)).sum().backward()
    opt.step()
    ins = bf.in_neighbor_ranks()
    expected = (me + 1.0 + sum(j + 1.0 for j in ins)) / (len(ins) + 1)
    for p in params:
        assert torch.allclose(p.detach(), torch.full_like(p, expected))
    opt.close()
    with pytest.raises(TypeError):
        bf.DistributedAdaptWithCombineOptimizer(torch.optim.SGD(params, lr=0.0), [])
    # Two models sharing a layer: the shared parameters communicate once per round.
    shared = torch.nn.Linear(2, 2)
    pair = [torch.nn.Sequential(shared, torch.nn.Linear(2, 1)),
            torch.nn.Sequential(shared, torch.nn.Linear(2, 3))]
    params = list({id(p): p for m in pair for p in m.parameters()}.values())
    opt = bf.DistributedAdaptWithCombineOptimizer(torch.optim.SGD(params, lr=0.1), pair,
                                                  bf.CommunicationType.allreduce)
    for _ in range(2):
        opt.zero_grad()
        for m in pair:
            m(torch.ones(1, 2)).sum().backward()
        opt.step()
    opt.close()


def test_win_put_optimizer_window_prefix_and_unregister():
    model = _model()
    opt = bf.DistributedWinPutOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model,
                                        window_prefix="mine")
    assert bf.get_current_created_window_names() == ["mine.bias", "mine.weight"]
    opt.unregister_window()
    assert bf.get_current_created_window_names() == []


def test_synchronize_then_step_updates_once_with_averaged_gradients():
    n = bf.size()
    model = _model()
    bf.broadcast_parameters(model.state_dict(), root_rank=0)
    start = [p.detach().clone() for p in model.parameters()]
    opt = bf.DistributedGradientAllreduceOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0), model)
    x = torch.full((1, 4), float(bf.rank() + 1))
    model(x).sum().backward()
    opt.synchronize()
    # Gradient of sum(W x + b): dW = x per row, db = 1; averaged over ranks.
    mean_x = (n + 1) / 2
    assert torch.allclose(model.weight.grad, torch.full((2, 4), mean_x))
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    with opt.skip_synchronize():
        opt.step()
    assert torch.allclose(model.weight.detach(), start[0] - mean_x)
    assert torch.allclose(model.bias.detach(), start[1] - 1.0)
    opt.close()


def test_bluefog_environment_variables_stand_for_weft_settings(monkeypatch):
    for name in ("WEFT_FUSION_THRESHOLD_BYTES", "WEFT_TIMELINE", "WEFT_ENGINE_MAX_SLEEP_MICROS",
                 "WEFT_ALLREDUCE_BY_MPI", "WEFT_RANKS_PER_MACHINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BLUEFOG_FUSION_THRESHOLD", "1234")
    monkeypatch.setenv("BLUEFOG_TIMELINE", "/tmp/bf-trace-")  # rank r writes <prefix><r>.json
    monkeypatch.setenv("BLUEFOG_CYCLE_TIME", "0.5")  # milliseconds
    monkeypatch.setenv("BLUEFOG_ALLREDUCE_BY_MPI", "yes")  # only "1" is on for Bluefog
    monkeypatch.setenv("BLUEFOG_NODES_PER_MACHINE", "1")
    assert weft.config_get("WEFT_FUSION_THRESHOLD_BYTES") == "1234"
    assert weft.config_get("WEFT_TIMELINE") == "/tmp/bf-trace-%r.json"
    assert weft.config_get("WEFT_ENGINE_MAX_SLEEP_MICROS") == "500"
    assert weft.config_get("WEFT_ALLREDUCE_BY_MPI") == "0"
    assert weft.config_get("WEFT_RANKS_PER_MACHINE") == "1"
    monkeypatch.setenv("WEFT_FUSION_THRESHOLD_BYTES", "99")  # weft's own wins
    assert weft.config_get("WEFT_FUSION_THRESHOLD_BYTES") == "99"


def test_bluefog_nodes_per_machine_may_leave_the_last_machine_short(monkeypatch):
    # Bluefog's own hierarchical tests set 2 and run on any number of ranks.
    n, me = bf.size(), bf.rank()
    weft.shutdown()
    monkeypatch.delenv("WEFT_RANKS_PER_MACHINE", raising=False)
    monkeypatch.setenv("BLUEFOG_NODES_PER_MACHINE", "2")
    try:
        bf.init()
        assert bf.local_rank() == me % 2
        assert bf.local_size() == (2 if me < n - n % 2 else 1)
        assert bf.machine_rank() == me // 2 and bf.machine_size() == (n + 1) // 2
    finally:
        weft.shutdown()
        monkeypatch.delenv("BLUEFOG_NODES_PER_MACHINE")
        weft.init()  # the session's own state


def test_int16_tensors_like_every_other_integer():
    n, me = bf.size(), bf.rank()
    x = torch.full((5,), me + 1, dtype=torch.int16)
    assert bf.allreduce(x, average=False, name="compat.i16").dtype == torch.int16
    assert torch.equal(bf.allreduce(x, average=False, name="compat.i16s"),
                       torch.full((5,), n * (n + 1) // 2, dtype=torch.int16))
    assert torch.equal(bf.broadcast(x, 0, name="compat.i16b"), torch.ones(5, dtype=torch.int16))
    gathered = bf.allgather(x.reshape(1, 5), name="compat.i16g")
    assert gathered.dtype == torch.int16 and gathered[:, 0].tolist() == list(range(1, n + 1))
    assert bf.neighbor_allgather(x.reshape(1, 5), name="compat.i16n").dtype == torch.int16


def test_associated_p_follows_the_switch():
    x = torch.ones(2, dtype=torch.float64)
    assert bf.win_create(x, "compat.p")
    try:
        bf.turn_off_win_ops_with_associated_p()
        bf.win_put(x, "compat.p", self_weight=0.5)
        bf.win_update("compat.p")
        assert bf.win_associated_p("compat.p") == 1.0  # left alone, as Bluefog starts
        bf.turn_on_win_ops_with_associated_p()
        bf.win_put(x, "compat.p", self_weight=0.5)
        assert bf.win_associated_p("compat.p") == 0.5
        bf.barrier()
    finally:
        bf.win_free("compat.p")
        weft.turn_on_win_ops_with_associated_p()
