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

# Runs `pattern` (F: a counted computation, S / s: a step expected to communicate / not,
# ' ': nothing) through `c`; returns the numbers of the computations that were a misuse.
function run_pattern(c::StepCounter, pattern::AbstractString)
    misuses = Int[]
    f = 0
    for ch in pattern
        if ch == 'F'
            f += 1
            event = computation!(c)
            @test event in (:counted, :communicate, :misuse)
            event == :misuse && push!(misuses, f)
        elseif ch != ' '
            @test step!(c) == (ch == 'S')
        end
    end
    return misuses
end

@testset "step counter (no init needed)" begin
    # J = 3: the design's admissible patterns (the last one drifts, silently by design)...
    for p in ("FFFS", "FsFsFS", "FFsFS", "FsFFS", "FFFS FFFS", "FsFsFSFs FsFSFsFs")
        c = StepCounter(3)
        @test run_pattern(c, p) == Int[]
        @test misuse_warning(c) == ""
    end
    # ... and the inadmissible ones warn once, at the 4th F.
    for p in ("FFFFS", "FFsFFS")
        c = StepCounter(3)
        @test run_pattern(c, p) == [4]
        w = misuse_warning(c)
        @test occursin("num_steps_per_communication", w)
        @test occursin("forward computation just counted is number 4", w)
        @test !occursin("backward", w)
    end

    c = StepCounter(3)
    @test steps_per_communication(c) == 3
    @test countdown(c) == 3
    @test computations(c) == (total=0, since_communication=0)
    @test computation!(c) == :counted
    @test countdown(c) == 2
    @test computation!(c; counted=false) == :ignored  # under no-grad: nothing changes
    @test computation!(c) == :counted
    @test step!(c) == false
    @test countdown(c, 1) == 1
    @test computation!(c) == :communicate
    @test countdown(c) == 0
    @test computations(c).since_communication == 3
    @test step!(c) == true
    @test countdown(c) == 3
    @test computations(c) == (total=3, since_communication=0)
    @test set_steps_per_communication!(c, 2) === c  # nothing counted: at once
    @test steps_per_communication(c) == 2
    @test run_pattern(c, "FFS F") == Int[]
    set_steps_per_communication!(c, 1)              # mid-round: from the next S
    @test steps_per_communication(c) == 2
    @test run_pattern(c, "sFS FS FS") == Int[]
    @test steps_per_communication(c) == 1
    @test_throws WeftError set_steps_per_communication!(c, 0)
    @test_throws ArgumentError computation!(c, 2)   # one unit: unit 1 only
    @test_throws ArgumentError countdown(c, 0)
    @test occursin("counts=:forward", sprint(show, c))

    # A step before any counted computation: the optimizer is not seeing the model.
    c = StepCounter(1; counts=:backward)
    @test computation!(c; counted=false) == :ignored
    err = try
        step!(c)
    catch e
        e
    end
    @test err isa WeftError && err.status == Weft.CAPI.WEFT_ERR_FAILED_PRECONDITION &&
          occursin("before any counted backward computation", err.message)

    err = try
        StepCounter(0)
    catch e
        e
    end
    @test err isa WeftError && err.status == Weft.CAPI.WEFT_ERR_INVALID_ARGUMENT &&
          occursin("num_steps_per_communication", err.message)
    @test_throws WeftError StepCounter(3; units=0)
    @test_throws ArgumentError StepCounter(3; counts=:sideways)

    # Backward, three parameters, J = 2: a pass that finds units at 0 warns once.
    c = StepCounter(2; counts=:backward, units=3)
    @test [computation!(c, u) for u in (3, 2, 1)] == [:counted, :counted, :counted]
    @test step!(c) == false
    @test [computation!(c, u) for u in (3, 2, 1)] == [:communicate, :communicate, :communicate]
    @test [computation!(c, u) for u in (2, 1, 3)] == [:misuse, :counted, :counted]
    @test occursin("backward computation just counted is number 3", misuse_warning(c))
    @test computations(c) == (total=3, since_communication=3)
    @test step!(c) == true
    @test [countdown(c, u) for u in 1:3] == [2, 2, 2]

    finalize(c)                                      # frees it at once
    @test c.ptr == C_NULL
    @test sprint(show, c) == "Weft.StepCounter(freed)"
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
    @testset "windows" begin
        # FullyConnectedGraph(n) is in force: every other rank is an in- and out-neighbor.
        others = [k for k in 0:n-1 if k != r]
        x = fill(Float64(r + 1), 3)
        win_create(x, "w.put")
        @test get_win_version("w.put") == Dict(k => 0 for k in others)
        @test win_associated_p("w.put") == 1.0
        barrier()  # nobody puts before everyone has looked
        @test win_put(x, "w.put") === nothing
        barrier()  # every put has landed
        @test get_win_version("w.put") == Dict(k => 1 for k in others)
        @test win_update("w.put") === x  # in place: the uniform average of 1..n
        @test x ≈ fill((n + 1) / 2, 3)
        @test get_win_version("w.put") == Dict(k => 0 for k in others)
        err = try
            set_topology(RingGraph(n))
        catch e
            e
        end
        @test err isa WeftError && err.status == Weft.CAPI.WEFT_ERR_FAILED_PRECONDITION &&
              occursin("windows exist (w.put)", err.message)
        @test_throws ArgumentError win_update("w.put"; self_weight=0.5)
        barrier()
        win_free("w.put")

        # self_weight and dst_weights scale x and p; explicit update weights.
        x = fill(Float64(r + 1), 2)
        win_create(x, "w.weights")
        win_put(x, "w.weights"; self_weight=0.5, dst_weights=Dict(k => 0.5 for k in others))
        @test x == fill(0.5 * (r + 1), 2)
        @test win_associated_p("w.weights") ≈ 0.5
        barrier()
        win_update("w.weights"; self_weight=1.0, neighbor_weights=Dict(k => 1.0 for k in others))
        @test x ≈ fill(0.5 * n * (n + 1) / 2, 2)
        @test win_associated_p("w.weights") ≈ 0.5 * n
        barrier()

        # Accumulate twice into zeroed buffers, then collect: a sum. A 2 x 3 matrix.
        a = fill(Int32(r), 2, 3)
        win_create(a, "w.acc"; zero_init=true)
        win_accumulate(a, "w.acc")
        @test wait(win_accumulate_nonblocking(a, "w.acc")) === nothing
        barrier()
        @test get_win_version("w.acc") == Dict(k => 2 for k in others)
        @test win_update_then_collect("w.acc") === a
        collected = fill(Int32(r + 2 * sum(others; init=0)), 2, 3)
        @test a == collected
        @test win_update_then_collect("w.acc"; require_mutex=true) == collected  # zeroed
        barrier()

        # Get reads the sources' arrays, weighted.
        g = fill(Float32(r + 1), 4)
        win_create(g, "w.get"; zero_init=true)
        barrier()
        win_get("w.get"; src_weights=Dict(k => 2.0 for k in others))
        barrier()  # nobody changes its array before every get is done
        win_update("w.get"; self_weight=0.0, neighbor_weights=Dict(k => 0.25 for k in others))
        @test g ≈ fill(Float32(0.5 * sum(others .+ 1; init=0)), 4)
        h = win_get_nonblocking("w.get")
        @test wait(h) === nothing && poll(h)
        @test get_win_version("w.get") == Dict(k => 1 for k in others)
        barrier()

        # Accumulates into rank 0 while it collects, all under its mutex: nothing lost.
        if n > 1
            m = [Int64(r == 0 ? 0 : 1)]
            win_create(m, "w.mutex"; zero_init=true)
            rounds = 20
            for i in 1:rounds
                if r == 0
                    win_update_then_collect("w.mutex"; require_mutex=true)
                elseif isodd(i)
                    win_accumulate(m, "w.mutex"; dst_weights=[0], require_mutex=true)
                else
                    win_mutex("w.mutex"; ranks=[0]) do
                        win_accumulate(m, "w.mutex"; dst_weights=Dict(0 => 1.0))
                    end
                end
            end
            barrier()
            r == 0 && @test win_update_then_collect("w.mutex") == [rounds * (n - 1)]
            barrier()
        end
        win_mutex(() -> nothing, "w.get"; for_self=true)

        # Errors: no such window, a wrong shape.
        err = try
            win_put([1.0], "w.none")
        catch e
            e
        end
        @test err isa WeftError && err.status == Weft.CAPI.WEFT_ERR_NOT_FOUND
        err = try
            win_put(fill(1.0, 3), "w.weights")
        catch e
            e
        end
        @test err isa WeftError && err.status == Weft.CAPI.WEFT_ERR_INVALID_ARGUMENT
        barrier()
        win_free()  # every window
        @test_throws WeftError win_associated_p("w.get")
        set_topology(RingGraph(n))  # allowed again
    end

    @test !isempty(config_describe())
    Weft.shutdown()
end
