"""weft.topology: generators, weights, schedules, networkx conversion, set_topology."""
import numpy as np
import pytest

import weft
from weft import topology as tu

T = weft.Topology.coerce  # the generators return networkx graphs; Topology has the queries


def test_generators_match_comm_md():
    w = T(tu.ExponentialTwoGraph(8)).weight_matrix()
    assert np.allclose(w[0][[0, 1, 2, 4]], 0.25) and w[0].sum() == pytest.approx(1)
    assert tu.IsTopologyEquivalent(tu.ExponentialGraph(8, base=2), tu.ExponentialTwoGraph(8))
    # 3^5 = 243 < 300: the exact integer powers reach it.
    assert 243 in T(tu.ExponentialGraph(300, base=3)).out_neighbors(0)
    ring = T(tu.RingGraph(5))
    assert ring.out_neighbors(0) == [1, 4] and ring.weight(0, 1) == pytest.approx(1 / 3)
    assert T(tu.RingGraph(5, connect_style=1)).out_neighbors(2) == [1]
    assert T(tu.RingGraph(5, connect_style=2)).out_neighbors(2) == [3]
    star = T(tu.StarGraph(4))
    assert star.weight(0, 0) == pytest.approx(0.25) and star.weight(1, 1) == pytest.approx(0.75)
    assert T(tu.MeshGrid2DGraph(6)).out_neighbors(0) == [1, 3]
    assert T(tu.MeshGrid2DGraph(6, shape=(3, 2))).out_neighbors(0) == [1, 2]
    assert np.allclose(T(tu.FullyConnectedGraph(3)).weight_matrix(), 1 / 3)
    assert T(tu.SymmetricExponentialGraph(16)).out_neighbors(0) == [1, 4, 12, 15]


def test_weights_and_regularity():
    topo = tu.ExponentialTwoGraph(8)
    assert tu.GetRecvWeights(topo, 0) == (0.25, {4: 0.25, 6: 0.25, 7: 0.25})
    assert tu.GetSendWeights(topo, 0) == (0.25, {1: 0.25, 2: 0.25, 4: 0.25})
    assert tu.IsRegularGraph(topo) and not tu.IsRegularGraph(tu.StarGraph(4))
    assert not tu.IsTopologyEquivalent(topo, tu.RingGraph(8))
    assert not tu.IsTopologyEquivalent(topo, None)


def test_weight_matrix_round_trip_and_editing():
    w = np.array([[0.5, 0.5, 0], [0, 0.5, 0.5], [0.5, 0, 0.5]])
    topo = weft.Topology.from_weight_matrix(w)
    assert np.array_equal(topo.weight_matrix(), w)
    copy = topo.copy()
    copy.add_edge(2, 1, 0.25)
    copy.set_self_weight(2, 0.25)
    assert copy.weight(2, 1) == 0.25 and topo.weight(2, 1) == 0
    assert copy != topo and topo == weft.Topology.from_weight_matrix(w)
    with pytest.raises(ValueError, match="square"):
        weft.Topology.from_weight_matrix(np.ones((2, 3)))
    with pytest.raises(weft.InvalidArgumentError):
        topo.add_edge(1, 1, 0.5)


def test_networkx_round_trip():
    nx = pytest.importorskip("networkx")
    topo = T(tu.ExponentialTwoGraph(8))
    g = topo.to_networkx()
    assert isinstance(g, nx.DiGraph) and g[0][4]["weight"] == pytest.approx(0.25)
    assert g.has_edge(0, 0)  # the self weight is a self loop, as in Bluefog
    assert weft.Topology.from_networkx(g) == topo
    assert tu.GetRecvWeights(g, 0) == tu.GetRecvWeights(topo, 0)


def test_dynamic_schedules():
    steps = tu.GetDynamicOnePeerSendRecvRanks(tu.ExponentialTwoGraph(4), 0)
    assert [next(steps) for _ in range(4)] == [([1], [3]), ([2], [2]), ([1], [3]), ([2], [2])]
    steps = tu.GetExp2DynamicSendRecvMachineRanks(16, 4, 0, 0)  # 4 machines
    assert [next(steps) for _ in range(3)] == [([1], [3]), ([2], [2]), ([1], [3])]
    ring = tu.GetInnerOuterRingDynamicSendRecvRanks(8, 4, 0)
    send, recv = next(ring)
    assert send and recv
    expo = tu.GetInnerOuterExpo2DynamicSendRecvRanks(8, 4, 5)
    assert len([next(expo) for _ in range(5)]) == 5
    with pytest.raises(weft.InvalidArgumentError):
        next(tu.GetInnerOuterRingDynamicSendRecvRanks(8, 3, 0))


def test_bad_generator_arguments():
    with pytest.raises(weft.InvalidArgumentError, match="mesh"):
        tu.MeshGrid2DGraph(6, shape=(4, 4))
    with pytest.raises(weft.InvalidArgumentError):
        tu.RingGraph(0)
    with pytest.raises(TypeError):
        weft.set_topology("ring")


def test_set_and_load_topology():
    n = weft.size()
    assert weft.set_topology(tu.RingGraph(n), is_weighted=True)
    assert weft.is_topo_weighted()
    assert tu.IsTopologyEquivalent(weft.load_topology(), tu.RingGraph(n))
    expected = sorted({(weft.rank() + 1) % n, (weft.rank() - 1) % n} - {weft.rank()})
    assert weft.in_neighbor_ranks() == expected
    x = np.array([float(weft.rank())])
    recv = tu.GetRecvWeights(tu.RingGraph(n), weft.rank())
    y = weft.neighbor_allreduce(x)  # the topology's weights now
    assert np.isclose(y[0], recv[0] * weft.rank() + sum(w * j for j, w in recv[1].items()))
    nx = pytest.importorskip("networkx")
    assert weft.set_topology(T(tu.ExponentialTwoGraph(n)))  # a Topology too
    assert not weft.is_topo_weighted()
    assert weft.set_topology()  # back to the default exponential graph
    assert tu.IsTopologyEquivalent(weft.load_topology(), tu.ExponentialGraph(n))
    assert weft.load_machine_topology().size == weft.machine_size()
