# The Julia binding against a real libweft. Needs Julia (not packaged for Debian 12, so CI
# only parses this file: //bindings/julia:julia_binding_test). By hand:
#
#   export LIBWEFT=$PWD/bazel-bin/capi/libweft.so
#   julia --project=bindings/julia/Weft -e 'using Pkg; Pkg.test()'            # one rank
#   mpirun -np 4 julia --project=bindings/julia/Weft bindings/julia/Weft/test/runtests.jl

using Test
using Weft

@testset "topologies (no init needed)" begin
    topo = ExponentialTwoGraph(4)
    W = weight_matrix(topo)
    @test Base.size(W) == (4, 4)
    @test all(isapprox.(sum(W; dims=2), 1.0))           # every row is normalized
    @test W[1, 2] > 0 && W[1, 3] > 0 && W[1, 4] == 0    # rank 0 sends to 1 and 2
    @test num_ranks(topo) == 4
    @test out_neighbors(topo, 0) == [1, 2]
    @test IsRegularGraph(topo)

    same = Topology(W)
    @test IsTopologyEquivalent(same, topo)
    @test weight_matrix(same) == W
    @test !IsTopologyEquivalent(RingGraph(4), FullyConnectedGraph(4))

    self_weight, neighbors = GetRecvWeights(topo, 0)
    @test self_weight == W[1, 1]
    @test neighbors == Dict(r => W[r + 1, 1] for r in in_neighbors(topo, 0))
    self_weight, neighbors = GetSendWeights(topo, 0)
    @test neighbors == Dict(1 => W[1, 2], 2 => W[1, 3])

    steps = collect(Iterators.take(GetDynamicOnePeerSendRecvRanks(topo, 0), 4))
    @test length(steps) == 4
    @test all(length(send) == 1 for (send, recv) in steps)  # one peer per step
    @test Base.IteratorSize(Weft.Schedule) == Base.IsInfinite()

    @test num_ranks(MeshGrid2DGraph(6; shape=(2, 3))) == 6
    @test num_ranks(copy(StarGraph(5; center=2))) == 5
    @test_throws WeftError StarGraph(4; center=7)
    err = try
        RingGraph(0)
    catch e
        e
    end
    @test err isa WeftError && err.status != 0 && !isempty(err.message)
end

@testset "collectives" begin
    Weft.init()
    @test is_initialized()
    n, r = Weft.size(), Weft.rank()
    @test 0 <= r < n

    @test allreduce(fill(Float64(r), 3)) == fill((n - 1) / 2, 3)
    x = fill(Int32(r), 2, 2)
    @test allreduce!(x; average=false) === x
    @test x == fill(Int32(n * (n - 1) ÷ 2), 2, 2)

    @test Weft.broadcast(fill(Float32(r), 4), 0) == zeros(Float32, 4)

    # Concatenation along Julia's last dimension, in rank order.
    @test allgather([Int64(r)]) == collect(0:n-1)
    @test allgather(fill(UInt8(r), 2, 1)) == repeat(reshape(UInt8.(0:n-1), 1, n), 2, 1)

    set_topology(FullyConnectedGraph(n))
    @test in_neighbor_ranks() == [k for k in 0:n-1 if k != r]
    y = neighbor_allreduce(fill(Float64(r), 5))
    @test y ≈ fill((n - 1) / 2, 5)
    others = Dict(k => 1.0 / n for k in 0:n-1 if k != r)
    @test neighbor_allreduce(fill(1.0, 2); self_weight=1.0 / n, src_weights=others) ≈ [1.0, 1.0]
    @test_throws ArgumentError neighbor_allreduce([1.0]; self_weight=0.5)

    gathered = neighbor_allgather(fill(Float64(r), 1))
    @test gathered == Float64[k for k in 0:n-1 if k != r]

    h = allreduce_nonblocking(fill(Float16(1), 8); average=false, name="nonblocking")
    @test wait(h) == fill(Float16(n), 8)
    @test Weft.synchronize(h) == fill(Float16(n), 8)  # waiting again: the same result
    @test poll(h)

    # A dropped handle: its arrays must stay alive until the op completes.
    allreduce_nonblocking(rand(1000); name="dropped")
    GC.gc()
    barrier()

    if n % 2 == 0
        peer = isodd(r) ? r - 1 : r + 1
        @test pair_gossip([Float64(r)], peer) ≈ [(r + peer) / 2]
    end

    if n > 1  # shapes differ between ranks: an error on every rank, not a hang
        @test_throws WeftError allreduce(fill(1.0, r + 1); name="mismatched shapes")
    end
    @test !isempty(config_describe())
    Weft.shutdown()
end
