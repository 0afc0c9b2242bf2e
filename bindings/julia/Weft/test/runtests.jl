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

# ceil(L (1 - (1 - num/den)^t)) in exact integer arithmetic.
ceil_bound(layers, num, den, t) = cld(layers * (den^t - (den - num)^t), den^t)

@testset "elastic pipelining (no init needed)" begin
    # The freeze schedule, L = 12, alpha = 1/3: 0, 4, 7 (6.67), 9 (8.44), 10 (9.63), 11.
    @test [ceil_bound(12, 1, 3, t) for t in 0:5] == [0, 4, 7, 9, 10, 11]
    @test [freeze_bound(12, 1 / 3, t) for t in 0:5] == [0, 4, 7, 9, 10, 11]
    @test freeze_bound(8, 0.5, 1) == 4                  # exact at integers, not 5
    @test freeze_bound(10, 0.3, 1) == 3
    @test freeze_bound(12, 1.0, 1) == 12
    err = try
        freeze_bound(12, 0.0, 1)
    catch e
        e
    end
    @test err isa WeftError && err.status == Weft.CAPI.WEFT_ERR_INVALID_ARGUMENT
    @test occursin("alpha", err.message)
    @test_throws WeftError freeze_bound(0, 0.5, 1)
    @test_throws WeftError freeze_bound(12, 0.5, -1)

    # The next frozen count: the schedule, and the gradient-aware policy.
    @test next_frozen(12, 2, 4) == 7
    @test next_frozen(12, 1, 9) == 9                     # layers never unfreeze
    @test next_frozen(12, 1, 0; alpha=1.0) == 11         # the head keeps training
    @test next_frozen(12, 1, 0; alpha=1.0, freeze_last=true) == 12
    norms = [10.0 + l for l in 1:12]
    norms[6] = 1.0      # layer 6 (C's layer 5) moved least: at most 6 frozen
    norms[3] = 0.5      # already frozen (layers 1:4): not a candidate
    @test next_frozen(12, 2, 4; grad_norms=norms, gradient_aware=true) == 6
    norms[6], norms[10] = 20.0, 1.0                      # 10 is above the bound 7
    @test next_frozen(12, 2, 4; grad_norms=norms, gradient_aware=true) == 7
    @test next_frozen(12, 2, 4; grad_norms=norms) == 7   # ignored without the policy
    @test_throws WeftError next_frozen(12, 2, 4; gradient_aware=true)  # no norms
    @test_throws WeftError next_frozen(12, 2, 4; grad_norms=norms[1:5], gradient_aware=true)
    @test_throws WeftError next_frozen(12, 2, 13)

    # Costs and partitions.
    @test parameter_costs([6, 12, 18, 24, 30, 36]; frozen=2) ≈ [1, 2, 18, 24, 30, 36]
    @test_throws WeftError parameter_costs([1, -1, 1])
    @test_throws WeftError parameter_costs([1, 1]; lambda=2)
    c = [1, 2, 3, 4, 5]
    p = partition_layers(c, 2)       # cuts after 1..4 layers: largest 14, 12, 9, 10
    @test p.boundaries == [0, 3, 5] && p.max_cost == 9 && p.stage_costs == [6, 9]
    @test stages(p) == [1:3, 4:5]
    p = partition_layers(c, 3)
    @test p.boundaries == [0, 3, 4, 5] && p.max_cost == 6
    p = partition_layers(c, 3; strategy=:even)
    @test p.boundaries == [0, 2, 4, 5] && p.max_cost == 7
    g = partition_layers(c, 3; strategy=:greedy)
    @test length(g.boundaries) == 4 && g.boundaries[end] == 5 && g.max_cost >= 6
    g = partition_layers(c, 6; strategy=:greedy)          # may leave stages empty
    @test length(g.boundaries) == 7 && any(isempty, stages(g))
    @test partition_layers(ones(40), 20).boundaries == collect(0:2:40)  # > 16 entries
    @test_throws WeftError partition_layers(c, 0)
    @test_throws WeftError partition_layers(c, 6)        # more stages than layers
    @test_throws WeftError partition_layers(c, 6; strategy=:even)
    @test_throws WeftError partition_layers([1, -1, 1], 2)
    @test_throws ArgumentError partition_layers(c, 2; strategy=:best)

    # Plans: 12 equal layers on 1 machine of 8 devices, k0 = 8, as layers freeze.
    sizes = ones(12)
    p0 = PipePlan(sizes)
    @test plan_info(p0) == (frozen=0, k=8, replicas=1, micro_batches=32, world=8, m0=2.0,
                            max_cost=2.0)
    @test boundaries(p0) == [0, 1, 2, 3, 4, 6, 8, 10, 12]
    @test stage_costs(p0) == [1, 1, 1, 1, 2, 2, 2, 2]
    @test stages(p0)[5] == 5:6
    @test newly_active(p0) == Int[]
    @test [role(p0, r) for r in 0:7] == [(replica=1, stage=s) for s in 1:8]
    p4 = PipePlan(sizes, 4; previous=p0)             # 4/6 + 8 > 4 x 2: K stays 8
    @test plan_info(p4).k == 8 && boundaries(p4) == [0, 5, 6, 7, 8, 9, 10, 11, 12]
    p7 = PipePlan(sizes, 7; previous=p4)             # K halves, replicas double
    @test plan_info(p7).k == 4 && plan_info(p7).replicas == 2
    @test plan_info(p7).micro_batches == 16
    @test boundaries(p7) == [0, 1, 8, 10, 12]
    @test stage_costs(p7) ≈ [1 / 6, 2, 2, 2]
    @test newly_active(p7) == [4, 5, 6, 7]           # ranks: 0-based
    @test role(p7, 5) == (replica=2, stage=2)        # replica, stage: 1-based
    p9 = PipePlan(sizes, 9; previous=p7)
    @test plan_info(p9).k == 4 && isempty(newly_active(p9))
    p10 = PipePlan(sizes, 10; previous=p9)
    @test plan_info(p10).k == 2 && plan_info(p10).replicas == 4
    @test boundaries(p10) == [0, 10, 12] && stages(p10) == [1:10, 11:12]
    @test newly_active(p10) == [4, 5, 6, 7]
    @test role(p10, 7) == (replica=4, stage=2)
    @test occursin("k=2", sprint(show, p10))
    idle = PipePlan(sizes; devices_per_machine=6, k0=4, micro_batches=6)
    @test plan_info(idle).micro_batches == 6 && plan_info(idle).world == 6
    @test role(idle, 3) == (replica=1, stage=4) && role(idle, 5) === nothing
    bad = copy(sizes)
    bad[4] = -1
    @test_throws WeftError PipePlan(bad)
    @test_throws WeftError PipePlan(sizes[1:4])          # k0 = 8 stages for 4 layers
    @test_throws WeftError PipePlan(sizes; k0=0)
    @test_throws WeftError PipePlan(sizes; micro_batches=-1)
    @test_throws WeftError PipePlan(sizes, 8; previous=p9)  # frozen going down
    @test_throws WeftError PipePlan(sizes, 10; machines=2, previous=p9)
    @test_throws WeftError role(p10, 8)
    @test_throws ArgumentError PipePlan(sizes; strategy=:best)
    finalize(p0)
    @test p0.ptr == C_NULL && sprint(show, p0) == "Weft.PipePlan(freed)"
    @test_throws ArgumentError PipePlan(sizes, 4; previous=p0)
    @test_throws WeftError plan_info(p0)

    # Schedules: (K - 1) / (M + K - 1) idle over 2 (M + K - 1) cycles.
    @test schedule_bubble(:gpipe, 4, 8).bubble ≈ 3 / 11
    @test schedule_bubble("1f1b", 4, 8) == schedule_bubble(:gpipe, 4, 8)
    @test schedule_bubble(:gpipe, 4, 8).cycles == 22
    @test schedule_bubble(:gpipe, 1, 5) == (bubble=0.0, cycles=10)
    @test_throws WeftError schedule_bubble(:gpipe, 0, 8)
    @test_throws ArgumentError schedule_bubble(:zb, 4, 8)
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

    # A group: its ops reach the engine together at the end; waiting inside hands them over.
    hs = Weft.group() do
        [allreduce_nonblocking(fill(Float64(k), 4); average=false, name="group.$k") for k in 1:8]
    end
    @test [wait(h) for h in hs] == [fill(Float64(k * n), 4) for k in 1:8]
    @test_throws WeftError group_end()

    # A dropped handle: its arrays must stay alive until the op completes.
    allreduce_nonblocking(rand(1000); name="dropped")
    GC.gc()
    barrier()

    if n % 2 == 0
        peer = isodd(r) ? r - 1 : r + 1
        @test pair_gossip([Float64(r)], peer) ≈ [(r + peer) / 2]
    end

    # Process sets: even and odd ranks, disjoint, under the same names.
    group = collect(r % 2:2:n-1)
    @test allreduce(fill(Float64(r), 2); name="set", ranks=group) ≈ fill(sum(group) / length(group), 2)
    z = [Int64(r + 1)]
    @test allreduce!(z; average=false, ranks=reverse(group)) === z && z == [sum(group .+ 1)]
    @test Weft.broadcast([Int32(r)], last(group); ranks=group) == [Int32(last(group))]
    h = allreduce_nonblocking(fill(1.0, 3); average=false, name="set.nb", ranks=group)
    @test wait(h) == fill(Float64(length(group)), 3)
    @test_throws WeftError allreduce([1.0]; ranks=[r, r])
    n > 1 && @test_throws WeftError allreduce([1.0]; ranks=[(r + 1) % n])

    # Point to point: a ring, received first (nonblocking), then sent; named by the sender.
    @test_throws WeftError Weft.send([1.0], r)
    @test_throws WeftError Weft.recv(n)
    if n > 1
        next, prev = (r + 1) % n, (r + n - 1) % n
        buf = zeros(Float64, 3, 2)
        h = recv_nonblocking!(buf, prev; name="ring$prev")
        @test wait(send_nonblocking(fill(Float64(r), 3, 2), next; name="ring$r")) === nothing
        @test wait(h) === buf && buf == fill(Float64(prev), 3, 2)
        # The sender's element type and dims, allocated by weft.
        if r == 0
            for dst in 1:n-1
                Weft.send(fill(Int32(dst), 2, dst), dst; name="any")
                Weft.send(UInt8[dst], dst)  # unnamed
            end
        else
            y = Weft.recv(0; name="any")
            @test y isa Matrix{Int32} && Base.size(y) == (2, r) && all(==(r), y)
            @test wait(recv_nonblocking(0)) == UInt8[r]
        end
        if r == 0
            Weft.send([1.5, 2.5], 1; name="into")
        elseif r == 1
            @test Weft.recv!(zeros(2), 0; name="into") == [1.5, 2.5]
        end
        barrier()
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

    # The elastic pipeline trainer, on the TorchScript model of //tests/capi:trainer_model
    # (7 layers, 6 features, 4 classes) when WEFTJL_TRAINER_MODEL names it.
    model = get(ENV, "WEFTJL_TRAINER_MODEL", "")
    if !isempty(model)
        @testset "pipe trainer" begin
            centers = 3 .* [sin(7c + f) for f in 1:6, c in 1:4]
            labels = [mod1(i, 4) for i in 1:512]
            x = Float32.(centers[:, labels] .+ 0.5 .* cos.(1:6 .* (1:512)'))  # 6 × 512
            trainer = PipeTrainer(model; alpha=0.5, batch_size=32, micro_batches=2,
                                  lr=1e-2, name="jl.train")
            @test plan_info(trainer).frozen == 0 && last_line(trainer) == ""
            m0 = train_epoch!(trainer, x, labels)
            m1 = train_epoch!(trainer, x, labels)
            @test m0.epoch == 0 && m1.epoch == 1 && m1.samples == 512
            @test m1.frozen == m0.next_frozen == 4 && m1.k == m0.next_k
            @test m1.k < m0.k || m1.frozen > m0.frozen
            @test startswith(m1.line, "PIPE epoch=1 frozen=4 ") && last_line(trainer) == m1.line
            @test evaluate(trainer, x, labels) > 0.6
            @test n > 1 || role(trainer) == (replica=1, stage=1)
            close(trainer)
            @test_throws WeftError train_epoch!(trainer, x, labels)
            @test_throws WeftError PipeTrainer("/nonexistent/jl-model.pt")
            @test_throws ArgumentError PipeTrainer(model; optimizer=:rmsprop)
        end
    end

    @test !isempty(config_describe())
    Weft.shutdown()
end
