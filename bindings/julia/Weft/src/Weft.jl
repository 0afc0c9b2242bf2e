"""
    Weft

Julia binding of weft, decentralized training's communication library, over its stable C
ABI (`capi/include/weft/weft.h`). The names and keyword arguments are Bluefog's:

    import Weft as bf
    bf.init()
    x = fill(Float64(bf.rank()), 4)
    y = bf.neighbor_allreduce(x)          # average with the in-neighbors
    bf.shutdown()

Conventions (bindings/julia/README.md has the details):
- ranks are 0-based, as in MPI and Bluefog; indices into Julia collections (step counter
  units, layers, pipeline stages and replicas) are 1-based;
- a Julia array with dims (d1, ..., dN) is handed to weft as the row-major tensor of shape
  (dN, ..., d1): the same memory, no copy. So `allgather` concatenates along Julia's LAST
  dimension (vectors: one after the other);
- element types: Float16, Float32, Float64, Int8, Int16, Int32, Int64, UInt8;
- every failure throws a [`WeftError`](@ref).

`Weft.size()`, `Weft.rank()`, `Weft.init()`, `Weft.shutdown()`, `Weft.broadcast`,
`Weft.broadcast!`, `Weft.synchronize`, `Weft.send`, `Weft.recv` and `Weft.recv!` are not
exported: Base, LinearAlgebra, CUDA.jl or Sockets use those names. `import Weft as bf` gives Bluefog's `bf.` spelling for everything.
"""
module Weft

include("capi.jl")
using .CAPI

export WeftError, Topology, Schedule, Handle,
    # process model (rank(), size(), init(), shutdown() are Weft.-qualified)
    is_initialized, local_rank, local_size, machine_rank, machine_size,
    is_homogeneous, unified_mpi_window_model, nccl_built,
    set_topology, load_topology, is_topo_weighted, set_machine_topology,
    load_machine_topology, in_neighbor_ranks, out_neighbor_ranks,
    # ops (broadcast and broadcast! are Weft.-qualified)
    allreduce, allreduce!, allreduce_nonblocking, allreduce_nonblocking!,
    group_start, group_end,
    broadcast_nonblocking, broadcast_nonblocking!,
    # point to point (send, recv and recv! are Weft.-qualified)
    send_nonblocking, recv_nonblocking, recv_nonblocking!,
    allgather, allgather_nonblocking, neighbor_allgather, neighbor_allgather_nonblocking,
    neighbor_allreduce, neighbor_allreduce!, neighbor_allreduce_nonblocking,
    neighbor_allreduce_nonblocking!, hierarchical_neighbor_allreduce,
    hierarchical_neighbor_allreduce!, hierarchical_neighbor_allreduce_nonblocking,
    hierarchical_neighbor_allreduce_nonblocking!, pair_gossip, pair_gossip!,
    pair_gossip_nonblocking, pair_gossip_nonblocking!, barrier, barrier_nonblocking,
    poll,  # wait(h) is Base.wait; Weft.synchronize(h) is qualified (CUDA.jl exports one)
    # topologies
    ExponentialTwoGraph, ExponentialGraph, SymmetricExponentialGraph, MeshGrid2DGraph,
    StarGraph, RingGraph, FullyConnectedGraph, weight_matrix, num_ranks, in_neighbors,
    out_neighbors, GetRecvWeights, GetSendWeights, IsRegularGraph, IsTopologyEquivalent,
    GetDynamicOnePeerSendRecvRanks, GetExp2DynamicSendRecvMachineRanks,
    GetInnerOuterRingDynamicSendRecvRanks, GetInnerOuterExpo2DynamicSendRecvRanks,
    # the step counter of the distributed optimizers
    StepCounter, computation!, step!, countdown, computations, misuse_warning,
    steps_per_communication, set_steps_per_communication!,
    # elastic pipelining: freezing, partitions, AutoPipe/AutoDP plans
    freeze_bound, next_frozen, parameter_costs, LayerPartition, partition_layers, PipePlan,
    plan_info, boundaries, stage_costs, stages, newly_active, role, schedule_bubble,
    # the elastic pipeline trainer (a TorchScript model file)
    PipeTrainer, train_epoch!, evaluate, last_line,
    # one-sided windows
    win_create, win_free, win_put, win_put_nonblocking, win_accumulate,
    win_accumulate_nonblocking, win_get, win_get_nonblocking, win_update,
    win_update_then_collect, get_win_version, win_associated_p, win_mutex,
    turn_on_win_ops_with_associated_p, turn_off_win_ops_with_associated_p,
    # settings and timeline
    config_set, config_get, config_unset, config_describe,
    timeline_start, timeline_stop, timeline_start_activity, timeline_end_activity,
    timeline_context, timeline_active

# ---- errors ------------------------------------------------------------------------------

"""
    WeftError(status, message)

A weft call failed. `status` is the `weft_status` code (e.g.
`Weft.CAPI.WEFT_ERR_INVALID_ARGUMENT`); `message` is the library's explanation
(`weft_last_error()`): what was expected, what was found.
"""
struct WeftError <: Exception
    status::Int
    message::String
end

# Status code -> its C name, read from the generated constants (no library call needed).
const _STATUS_NAMES = Dict{Int,String}(
    Int(getfield(CAPI, n)) => String(n)
    for n in names(CAPI) if n === :WEFT_OK || startswith(String(n), "WEFT_ERR_"))

function Base.showerror(io::IO, e::WeftError)
    name = get(_STATUS_NAMES, e.status, string(e.status))
    print(io, "WeftError(", name, "): ", e.message)
end

_string_or_empty(p::Ptr{Cchar}) = p == C_NULL ? "" : unsafe_string(p)

# The message must be read right after the failing call: weft_last_error() is per thread,
# and no task switch can happen between two ccalls.
# How many C ABI calls this task has checked: an op function that sees the count unchanged
# after an exception knows that weft never saw the call.
_checked_calls() = get(task_local_storage(), :weft_checked_calls, 0)::Int

function _check(status::Integer)
    task_local_storage(:weft_checked_calls, _checked_calls() + 1)
    status == WEFT_OK && return nothing
    throw(WeftError(Int(status), _string_or_empty(weft_last_error())))
end

_not_initialized(what) = WeftError(Int(WEFT_ERR_FAILED_PRECONDITION),
                                   "$what: weft is not initialized; call Weft.init() first")

# ---- process model -----------------------------------------------------------------------

"""
    Weft.init()

Starts MPI (unless the program already did) and weft's engine; the default topology is
`ExponentialGraph(Weft.size())`. Run the program under `mpirun -np N julia script.jl`.
The shared library comes from `ENV["LIBWEFT"]` (read when Weft is loaded).
"""
function init()
    major = div(weft_version_number(), 10000)
    major == WEFT_VERSION_MAJOR || throw(WeftError(Int(WEFT_ERR_FAILED_PRECONDITION),
        "the loaded libweft is version $(version()), this binding was generated for " *
        "$WEFT_VERSION_MAJOR.x; set LIBWEFT to a matching library"))
    _check(weft_init())
    return nothing
end

"""
    Weft.shutdown()

Waits until every rank has called it, then stops the engine; ops that cannot complete
then fail. `Weft.init()` may be called again afterwards.
"""
function shutdown()
    _check(weft_shutdown())
    _forget_windows()  # weft freed them
    _free_dropped_requests()
    return nothing
end

"""
    Weft.finalize()

Finalizes MPI if weft started it (after `shutdown()` when still initialized); `init()`
fails afterwards. Julia runs it at exit by itself (through the C library's exit handler).
Not exported: `Base.finalize` runs an object's finalizers.
"""
function finalize()
    _check(weft_finalize())
    _forget_windows()
    _free_dropped_requests()
    return nothing
end

is_initialized() = weft_is_initialized() != 0

function _process_number(value::Integer, what)
    value < 0 && throw(_not_initialized(what))
    return Int(value)
end

"""
    Weft.size()

The number of ranks. Not exported, and not a method of `Base.size`: inside this module
arrays are measured with `Base.size`.
"""
size() = _process_number(weft_size(), "size()")

"This process's rank, 0-based. Not exported (LinearAlgebra exports a `rank`)."
rank() = _process_number(weft_rank(), "rank()")

"This process's rank among the ranks on its machine, 0-based."
local_rank() = _process_number(weft_local_rank(), "local_rank()")

"The number of ranks on this machine."
local_size() = _process_number(weft_local_size(), "local_size()")

"This machine's index, 0-based."
machine_rank() = _process_number(weft_machine_rank(), "machine_rank()")

"The number of machines."
machine_size() = _process_number(weft_machine_size(), "machine_size()")

"""Whether every machine runs the same number of ranks, each machine's ranks consecutive."""
is_homogeneous() = _process_number(weft_is_homogeneous(), "is_homogeneous()") == 1

"Whether MPI windows use MPI's unified memory model (needs `init()`; not collective)."
function unified_mpi_window_model()
    result = Ref{Cint}(0)
    _check(weft_unified_mpi_window_model(result))
    return result[] != 0
end

"Whether this build runs CUDA arrays on NCCL."
nccl_built() = weft_nccl_built() != 0

"The version of the loaded libweft."
version() = VersionNumber(_string_or_empty(weft_version()))

# ---- arrays as DLPack tensors ------------------------------------------------------------

"The element types weft exchanges."
const WeftElType = Union{Float16,Float32,Float64,Int8,Int16,Int32,Int64,UInt8}

_dtype(::Type{T}) where {T<:AbstractFloat} = DLDataType(kDLFloat, 8 * sizeof(T), 1)
_dtype(::Type{T}) where {T<:Signed} = DLDataType(kDLInt, 8 * sizeof(T), 1)
_dtype(::Type{T}) where {T<:Unsigned} = DLDataType(kDLUInt, 8 * sizeof(T), 1)

# A Julia array as weft sees it. Julia stores arrays column-major and a DLTensor with
# strides NULL is row-major, so dims (d1, ..., dN) are described as shape (dN, ..., d1):
# the same bytes in the same order, no copy. The DLTensor points into `array` and `shape`;
# keep this object alive (GC.@preserve, or a Handle) while weft may use it.
struct _Tensor{T,N}
    array::Array{T,N}
    shape::Vector{Int64}
    dl::Base.RefValue{DLTensor}
end

function _Tensor(x::Array{T,N}) where {T<:WeftElType,N}
    shape = Int64[Base.size(x, d) for d in N:-1:1]
    dl = DLTensor(Ptr{Cvoid}(pointer(x)), DLDevice(kDLCPU, 0), N, _dtype(T),
                  pointer(shape), Ptr{Int64}(C_NULL), 0)
    return _Tensor{T,N}(x, shape, Ref(dl))
end

_Tensor(x::Array{T}) where {T} =
    throw(ArgumentError("weft cannot exchange elements of type $T; use one of $WeftElType"))

# Inputs of out-of-place ops may be any array (a view, a range): copied to a dense Array.
_dense(x::Array) = x
_dense(x::AbstractArray) = Array(x)

_name(::Nothing) = ""  # ops without a name are matched across ranks by call order
_name(name::Union{AbstractString,Symbol}) = String(name)

# A tensor weft allocated (allgather results) copied into a new Array{T,N}; weft's copy
# is freed at once with its DLPack deleter. (Wrapping weft's buffer with unsafe_wrap would
# save the copy but leave the deleter to a GC finalizer, on an arbitrary thread.)
function _take_managed(managed::Ptr{DLManagedTensor}, ::Type{T}, ::Val{N}) where {T,N}
    managed == C_NULL &&
        throw(WeftError(Int(WEFT_ERR_INTERNAL), "weft returned no tensor"))
    try
        t = unsafe_load(managed).dl_tensor
        if t.ndim != N || t.dtype != _dtype(T)
            throw(WeftError(Int(WEFT_ERR_INTERNAL),
                "weft returned a $(t.ndim)-dimensional tensor of $(t.dtype); expected " *
                "$N dimensions of $T"))
        end
        shape = Int[unsafe_load(t.shape, k) for k in 1:N]  # row-major: (dN, ..., d1)
        if t.strides != C_NULL
            expected = 1
            for k in N:-1:1
                if shape[k] != 1 && unsafe_load(t.strides, k) != expected
                    throw(WeftError(Int(WEFT_ERR_INTERNAL),
                                    "weft returned a non-contiguous tensor"))
                end
                expected *= shape[k]
            end
        end
        result = Array{T,N}(undef, ntuple(d -> shape[N + 1 - d], Val(N)))
        if length(result) > 0
            unsafe_copyto!(pointer(result), Ptr{T}(t.data + t.byte_offset), length(result))
        end
        return result
    finally
        deleter = unsafe_load(managed).deleter
        deleter == C_NULL || ccall(deleter, Cvoid, (Ptr{DLManagedTensor},), managed)
    end
end

# ---- nonblocking ops: handles ------------------------------------------------------------

"""
    Handle

A nonblocking op in flight, as returned by the `*_nonblocking` functions. [`poll`](@ref)
says whether it has completed; `wait(h)` (or [`synchronize`](@ref)) waits and returns its
result: the output array, `nothing` for a barrier. Waiting again returns the same result
(or throws the same error).

The handle keeps the op's arrays alive: weft reads the input and writes the output until
the op completes, after the call that started it has returned. Dropping a handle without
waiting is allowed; the arrays then stay alive until a later weft call finds the op done.
"""
mutable struct Handle
    request::Ptr{weft_request}  # C_NULL once freed
    keep::Any                   # what weft uses until the op completes (the _Tensors, ...)
    finish::Any                 # request -> the op's result, after a successful wait
    lock::ReentrantLock
    done::Bool
    result::Any
    error::Union{Nothing,Exception}
end

# Every request in flight, its arrays, and its Handle held weakly. When the program drops
# a Handle before the op completes, this entry keeps the arrays alive; a later call
# (_free_dropped_requests) frees the request once the op is done. Handles have no
# finalizer on purpose: freeing a request from the GC could release the arrays under a
# running op.
struct _InFlight
    handle::WeakRef
    request::Ptr{weft_request}
    keep::Any
end
const _in_flight = _InFlight[]
const _in_flight_lock = ReentrantLock()

function _free_dropped_requests()
    lock(_in_flight_lock) do
        filter!(_in_flight) do entry
            entry.handle.value === nothing || return true  # its Handle frees it
            done = Ref{Cint}(0)
            status = weft_request_poll(done, entry.request)
            status == WEFT_OK && done[] == 0 && return true  # still running: keep arrays
            weft_request_free(entry.request)
            return false
        end
    end
    return nothing
end

# Starts a nonblocking op: start(out::Ref{Ptr{weft_request}}) calls weft; keep holds what
# the op uses; finish(request) makes the result once it completed.
function _start(start, keep, finish)
    _free_dropped_requests()
    request = Ref{Ptr{weft_request}}(C_NULL)
    # An interrupt (Ctrl-C) between starting the op and recording what it uses would leave
    # the op running with nothing keeping `keep` alive: it waits until both are done.
    return disable_sigint() do
        GC.@preserve keep _check(start(request))
        handle = Handle(request[], keep, finish, ReentrantLock(), false, nothing, nothing)
        lock(_in_flight_lock) do
            push!(_in_flight, _InFlight(WeakRef(handle), handle.request, keep))
        end
        handle
    end
end

"""
    poll(h::Handle) -> Bool

Whether the op has completed (successfully or not); never blocks.
"""
function poll(h::Handle)
    lock(h.lock) do
        h.done && return true
        done = Ref{Cint}(0)
        _check(weft_request_poll(done, h.request))
        return done[] != 0
    end
end

"""
    synchronize(h::Handle)
    wait(h::Handle)

Waits for the op and returns its result (the output array; `nothing` for a barrier), or
throws its [`WeftError`](@ref). Blocks the calling thread inside weft.
"""
function synchronize(h::Handle)
    lock(h.lock) do
        h.done || _complete!(h)
    end
    h.error === nothing || throw(h.error)
    return h.result
end

Base.wait(h::Handle) = synchronize(h)

function _complete!(h::Handle)
    status = weft_request_wait(h.request)
    try
        if status == WEFT_OK
            h.result = h.finish(h.request)
        else
            h.error = WeftError(Int(status), _string_or_empty(weft_last_error()))
        end
    catch e
        h.error = e
    finally
        request = h.request
        lock(_in_flight_lock) do
            filter!(entry -> entry.request != request, _in_flight)
        end
        weft_request_free(request)
        h.request = Ptr{weft_request}(C_NULL)
        h.keep = nothing
        h.done = true
    end
    return nothing
end

function Base.show(io::IO, h::Handle)
    print(io, "Weft.Handle(", h.done ? (h.error === nothing ? "done" : "failed") :
                              "in flight", ")")
end

# ---- ops ---------------------------------------------------------------------------------
# Each op comes as f(x) (a new output array), f!(x) (in place; x must be an Array),
# f_nonblocking(x) and f_nonblocking!(x) (a Handle whose result is the output array).

_output_of(t::_Tensor) = _ -> t.array

# A process set: `nothing` keeps to the plain entry points (every rank); otherwise the
# ranks as a Cint vector, which must stay alive (GC.@preserve, or a Handle's keep) while
# weft reads it.
# Runs an op function's body. What fails before weft sees the call (an element type or
# weights Julia cannot convert) still takes the op's place through weft_comm_refuse, as a
# refusal inside weft does: the op's other ranks fail with this reason instead of waiting,
# and later unnamed ops stay paired with the right ones.
function _refused_in_place(body, op, name, ranks, peer)
    calls = _checked_calls()
    try
        return body()
    catch e
        _checked_calls() == calls && _refuse(op, name, ranks, peer, e)
        rethrow()
    end
end

function _refuse(op, name, ranks, peer, e)
    try
        cname = _name(name)
        set = ranks === nothing ? Cint[] : _ranks(ranks)
        code = e isa WeftError ? e.status :
            e isa Union{ArgumentError,DimensionMismatch,InexactError,MethodError} ?
            WEFT_ERR_INVALID_ARGUMENT : WEFT_ERR_UNKNOWN
        message = e isa WeftError ? e.message : sprint(showerror, e)
        GC.@preserve set weft_comm_refuse(op, cname, _set_pointer(set), length(set), peer,
                                          code, message)
    catch
        # The name, set or peer does not convert, so which op was meant cannot be told:
        # every rank running this code fails alike.
    end
    return nothing
end

_process_set(::Nothing) = nothing
_process_set(ranks) = _ranks(ranks)
_set_pointer(set::Vector{Cint}) = isempty(set) ? Ptr{Cint}(C_NULL) : pointer(set)

function _allreduce(request, input, output, average, set, cname)
    if set === nothing
        return request === nothing ?
            weft_comm_allreduce(input.dl, output.dl, average, cname) :
            weft_comm_allreduce_nonblocking(request, input.dl, output.dl, average, cname)
    end
    return request === nothing ?
        weft_comm_allreduce_ranks(input.dl, output.dl, average, _set_pointer(set),
                                  length(set), cname) :
        weft_comm_allreduce_ranks_nonblocking(request, input.dl, output.dl, average,
                                              _set_pointer(set), length(set), cname)
end

"""
    allreduce(x; average=true, name=nothing, ranks=nothing)
    allreduce!(x; average=true, name=nothing, ranks=nothing)

Sum (`average=false`) or mean over all ranks, elementwise. With `ranks` (a collection of
0-based ranks: a process set), over those ranks only: only they call, all with the same
set, this rank among them; disjoint sets run independently under the same names.
"""
function allreduce(x::AbstractArray; average::Bool=true, name=nothing, ranks=nothing)
    return _refused_in_place(WEFT_OP_ALLREDUCE, name, ranks, -1) do
        input = _Tensor(_dense(x))
        output = _Tensor(similar(input.array))
        set = _process_set(ranks)
        GC.@preserve input output set _check(
            _allreduce(nothing, input, output, average, set, _name(name)))
        return output.array
    end
end

function allreduce!(x::Array; average::Bool=true, name=nothing, ranks=nothing)
    return _refused_in_place(WEFT_OP_ALLREDUCE, name, ranks, -1) do
        t = _Tensor(x)
        set = _process_set(ranks)
        GC.@preserve t set _check(_allreduce(nothing, t, t, average, set, _name(name)))
        return x
    end
end

function allreduce_nonblocking(x::AbstractArray; average::Bool=true, name=nothing,
                               ranks=nothing)
    return _refused_in_place(WEFT_OP_ALLREDUCE, name, ranks, -1) do
        input = _Tensor(_dense(x))
        output = _Tensor(similar(input.array))
        cname = _name(name)
        set = _process_set(ranks)
        return _start((input, output, set, cname), _output_of(output)) do request
            _allreduce(request, input, output, average, set, cname)
        end
    end
end

function allreduce_nonblocking!(x::Array; average::Bool=true, name=nothing, ranks=nothing)
    return _refused_in_place(WEFT_OP_ALLREDUCE, name, ranks, -1) do
        t = _Tensor(x)
        cname = _name(name)
        set = _process_set(ranks)
        return _start((t, set, cname), _output_of(t)) do request
            _allreduce(request, t, t, average, set, cname)
        end
    end
end

function _broadcast(request, input, output, root_rank, set, cname)
    if set === nothing
        return request === nothing ?
            weft_comm_broadcast(input.dl, output.dl, root_rank, cname) :
            weft_comm_broadcast_nonblocking(request, input.dl, output.dl, root_rank, cname)
    end
    return request === nothing ?
        weft_comm_broadcast_ranks(input.dl, output.dl, root_rank, _set_pointer(set),
                                  length(set), cname) :
        weft_comm_broadcast_ranks_nonblocking(request, input.dl, output.dl, root_rank,
                                              _set_pointer(set), length(set), cname)
end

"""
    Weft.broadcast(x, root_rank; name=nothing, ranks=nothing)
    Weft.broadcast!(x, root_rank; name=nothing, ranks=nothing)

Every rank ends with `root_rank`'s `x`. Not exported: `broadcast` is Base's. With `ranks`
(a process set, as for [`allreduce`](@ref)), every rank of the set; `root_rank` is one of
them.
"""
function broadcast(x::AbstractArray, root_rank::Integer; name=nothing, ranks=nothing)
    return _refused_in_place(WEFT_OP_BROADCAST, name, ranks, -1) do
        input = _Tensor(_dense(x))
        output = _Tensor(similar(input.array))
        set = _process_set(ranks)
        GC.@preserve input output set _check(
            _broadcast(nothing, input, output, root_rank, set, _name(name)))
        return output.array
    end
end

function broadcast!(x::Array, root_rank::Integer; name=nothing, ranks=nothing)
    return _refused_in_place(WEFT_OP_BROADCAST, name, ranks, -1) do
        t = _Tensor(x)
        set = _process_set(ranks)
        GC.@preserve t set _check(_broadcast(nothing, t, t, root_rank, set, _name(name)))
        return x
    end
end

function broadcast_nonblocking(x::AbstractArray, root_rank::Integer; name=nothing,
                               ranks=nothing)
    return _refused_in_place(WEFT_OP_BROADCAST, name, ranks, -1) do
        input = _Tensor(_dense(x))
        output = _Tensor(similar(input.array))
        cname = _name(name)
        set = _process_set(ranks)
        return _start((input, output, set, cname), _output_of(output)) do request
            _broadcast(request, input, output, root_rank, set, cname)
        end
    end
end

function broadcast_nonblocking!(x::Array, root_rank::Integer; name=nothing, ranks=nothing)
    return _refused_in_place(WEFT_OP_BROADCAST, name, ranks, -1) do
        t = _Tensor(x)
        cname = _name(name)
        set = _process_set(ranks)
        return _start((t, set, cname), _output_of(t)) do request
            _broadcast(request, t, t, root_rank, set, cname)
        end
    end
end

"""
    Weft.send(x, dst; name=nothing)
    send_nonblocking(x, dst; name=nothing)

Sends `x` to rank `dst` (0-based), whose receive from this rank with the same name gets
it; without a name, the pair's unnamed sends and receives match in call order. Only the
two ranks call. Returns `nothing` once the data has left `x` (the Handle's result is
`nothing`). `send`, `recv` and `recv!` are not exported: the Sockets standard library
exports `send` and `recv`.
"""
function send(x::AbstractArray, dst::Integer; name=nothing)
    return _refused_in_place(WEFT_OP_SEND, name, nothing, dst) do
        input = _Tensor(_dense(x))
        GC.@preserve input _check(weft_comm_send(input.dl, dst, _name(name)))
        return nothing
    end
end

function send_nonblocking(x::AbstractArray, dst::Integer; name=nothing)
    return _refused_in_place(WEFT_OP_SEND, name, nothing, dst) do
        input = _Tensor(_dense(x))
        cname = _name(name)
        return _start((input, cname), _ -> nothing) do request
            weft_comm_send_nonblocking(request, input.dl, dst, cname)
        end
    end
end

"""
    Weft.recv!(x, src; name=nothing)
    recv_nonblocking!(x, src; name=nothing)

Receives what rank `src` sends with the same name into `x` (an `Array`), which must have
the sender's element type and dims (an error on both ranks otherwise); returns `x`.
"""
function recv!(x::Array, src::Integer; name=nothing)
    return _refused_in_place(WEFT_OP_RECV, name, nothing, src) do
        t = _Tensor(x)
        GC.@preserve t _check(weft_comm_recv(t.dl, src, _name(name)))
        return x
    end
end

function recv_nonblocking!(x::Array, src::Integer; name=nothing)
    return _refused_in_place(WEFT_OP_RECV, name, nothing, src) do
        t = _Tensor(x)
        cname = _name(name)
        return _start((t, cname), _output_of(t)) do request
            weft_comm_recv_nonblocking(request, t.dl, src, cname)
        end
    end
end

const _ELTYPES = (Float16, Float32, Float64, Int8, Int16, Int32, Int64, UInt8)

# A tensor of whatever type and shape a sender chose (recv_any), as a new Array.
function _take_received(managed::Ptr{DLManagedTensor})
    managed == C_NULL &&
        throw(WeftError(Int(WEFT_ERR_INTERNAL), "weft returned no tensor"))
    t = unsafe_load(managed).dl_tensor
    T = nothing
    for E in _ELTYPES
        if t.dtype == _dtype(E)
            T = E
            break
        end
    end
    if T === nothing
        deleter = unsafe_load(managed).deleter
        deleter == C_NULL || ccall(deleter, Cvoid, (Ptr{DLManagedTensor},), managed)
        throw(WeftError(Int(WEFT_ERR_UNIMPLEMENTED),
            "received elements of DLPack dtype $(t.dtype), which Julia cannot hold; " *
            "Weft exchanges $WeftElType"))
    end
    return _take_managed(managed, T, Val(Int(t.ndim)))
end

"""
    Weft.recv(src; name=nothing)
    recv_nonblocking(src; name=nothing)

Receives what rank `src` sends with the same name as a new `Array` of the sender's element
type and dims (the sender's row-major shape reversed, as for every tensor here).
"""
function recv(src::Integer; name=nothing)
    return _refused_in_place(WEFT_OP_RECV, name, nothing, src) do
        out = Ref{Ptr{DLManagedTensor}}(C_NULL)
        _check(weft_comm_recv_any(out, src, _name(name)))
        return _take_received(out[])
    end
end

function recv_nonblocking(src::Integer; name=nothing)
    return _refused_in_place(WEFT_OP_RECV, name, nothing, src) do
        cname = _name(name)
        finish = request -> begin
            out = Ref{Ptr{DLManagedTensor}}(C_NULL)
            _check(weft_request_take_output(out, request))
            _take_received(out[])
        end
        return _start(cname, finish) do request
            weft_comm_recv_any_nonblocking(request, src, cname)
        end
    end
end

# The result of an allgather-like request: weft's tensor, copied into a Julia Array.
function _gathered(::_Tensor{T,N}) where {T,N}
    return request -> begin
        out = Ref{Ptr{DLManagedTensor}}(C_NULL)
        _check(weft_request_take_output(out, request))
        _take_managed(out[], T, Val(N))
    end
end

"""
    allgather(x; name=nothing)

Every rank's `x`, concatenated in rank order along Julia's LAST dimension (weft
concatenates along the first dimension of the row-major view, which is Julia's last).
Vectors: one after the other; matrices: side by side (`hcat`). That dimension may differ
between ranks; the others must match.
"""
function allgather(x::AbstractArray{T,N}; name=nothing) where {T,N}
    return _refused_in_place(WEFT_OP_ALLGATHER, name, nothing, -1) do
        input = _Tensor(_dense(x))
        out = Ref{Ptr{DLManagedTensor}}(C_NULL)
        GC.@preserve input _check(weft_comm_allgather(out, input.dl, _name(name)))
        return _take_managed(out[], T, Val(N))
    end
end

function allgather_nonblocking(x::AbstractArray; name=nothing)
    return _refused_in_place(WEFT_OP_ALLGATHER, name, nothing, -1) do
        input = _Tensor(_dense(x))
        cname = _name(name)
        return _start((input, cname), _gathered(input)) do request
            weft_comm_allgather_nonblocking(request, input.dl, cname)
        end
    end
end

_ranks(ranks) = Cint[r for r in ranks]

# (options pointer or C_NULL, what must stay alive with it)
function _neighbor_allgather_options(src_ranks, dst_ranks)
    src_ranks === nothing && dst_ranks === nothing && return (C_NULL, nothing)
    if src_ranks === nothing || dst_ranks === nothing
        throw(ArgumentError("src_ranks and dst_ranks go together: give both or neither"))
    end
    src, dst = _ranks(src_ranks), _ranks(dst_ranks)
    options = Ref(weft_neighbor_allgather_options(
        has_ranks = 1, num_src = length(src), src_ranks = pointer(src),
        num_dst = length(dst), dst_ranks = pointer(dst)))
    return (options, (src, dst))
end

"""
    neighbor_allgather(x; src_ranks=nothing, dst_ranks=nothing, name=nothing)

The in-neighbors' `x` (self excluded), concatenated along Julia's last dimension in rank
order, or in the order of `src_ranks`. With `src_ranks` and `dst_ranks` (together), this
call receives from and sends to those ranks instead of the topology's neighbors.
"""
function neighbor_allgather(x::AbstractArray{T,N}; src_ranks=nothing, dst_ranks=nothing,
                            name=nothing) where {T,N}
    return _refused_in_place(WEFT_OP_NEIGHBOR_ALLGATHER, name, nothing, -1) do
        input = _Tensor(_dense(x))
        options, arrays = _neighbor_allgather_options(src_ranks, dst_ranks)
        out = Ref{Ptr{DLManagedTensor}}(C_NULL)
        GC.@preserve input options arrays _check(
            weft_comm_neighbor_allgather(out, input.dl, options, _name(name)))
        return _take_managed(out[], T, Val(N))
    end
end

function neighbor_allgather_nonblocking(x::AbstractArray; src_ranks=nothing,
                                        dst_ranks=nothing, name=nothing)
    return _refused_in_place(WEFT_OP_NEIGHBOR_ALLGATHER, name, nothing, -1) do
        input = _Tensor(_dense(x))
        options, arrays = _neighbor_allgather_options(src_ranks, dst_ranks)
        cname = _name(name)
        return _start((input, options, arrays, cname), _gathered(input)) do request
            weft_comm_neighbor_allgather_nonblocking(request, input.dl, options, cname)
        end
    end
end

# {rank => weight} as rank and weight arrays, sorted by rank (weights go with ranks,
# never with positions).
function _rank_weights(weights::AbstractDict)
    ranks = sort!(collect(keys(weights)))
    return (Cint[r for r in ranks], Cdouble[weights[r] for r in ranks])
end

# dst_weights: {rank => weight}, or a list of ranks (weight 1 each: NULL weights).
_destinations(weights::AbstractDict) = _rank_weights(weights)
_destinations(ranks::AbstractVector{<:Integer}) = (_ranks(ranks), nothing)

function _check_weight_arguments(self_weight, src_weights, dst_weights, src_name, dst_name)
    if (self_weight === nothing) != (src_weights === nothing)
        throw(ArgumentError("self_weight and $src_name go together: give both or neither"))
    end
    if dst_weights !== nothing && self_weight === nothing
        throw(ArgumentError("$dst_name needs self_weight and $src_name"))
    end
    return self_weight !== nothing
end

function _neighbor_allreduce_options(self_weight, src_weights, dst_weights,
                                     enable_topo_check::Bool)
    has_weights = _check_weight_arguments(self_weight, src_weights, dst_weights,
                                          "src_weights", "dst_weights")
    if !has_weights
        options = Ref(weft_neighbor_allreduce_options(
            enable_topo_check = enable_topo_check))
        return (options, nothing)
    end
    src_r, src_w = _rank_weights(src_weights)
    dst_r, dst_w = dst_weights === nothing ? (Cint[], nothing) : _destinations(dst_weights)
    options = Ref(weft_neighbor_allreduce_options(
        has_weights = 1, self_weight = self_weight,
        num_src = length(src_r), src_ranks = pointer(src_r), src_weights = pointer(src_w),
        has_dst = dst_weights !== nothing, num_dst = length(dst_r),
        dst_ranks = pointer(dst_r),
        dst_weights = dst_w === nothing ? C_NULL : pointer(dst_w),
        enable_topo_check = enable_topo_check))
    return (options, (src_r, src_w, dst_r, dst_w))
end

"""
    neighbor_allreduce(x; self_weight=nothing, src_weights=nothing, dst_weights=nothing,
                       enable_topo_check=true, name=nothing)
    neighbor_allreduce!(x; ...)

`self_weight * x + sum(src_weights[j] * x_j)` over the senders j. Without weights: the
topology's receive weights (a uniform average on an unweighted topology).
`src_weights` is a `Dict{Int,Float64}` (rank => weight) and goes with `self_weight`;
`dst_weights` (a Dict rank => weight, or a vector of ranks, weight 1) makes this call send
to exactly those ranks, and needs both.
"""
function neighbor_allreduce(x::AbstractArray; self_weight=nothing, src_weights=nothing,
                            dst_weights=nothing, enable_topo_check::Bool=true, name=nothing)
    return _refused_in_place(WEFT_OP_NEIGHBOR_ALLREDUCE, name, nothing, -1) do
        input = _Tensor(_dense(x))
        output = _Tensor(similar(input.array))
        options, arrays = _neighbor_allreduce_options(self_weight, src_weights, dst_weights,
                                                      enable_topo_check)
        GC.@preserve input output options arrays _check(
            weft_comm_neighbor_allreduce(input.dl, output.dl, options, _name(name)))
        return output.array
    end
end

function neighbor_allreduce!(x::Array; self_weight=nothing, src_weights=nothing,
                             dst_weights=nothing, enable_topo_check::Bool=true,
                             name=nothing)
    return _refused_in_place(WEFT_OP_NEIGHBOR_ALLREDUCE, name, nothing, -1) do
        t = _Tensor(x)
        options, arrays = _neighbor_allreduce_options(self_weight, src_weights, dst_weights,
                                                      enable_topo_check)
        GC.@preserve t options arrays _check(
            weft_comm_neighbor_allreduce(t.dl, t.dl, options, _name(name)))
        return x
    end
end

function neighbor_allreduce_nonblocking(x::AbstractArray; self_weight=nothing,
                                        src_weights=nothing, dst_weights=nothing,
                                        enable_topo_check::Bool=true, name=nothing)
    return _refused_in_place(WEFT_OP_NEIGHBOR_ALLREDUCE, name, nothing, -1) do
        input = _Tensor(_dense(x))
        output = _Tensor(similar(input.array))
        options, arrays = _neighbor_allreduce_options(self_weight, src_weights, dst_weights,
                                                      enable_topo_check)
        cname = _name(name)
        keep = (input, output, options, arrays, cname)
        return _start(keep, _output_of(output)) do request
            weft_comm_neighbor_allreduce_nonblocking(request, input.dl, output.dl, options,
                                                     cname)
        end
    end
end

function neighbor_allreduce_nonblocking!(x::Array; self_weight=nothing, src_weights=nothing,
                                         dst_weights=nothing, enable_topo_check::Bool=true,
                                         name=nothing)
    return _refused_in_place(WEFT_OP_NEIGHBOR_ALLREDUCE, name, nothing, -1) do
        t = _Tensor(x)
        options, arrays = _neighbor_allreduce_options(self_weight, src_weights, dst_weights,
                                                      enable_topo_check)
        cname = _name(name)
        return _start((t, options, arrays, cname), _output_of(t)) do request
            weft_comm_neighbor_allreduce_nonblocking(request, t.dl, t.dl, options, cname)
        end
    end
end

function _hierarchical_options(self_weight, src_machine_weights, dst_machine_weights)
    has_weights = _check_weight_arguments(self_weight, src_machine_weights,
                                          dst_machine_weights, "src_machine_weights",
                                          "dst_machine_weights")
    has_weights || return (C_NULL, nothing)
    src_m, src_w = _rank_weights(src_machine_weights)
    dst_m, dst_w = dst_machine_weights === nothing ? (Cint[], nothing) :
                   _destinations(dst_machine_weights)
    options = Ref(weft_hierarchical_options(
        has_weights = 1, self_weight = self_weight,
        num_src = length(src_m), src_machines = pointer(src_m),
        src_machine_weights = pointer(src_w),
        has_dst = dst_machine_weights !== nothing, num_dst = length(dst_m),
        dst_machines = pointer(dst_m),
        dst_machine_weights = dst_w === nothing ? C_NULL : pointer(dst_w)))
    return (options, (src_m, src_w, dst_m, dst_w))
end

"""
    hierarchical_neighbor_allreduce(x; self_weight=nothing, src_machine_weights=nothing,
                                    dst_machine_weights=nothing, name=nothing)
    hierarchical_neighbor_allreduce!(x; ...)

Sums `x` inside each machine, exchanges the sums between machines (machine-level
weights keyed by machine index, as [`neighbor_allreduce`](@ref)'s), and divides by
`local_size()`.
"""
function hierarchical_neighbor_allreduce(x::AbstractArray; self_weight=nothing,
                                         src_machine_weights=nothing,
                                         dst_machine_weights=nothing, name=nothing)
    return _refused_in_place(WEFT_OP_HIERARCHICAL_NEIGHBOR_ALLREDUCE, name, nothing, -1) do
        input = _Tensor(_dense(x))
        output = _Tensor(similar(input.array))
        options, arrays = _hierarchical_options(self_weight, src_machine_weights,
                                                dst_machine_weights)
        GC.@preserve input output options arrays _check(
            weft_comm_hierarchical_neighbor_allreduce(input.dl, output.dl, options,
                                                      _name(name)))
        return output.array
    end
end

function hierarchical_neighbor_allreduce!(x::Array; self_weight=nothing,
                                          src_machine_weights=nothing,
                                          dst_machine_weights=nothing, name=nothing)
    return _refused_in_place(WEFT_OP_HIERARCHICAL_NEIGHBOR_ALLREDUCE, name, nothing, -1) do
        t = _Tensor(x)
        options, arrays = _hierarchical_options(self_weight, src_machine_weights,
                                                dst_machine_weights)
        GC.@preserve t options arrays _check(
            weft_comm_hierarchical_neighbor_allreduce(t.dl, t.dl, options, _name(name)))
        return x
    end
end

function hierarchical_neighbor_allreduce_nonblocking(x::AbstractArray; self_weight=nothing,
                                                     src_machine_weights=nothing,
                                                     dst_machine_weights=nothing,
                                                     name=nothing)
    return _refused_in_place(WEFT_OP_HIERARCHICAL_NEIGHBOR_ALLREDUCE, name, nothing, -1) do
        input = _Tensor(_dense(x))
        output = _Tensor(similar(input.array))
        options, arrays = _hierarchical_options(self_weight, src_machine_weights,
                                                dst_machine_weights)
        cname = _name(name)
        return _start((input, output, options, arrays, cname), _output_of(output)) do request
            weft_comm_hierarchical_neighbor_allreduce_nonblocking(request, input.dl, output.dl,
                                                                  options, cname)
        end
    end
end

function hierarchical_neighbor_allreduce_nonblocking!(x::Array; self_weight=nothing,
                                                      src_machine_weights=nothing,
                                                      dst_machine_weights=nothing,
                                                      name=nothing)
    return _refused_in_place(WEFT_OP_HIERARCHICAL_NEIGHBOR_ALLREDUCE, name, nothing, -1) do
        t = _Tensor(x)
        options, arrays = _hierarchical_options(self_weight, src_machine_weights,
                                                dst_machine_weights)
        cname = _name(name)
        return _start((t, options, arrays, cname), _output_of(t)) do request
            weft_comm_hierarchical_neighbor_allreduce_nonblocking(request, t.dl, t.dl, options,
                                                                  cname)
        end
    end
end

"""
    pair_gossip(x, peer; self_weight=0.5, pair_weight=0.5, name=nothing)
    pair_gossip!(x, peer; ...)

`self_weight * x + pair_weight * (peer's x)`, on both peers (each calls it with the
other's rank).
"""
function pair_gossip(x::AbstractArray, peer::Integer; self_weight::Real=0.5,
                     pair_weight::Real=0.5, name=nothing)
    return _refused_in_place(WEFT_OP_PAIR_GOSSIP, name, nothing, -1) do
        input = _Tensor(_dense(x))
        output = _Tensor(similar(input.array))
        GC.@preserve input output _check(weft_comm_pair_gossip(
            input.dl, output.dl, peer, self_weight, pair_weight, _name(name)))
        return output.array
    end
end

function pair_gossip!(x::Array, peer::Integer; self_weight::Real=0.5, pair_weight::Real=0.5,
                      name=nothing)
    return _refused_in_place(WEFT_OP_PAIR_GOSSIP, name, nothing, -1) do
        t = _Tensor(x)
        GC.@preserve t _check(weft_comm_pair_gossip(
            t.dl, t.dl, peer, self_weight, pair_weight, _name(name)))
        return x
    end
end

function pair_gossip_nonblocking(x::AbstractArray, peer::Integer; self_weight::Real=0.5,
                                 pair_weight::Real=0.5, name=nothing)
    return _refused_in_place(WEFT_OP_PAIR_GOSSIP, name, nothing, -1) do
        input = _Tensor(_dense(x))
        output = _Tensor(similar(input.array))
        cname = _name(name)
        return _start((input, output, cname), _output_of(output)) do request
            weft_comm_pair_gossip_nonblocking(request, input.dl, output.dl, peer, self_weight,
                                              pair_weight, cname)
        end
    end
end

function pair_gossip_nonblocking!(x::Array, peer::Integer; self_weight::Real=0.5,
                                  pair_weight::Real=0.5, name=nothing)
    return _refused_in_place(WEFT_OP_PAIR_GOSSIP, name, nothing, -1) do
        t = _Tensor(x)
        cname = _name(name)
        return _start((t, cname), _output_of(t)) do request
            weft_comm_pair_gossip_nonblocking(request, t.dl, t.dl, peer, self_weight,
                                              pair_weight, cname)
        end
    end
end

"Waits until every rank has called it."
barrier() = _check(weft_comm_barrier())

barrier_nonblocking() = _start(weft_comm_barrier_nonblocking, nothing, _ -> nothing)

"""
    group_start()

Groups, as NCCL's `ncclGroupStart`/`ncclGroupEnd`: the ops this thread starts between
`group_start()` and `group_end()` do not wake weft's engine thread; the outermost
`group_end()` does, so that a burst of nonblocking ops reaches it whole and is negotiated
and fused as one (a hint: an engine thread awake anyway takes them as they come). Groups
nest and belong to the OS thread: start and end a group on one thread, from a task that
stays on its thread (the main task, or one started with `@async`).
`group_end()` with no group open throws a `WEFT_ERR_FAILED_PRECONDITION` `WeftError`.
`Weft.group(f)` runs `f()` inside a group (`Weft.group() do ... end`).
"""
group_start() = _check(weft_comm_group_start())

"Closes the group `group_start()` opened on this thread (see `group_start`)."
group_end() = _check(weft_comm_group_end())

"Runs `f()` inside a group (see `group_start`): `Weft.group() do ... end`."
function group(f)
    group_start()
    local result
    try
        result = f()
    catch
        try
            group_end()
        catch  # f's error is the one to report
        end
        rethrow()
    end
    group_end()
    return result
end

# ---- one-sided windows -------------------------------------------------------------------
# One-sided windows. A window associates an array with a name:
# every rank holds one receive buffer per in-neighbor (of the topology in force at
# win_create) and exposes its array to the others' win_get. Puts and gets are one-sided:
# the other rank calls nothing. set_topology throws while windows exist.

# The arrays of the windows alive, by name. weft keeps a pointer into each array from
# win_create until win_free (gets read it, updates write it in place), long after the
# ccall returned: this table keeps the array (and its _Tensor) from being collected.
const _windows = Dict{String,_Tensor}()
const _windows_lock = ReentrantLock()

# Shutdown frees every window in weft: forget the arrays too.
_forget_windows() = lock(() -> empty!(_windows), _windows_lock)

_window_array(name) = lock(_windows_lock) do
    t = get(_windows, String(name), nothing)
    t === nothing ? nothing : t.array
end

"""
    win_create(x::Array, name; zero_init=false, transport=nothing)

Creates the window `name` over `x` (collective: every rank calls it with the same name,
element type and dims). The receive buffers start as copies of this rank's `x`, or zeros
with `zero_init`. `transport` is `"mpi"` or `"ucx"` (default: `WEFT_TRANSPORT`), the same on
every rank. weft then reads and writes `x` itself, in place, until [`win_free`](@ref): the
window keeps `x` alive; do not `resize!` it.
"""
function win_create(x::Array, name::Union{AbstractString,Symbol}; zero_init::Bool=false,
                    transport::Union{Nothing,AbstractString}=nothing)
    return _refused_in_place(WEFT_OP_WIN_CREATE, name, nothing, -1) do
        t = _Tensor(x)
        cname = String(name)
        ctransport = transport === nothing ? nothing : String(transport)
        GC.@preserve t ctransport begin
            transport_ptr = ctransport === nothing ? Ptr{Cchar}(C_NULL) : pointer(ctransport)
            options = Ref(weft_win_create_options(; zero_init=Cint(zero_init),
                                                    transport=transport_ptr))
            _check(weft_win_create(t.dl, cname, options))
        end
        lock(() -> (_windows[cname] = t), _windows_lock)
        return nothing
    end
end

"""
    win_free(name=nothing)

Frees the window `name`, or every window (collective).
"""
function win_free(name=nothing)
    cname = _name(name)
    _check(weft_win_free(cname))
    lock(_windows_lock) do
        isempty(cname) ? empty!(_windows) : delete!(_windows, cname)
    end
    return nothing
end

# (options Ref, what must stay alive with it) of a put or accumulate.
function _win_put_options(self_weight, dst_weights, require_mutex::Bool)
    dst_r, dst_w = dst_weights === nothing ? (Cint[], nothing) : _destinations(dst_weights)
    options = Ref(weft_win_put_options(
        self_weight = self_weight === nothing ? 1.0 : Float64(self_weight),
        has_dst = dst_weights !== nothing, num_dst = length(dst_r),
        dst_ranks = isempty(dst_r) ? C_NULL : pointer(dst_r),
        dst_weights = dst_w === nothing || isempty(dst_w) ? C_NULL : pointer(dst_w),
        require_mutex = require_mutex))
    return (options, (dst_r, dst_w))
end

function _win_put(put, x::Array, name, self_weight, dst_weights, require_mutex)
    t = _Tensor(x)
    options, arrays = _win_put_options(self_weight, dst_weights, require_mutex)
    GC.@preserve t options arrays _check(put(t.dl, String(name), options))
    return nothing
end

function _win_put_nonblocking(put, x::Array, name, self_weight, dst_weights, require_mutex)
    t = _Tensor(x)
    options, arrays = _win_put_options(self_weight, dst_weights, require_mutex)
    cname = String(name)
    return _start((t, options, arrays, cname), _ -> nothing) do request
        put(request, t.dl, cname, options)
    end
end

"""
    win_put(x, name; self_weight=nothing, dst_weights=nothing, require_mutex=false)
    win_put_nonblocking(x, name; ...) -> Handle

Writes `weight * x` into each destination's buffer for this rank, then multiplies `x` (in
place) and the window's associated p by `self_weight` (`nothing`: 1). `x` has the
window's element type and dims; usually it is the window's own array. `dst_weights`:
`Dict(rank => weight)`, or a vector of ranks (weight 1 each); `nothing`: every
out-neighbor with weight 1. `require_mutex` holds the destinations' window mutexes around
the put. `wait` on the handle returns `nothing`.
"""
win_put(x::Array, name; self_weight=nothing, dst_weights=nothing,
        require_mutex::Bool=false) =
    _win_put(weft_win_put, x, name, self_weight, dst_weights, require_mutex)

win_put_nonblocking(x::Array, name; self_weight=nothing, dst_weights=nothing,
                    require_mutex::Bool=false) =
    _win_put_nonblocking(weft_win_put_nonblocking, x, name, self_weight, dst_weights,
                         require_mutex)

"""
    win_accumulate(x, name; self_weight=nothing, dst_weights=nothing, require_mutex=false)
    win_accumulate_nonblocking(x, name; ...) -> Handle

As [`win_put`](@ref), adding into the destinations' buffers (atomically per element).
"""
win_accumulate(x::Array, name; self_weight=nothing, dst_weights=nothing,
               require_mutex::Bool=false) =
    _win_put(weft_win_accumulate, x, name, self_weight, dst_weights, require_mutex)

win_accumulate_nonblocking(x::Array, name; self_weight=nothing, dst_weights=nothing,
                           require_mutex::Bool=false) =
    _win_put_nonblocking(weft_win_accumulate_nonblocking, x, name, self_weight,
                         dst_weights, require_mutex)

function _win_get_options(src_weights, require_mutex::Bool)
    src_r, src_w = src_weights === nothing ? (Cint[], nothing) : _destinations(src_weights)
    options = Ref(weft_win_get_options(
        has_src = src_weights !== nothing, num_src = length(src_r),
        src_ranks = isempty(src_r) ? C_NULL : pointer(src_r),
        src_weights = src_w === nothing || isempty(src_w) ? C_NULL : pointer(src_w),
        require_mutex = require_mutex))
    return (options, (src_r, src_w))
end

"""
    win_get(name; src_weights=nothing, require_mutex=false)
    win_get_nonblocking(name; ...) -> Handle

Reads `weight * x_j` of each source j into this rank's buffer for j. `src_weights`:
`Dict(rank => weight)`, or a vector of ranks (weight 1 each); `nothing`: every in-neighbor
with weight 1. `require_mutex` holds the sources' window mutexes.
"""
function win_get(name; src_weights=nothing, require_mutex::Bool=false)
    options, arrays = _win_get_options(src_weights, require_mutex)
    GC.@preserve options arrays _check(weft_win_get(String(name), options))
    return nothing
end

function win_get_nonblocking(name; src_weights=nothing, require_mutex::Bool=false)
    options, arrays = _win_get_options(src_weights, require_mutex)
    cname = String(name)
    return _start((options, arrays, cname), _ -> nothing) do request
        weft_win_get_nonblocking(request, cname, options)
    end
end

"""
    win_update(name; self_weight=nothing, neighbor_weights=nothing, reset=false,
               require_mutex=false) -> the window's array

Combines the receive buffers into the window's array, in place (local: no other rank takes
part): `x = self_weight * x + sum(neighbor_weights[j] * buffer_j)`, by default the
topology's receive weights if it was set weighted, else the uniform average over `x` and
every buffer. `self_weight` and `neighbor_weights`
(`Dict(rank => weight)`, in-neighbors) go together. `reset` zeroes the buffers used;
`require_mutex` holds this rank's own window mutex.
"""
function win_update(name; self_weight=nothing, neighbor_weights=nothing, reset::Bool=false,
                    require_mutex::Bool=false)
    has_weights = _check_weight_arguments(self_weight, neighbor_weights, nothing,
                                          "neighbor_weights", "")
    ranks, weights = has_weights ? _rank_weights(neighbor_weights) : (Cint[], Cdouble[])
    options = Ref(weft_win_update_options(
        has_weights = has_weights, self_weight = has_weights ? Float64(self_weight) : 1.0,
        num_neighbors = length(ranks),
        neighbor_ranks = isempty(ranks) ? C_NULL : pointer(ranks),
        neighbor_weights = isempty(weights) ? C_NULL : pointer(weights),
        reset = reset, require_mutex = require_mutex))
    GC.@preserve options ranks weights _check(weft_win_update(String(name), options))
    return _window_array(name)
end

"""
    win_update_then_collect(name; require_mutex=false) -> the window's array

Adds every receive buffer into the window's array (a sum, not an average:
`x = x + sum(buffer_j)`), then zeroes the buffers. Local.
"""
function win_update_then_collect(name; require_mutex::Bool=false)
    _check(weft_win_update_then_collect(String(name), require_mutex))
    return _window_array(name)
end

"""
    get_win_version(name) -> Dict{Int,Int}

For each in-neighbor, the number of puts (and gets) into its buffer since the buffer was
last updated.
"""
function get_win_version(name)
    cname = String(name)
    ranks, versions = _read_arrays(Cint, Int64) do r, v, capacity, count
        weft_win_version(r, v, capacity, count, cname)
    end
    return Dict{Int,Int}(Int(r) => Int(v) for (r, v) in zip(ranks, versions))
end

"""
    win_associated_p(name) -> Float64

The scalar that follows the window's weights (push-sum); it starts at 1.
"""
function win_associated_p(name)
    p = Ref{Cdouble}(0)
    _check(weft_win_associated_p(p, String(name)))
    return p[]
end

"Window ops apply their weights to the push-sum scalar p too, for every window (the default)."
turn_on_win_ops_with_associated_p() = weft_win_set_associated_p_ops(1)

"Window ops leave p as it is (Bluefog's default)."
turn_off_win_ops_with_associated_p() = weft_win_set_associated_p_ops(0)

"""
    win_mutex(f, name; ranks=nothing, for_self=false)

Runs `f()` holding the window mutexes of `ranks` (by default the out-neighbors; with
`for_self`, this rank's own too), taken in rank order, and releases them afterwards:

    win_mutex("x"; ranks=[0]) do
        win_accumulate(x, "x"; dst_weights=[0])
    end

A put with `require_mutex=true` takes the same mutexes itself: do not nest the two.
"""
function win_mutex(f, name; ranks=nothing, for_self::Bool=false)
    list = ranks === nothing ? (for_self ? Int[] : out_neighbor_ranks()) : collect(Int, ranks)
    for_self && !isempty(list) && push!(list, rank())
    if isempty(list) && !for_self
        return f()  # no mutex to take (an empty list would mean this rank's own)
    end
    held = Cint[r for r in unique!(sort!(list))]
    cname = String(name)
    GC.@preserve held _check(weft_win_mutex_acquire(
        cname, isempty(held) ? C_NULL : pointer(held), length(held)))
    try
        return f()
    finally
        GC.@preserve held _check(weft_win_mutex_release(
            cname, isempty(held) ? C_NULL : pointer(held), length(held)))
    end
end

# ---- topologies --------------------------------------------------------------------------

"""
    Topology

A weighted directed graph over ranks, owned by weft: `W[i, j]` (`weight_matrix`) is the
weight of the edge from rank i-1 to rank j-1 (Julia indices are 1-based, ranks 0-based),
applied by the receiver; `W[i, i]` is rank i-1's self weight. Pure data: usable before
`Weft.init()`. Made by the generators (`ExponentialGraph(n)`, ...) or from a matrix:

    Topology(W::AbstractMatrix{<:Real})
    Topology(n::Integer)   # n ranks, no edges, self weights 1
"""
mutable struct Topology
    ptr::Ptr{weft_topology}

    function Topology(ptr::Ptr{weft_topology})
        ptr == C_NULL && throw(ArgumentError("a Topology needs a weft_topology"))
        return finalizer(_destroy!, new(ptr))
    end
end

# weft_topology_destroy only frees memory (no locks, no MPI): safe from a finalizer.
function _destroy!(topo::Topology)
    ptr = topo.ptr
    topo.ptr = Ptr{weft_topology}(C_NULL)
    weft_topology_destroy(ptr)
    return nothing
end

# Passing a Topology to a CAPI function passes its pointer; ccall keeps the Topology (and
# so the pointer) alive during the call.
Base.cconvert(::Type{Ptr{weft_topology}}, topo::Topology) = topo
Base.unsafe_convert(::Type{Ptr{weft_topology}}, topo::Topology) = topo.ptr

function _new_topology(make)
    out = Ref{Ptr{weft_topology}}(C_NULL)
    _check(make(out))
    return Topology(out[])
end

Topology(n::Integer) = _new_topology(out -> weft_topology_create(out, n))

function Topology(weights::AbstractMatrix{<:Real})
    n = Base.size(weights, 1)
    n == Base.size(weights, 2) ||
        throw(ArgumentError("a weight matrix is square; got $(Base.size(weights))"))
    # permutedims: weft reads the matrix row by row, Julia stores it column by column.
    row_major = Matrix{Cdouble}(permutedims(weights))
    return _new_topology(out -> weft_topology_from_weight_matrix(out, n, row_major))
end

"Rank i sends to i + 2^k (mod n); equal weights per row."
ExponentialTwoGraph(n::Integer) =
    _new_topology(out -> weft_topology_exponential_two(out, n))

"Rank i sends to i + base^k (mod n) for every base^k < n; equal weights per row."
ExponentialGraph(n::Integer; base::Integer=2) =
    _new_topology(out -> weft_topology_exponential(out, n, base))

"Rank i connects to i + d (mod n) for every offset d whose distance around the ring, min(d, n - d), is a power of base (1 included); equal weights per row, as Bluefog defines it."
SymmetricExponentialGraph(n::Integer; base::Integer=4) =
    _new_topology(out -> weft_topology_symmetric_exponential(out, n, base))

"""
    MeshGrid2DGraph(n; shape=nothing)

A 4-neighbor grid of `shape = (rows, cols)` ranks; by default rows is the largest divisor
of n not above sqrt(n).
"""
function MeshGrid2DGraph(n::Integer; shape::Union{Nothing,Tuple{Integer,Integer}}=nothing)
    rows, cols = shape === nothing ? (0, 0) : shape
    return _new_topology(out -> weft_topology_mesh_grid_2d(out, n, rows, cols))
end

"Every rank connected to `center`."
StarGraph(n::Integer; center::Integer=0) =
    _new_topology(out -> weft_topology_star(out, n, center))

"style 0: both directions, 1/3 each; 1: i -> i-1 with 1/2; 2: i -> i+1 with 1/2."
RingGraph(n::Integer; style::Integer=0) =
    _new_topology(out -> weft_topology_ring(out, n, style))

"Every rank connected to every other; 1/n everywhere."
FullyConnectedGraph(n::Integer) =
    _new_topology(out -> weft_topology_fully_connected(out, n))

Base.copy(topo::Topology) = _new_topology(out -> weft_topology_clone(out, topo))

"The number of ranks of `topo`."
num_ranks(topo::Topology) = Int(weft_topology_size(topo))

function Base.show(io::IO, topo::Topology)
    if topo.ptr == C_NULL
        print(io, "Weft.Topology(freed)")
    else
        print(io, "Weft.Topology(", num_ranks(topo), " ranks)")
    end
end

# Reads arrays the header's way, f(buffers..., capacity, count): ask for the size, then
# fill buffers of that size; again if it grew in between (another task changed it).
function _read_arrays(f, types::Type...)
    buffers = map(T -> Vector{T}(undef, 0), types)
    count = Ref{Csize_t}(0)
    while true
        capacity = length(first(buffers))
        status = f(buffers..., Csize_t(capacity), count)
        n = Int(count[])
        if status == WEFT_OK && n <= capacity
            return map(b -> resize!(b, n), buffers)
        elseif (status == WEFT_OK || status == WEFT_ERR_OUT_OF_RANGE) && n > capacity
            foreach(b -> resize!(b, n), buffers)
        else
            _check(status)
        end
    end
end

_read_ranks(f) = Int[r for r in first(_read_arrays(f, Cint))]

"""
    weight_matrix(topo) -> Matrix{Float64}

`W[i, j]`: the weight of the edge from rank i-1 to rank j-1 (0 without an edge).
"""
function weight_matrix(topo::Topology)
    n = num_ranks(topo)
    arrays = _read_arrays(Cdouble) do buffer, capacity, count
        weft_topology_weight_matrix(buffer, capacity, count, topo)
    end
    return permutedims(reshape(first(arrays), n, n))  # weft's rows become the matrix's rows
end

"The ranks that send to `rank` in `topo`, sorted."
in_neighbors(topo::Topology, rank::Integer) = _read_ranks() do buffer, capacity, count
    weft_topology_in_neighbors(buffer, capacity, count, topo, rank)
end

"The ranks `rank` sends to in `topo`, sorted."
out_neighbors(topo::Topology, rank::Integer) = _read_ranks() do buffer, capacity, count
    weft_topology_out_neighbors(buffer, capacity, count, topo, rank)
end

"The weight of the edge from -> to (the self weight when equal; 0 without an edge)."
function edge_weight(topo::Topology, from::Integer, to::Integer)
    weight = Ref{Cdouble}(0)
    _check(weft_topology_weight(weight, topo, from, to))
    return weight[]
end

"Adds (or re-weights) the edge from -> to. Not exported (Graphs.jl has an add_edge!)."
add_edge!(topo::Topology, from::Integer, to::Integer, weight::Real) =
    (_check(weft_topology_add_edge(topo, from, to, weight)); topo)

set_self_weight!(topo::Topology, rank::Integer, weight::Real) =
    (_check(weft_topology_set_self_weight(topo, rank, weight)); topo)

function _weights(query, topo::Topology, rank::Integer)
    self_weight = Ref{Cdouble}(0)
    ranks, weights = _read_arrays(Cint, Cdouble) do r, w, capacity, count
        query(self_weight, r, w, capacity, count, topo, rank)
    end
    return (self_weight[], Dict{Int,Float64}(Int(r) => w for (r, w) in zip(ranks, weights)))
end

"""
    GetRecvWeights(topo, rank) -> (self_weight, Dict(rank => weight))

What `rank` applies: its self weight and the weight of each in-neighbor's edge.
"""
GetRecvWeights(topo::Topology, rank::Integer) =
    _weights(weft_topology_recv_weights, topo, rank)

"""
    GetSendWeights(topo, rank) -> (self_weight, Dict(rank => weight))

Row `rank` of the weight matrix: its self weight and the weight of each out-edge.
"""
GetSendWeights(topo::Topology, rank::Integer) =
    _weights(weft_topology_send_weights, topo, rank)

"Every rank has the same in-degree and the same out-degree."
function IsRegularGraph(topo::Topology)
    result = Ref{Cint}(0)
    _check(weft_topology_is_regular(result, topo))
    return result[] != 0
end

"Same number of ranks and same edges (weights ignored)."
function IsTopologyEquivalent(a::Topology, b::Topology)
    result = Ref{Cint}(0)
    _check(weft_topology_is_equivalent(result, a, b))
    return result[] != 0
end

# ---- dynamic schedules -------------------------------------------------------------------

"""
    Schedule

An infinite iterator of steps, each `(send_ranks, recv_ranks)` (vectors of 0-based ranks).
It is stateful, like a Python generator: each iteration continues where the last stopped.

    steps = GetDynamicOnePeerSendRecvRanks(topo, Weft.rank())
    for (send, recv) in Iterators.take(steps, 10)
        ...
    end
"""
mutable struct Schedule
    ptr::Ptr{weft_schedule}

    function Schedule(ptr::Ptr{weft_schedule})
        ptr == C_NULL && throw(ArgumentError("a Schedule needs a weft_schedule"))
        return finalizer(_destroy!, new(ptr))
    end
end

function _destroy!(schedule::Schedule)
    ptr = schedule.ptr
    schedule.ptr = Ptr{weft_schedule}(C_NULL)
    weft_schedule_destroy(ptr)
    return nothing
end

Base.cconvert(::Type{Ptr{weft_schedule}}, s::Schedule) = s
Base.unsafe_convert(::Type{Ptr{weft_schedule}}, s::Schedule) = s.ptr

function _new_schedule(make)
    out = Ref{Ptr{weft_schedule}}(C_NULL)
    _check(make(out))
    return Schedule(out[])
end

Base.IteratorSize(::Type{Schedule}) = Base.IsInfinite()
Base.eltype(::Type{Schedule}) = Tuple{Vector{Int},Vector{Int}}

function Base.iterate(s::Schedule, state=nothing)
    _check(weft_schedule_next(s))
    send = _read_ranks() do buffer, capacity, count
        weft_schedule_send_ranks(buffer, capacity, count, s)
    end
    recv = _read_ranks() do buffer, capacity, count
        weft_schedule_recv_ranks(buffer, capacity, count, s)
    end
    return ((send, recv), nothing)
end

"One peer per step over `topo`: `rank`'s out-neighbors in turn, clockwise."
GetDynamicOnePeerSendRecvRanks(topo::Topology, rank::Integer) =
    _new_schedule(out -> weft_schedule_one_peer(out, topo, rank))

"Machine-level exponential-2 steps; the ranks are machine indices."
GetExp2DynamicSendRecvMachineRanks(machine_size::Integer, machine_rank::Integer) =
    _new_schedule(out -> weft_schedule_machine_exponential_two(out, machine_size,
                                                                machine_rank))

"Inner-outer ring: one local rank per step talks to other machines, the rest inside."
GetInnerOuterRingDynamicSendRecvRanks(world_size::Integer, local_size::Integer,
                                      rank::Integer) =
    _new_schedule(out -> weft_schedule_inner_outer_ring(out, world_size, local_size, rank))

"Inner-outer exponential-2: as the ring, with exponential-2 steps between machines."
GetInnerOuterExpo2DynamicSendRecvRanks(world_size::Integer, local_size::Integer,
                                       rank::Integer) =
    _new_schedule(out -> weft_schedule_inner_outer_exponential_two(out, world_size,
                                                                    local_size, rank))

# ---- the process's topology --------------------------------------------------------------

"""
    set_topology(topo; is_weighted=false)

Collective: every rank passes an equivalent graph. Throws (changing nothing) while ops are
in flight. `topo` is copied.
"""
set_topology(topo::Topology; is_weighted::Bool=false) =
    _check(weft_comm_set_topology(topo, is_weighted))

"A copy of the topology in force."
load_topology() = _new_topology(weft_comm_load_topology)

is_topo_weighted() = weft_comm_is_topo_weighted() != 0

"The graph between machines that `hierarchical_neighbor_allreduce` uses."
set_machine_topology(topo::Topology; is_weighted::Bool=false) =
    _check(weft_comm_set_machine_topology(topo, is_weighted))

load_machine_topology() = _new_topology(weft_comm_load_machine_topology)

"The ranks this rank receives from, sorted."
in_neighbor_ranks() = _read_ranks(weft_comm_in_neighbor_ranks)

"The ranks this rank sends to, sorted."
out_neighbor_ranks() = _read_ranks(weft_comm_out_neighbor_ranks)

# ---- the step counter of the distributed optimizers --------------------------------------

"""
    StepCounter(steps_per_communication; counts=:forward, units=1)

The state machine behind a distributed optimizer's `num_steps_per_communication` (J), the
same one every language's optimizers use (`weft_step_counter_*` in weft.h), so that all
behave alike. Each counted computation (`counts`: `:forward` or `:backward`, whichever the
optimizer counts) brings a countdown from J towards 0, and the one that reaches 0 starts
the communication ([`computation!`](@ref) returns `:communicate`). A [`step!`](@ref) after
that communicates (waits, combines, and the countdown starts again from J); a `step!`
before is a local update. A counted computation with the countdown already at 0 is a
misuse (`:misuse`): the optimizer warns with [`misuse_warning`](@ref).

Units: an optimizer that counts backward computations launches each parameter's
communication as its gradient is ready, so it gives each parameter a unit (`units` = the
number of parameters). Units are 1-based, like Julia indices: unit `i` is the `i`-th
parameter. Each counts down on its own, and a pass that finds units at 0 is one misuse.

Plain data (no `Weft.init()` needed), freed by a finalizer (or `finalize(counter)`). Not
safe to use from two tasks at once.

    c = StepCounter(3)                # J = 3, counting forward computations
    computation!(c)                   # :counted (countdown 2)
    step!(c)                          # false: a local step
    computation!(c); computation!(c)  # :counted, then :communicate
    step!(c)                          # true: communicate, countdown back to 3
"""
mutable struct StepCounter
    ptr::Ptr{weft_step_counter}
    counts::Symbol
    units::Int

    function StepCounter(ptr::Ptr{weft_step_counter}, counts::Symbol, units::Integer)
        ptr == C_NULL && throw(ArgumentError("a StepCounter needs a weft_step_counter"))
        return finalizer(_destroy!, new(ptr, counts, units))
    end
end

# weft_step_counter_destroy only frees memory: safe from a finalizer.
function _destroy!(counter::StepCounter)
    ptr = counter.ptr
    counter.ptr = Ptr{weft_step_counter}(C_NULL)
    weft_step_counter_destroy(ptr)
    return nothing
end

Base.cconvert(::Type{Ptr{weft_step_counter}}, c::StepCounter) = c
Base.unsafe_convert(::Type{Ptr{weft_step_counter}}, c::StepCounter) = c.ptr

const _COUNT_KINDS = Dict(:forward => WEFT_COUNT_FORWARD, :backward => WEFT_COUNT_BACKWARD)

const _COMPUTATION_EVENTS = Dict(WEFT_COMPUTATION_IGNORED => :ignored,
                                 WEFT_COMPUTATION_COUNTED => :counted,
                                 WEFT_COMPUTATION_COMMUNICATE => :communicate,
                                 WEFT_COMPUTATION_MISUSE => :misuse)

function StepCounter(steps_per_communication::Integer; counts::Symbol=:forward,
                     units::Integer=1)
    kind = get(_COUNT_KINDS, counts, nothing)
    kind === nothing &&
        throw(ArgumentError("counts is :forward or :backward; got :$counts"))
    out = Ref{Ptr{weft_step_counter}}(C_NULL)
    _check(weft_step_counter_create(out, steps_per_communication, kind, units))
    return StepCounter(out[], counts, units)
end

# The C unit of a 1-based Julia unit.
function _unit(c::StepCounter, unit::Integer)
    1 <= unit <= c.units ||
        throw(ArgumentError("unit $unit is out of range 1:$(c.units) (units are 1-based)"))
    return unit - 1
end

"""
    computation!(counter, unit=1; counted=true) -> Symbol

A computation of `unit` finished. Returns what it did: `:ignored` (not counted),
`:counted` (the countdown has not reached 0), `:communicate` (it brought the countdown to
0: start the communication now) or `:misuse` (the countdown was already 0: warn with
[`misuse_warning`](@ref)). `counted=false` is for a computation under no-grad, or of a
model none of whose parameters requires grad: it changes nothing.
"""
function computation!(c::StepCounter, unit::Integer=1; counted::Bool=true)
    event = Ref{Cint}(WEFT_COMPUTATION_IGNORED)
    _check(weft_step_counter_computation(event, c, _unit(c, unit), counted))
    return get(_COMPUTATION_EVENTS, event[]) do
        throw(WeftError(Int(WEFT_ERR_INTERNAL),
                        "weft returned computation event $(event[])"))
    end
end

"""
    step!(counter) -> Bool

A step of the optimizer: `true` when it communicates (some unit reached 0 since the last
communicating step: wait for what was launched, launch the units still counting, combine;
the countdowns start again from J), `false` for a local step. Throws a
`WEFT_ERR_FAILED_PRECONDITION` [`WeftError`](@ref) before any counted computation: the
optimizer is not seeing the model's computations.
"""
function step!(c::StepCounter)
    communicate = Ref{Cint}(0)
    _check(weft_step_counter_step(communicate, c))
    return communicate[] != 0
end

"J, the number of counted computations per communication."
function steps_per_communication(c::StepCounter)
    j = Ref{Int64}(0)
    _check(weft_step_counter_steps_per_communication(j, c))
    return Int(j[])
end

"""
    set_steps_per_communication!(counter, j)

Changes J (at least 1): at once when nothing was counted since the last communicating
step, else from the next one.
"""
set_steps_per_communication!(c::StepCounter, j::Integer) =
    (_check(weft_step_counter_set_steps_per_communication(c, j)); c)

"""
    countdown(counter, unit=1) -> Int

J minus the unit's counted computations since the last communicating step, floored at 0
(0: the unit's communication was launched).
"""
function countdown(c::StepCounter, unit::Integer=1)
    value = Ref{Int64}(0)
    _check(weft_step_counter_countdown(value, c, _unit(c, unit)))
    return Int(value[])
end

"""
    computations(counter) -> (total=..., since_communication=...)

Counted computations (passes over the units) since the counter was made and since the last
communicating step.
"""
function computations(c::StepCounter)
    total = Ref{Int64}(0)
    since = Ref{Int64}(0)
    _check(weft_step_counter_computations(total, since, c))
    return (total=Int(total[]), since_communication=Int(since[]))
end

"""
    misuse_warning(counter) -> String

The warning for the last `:misuse`, in words a user understands (what was expected, and
that `num_steps_per_communication` is the knob); `""` before any.
"""
misuse_warning(c::StepCounter) = _string_or_empty(weft_step_counter_misuse_warning(c))

function Base.show(io::IO, c::StepCounter)
    if c.ptr == C_NULL
        print(io, "Weft.StepCounter(freed)")
    else
        print(io, "Weft.StepCounter(", steps_per_communication(c), "; counts=:", c.counts,
              ", units=", c.units, ")")
    end
end

# ---- elastic pipelining: freezing, partitions, AutoPipe/AutoDP plans ---------------------
#
# The pure computations behind PipeTransformer-style training (pipe/README.md), over
# weft_pipe_*: no Weft.init() needed, nothing communicated. Numbering, as in the rest of
# the module: counts (layers, frozen F, stages K, micro-batches) are the same in every
# language, and F frozen means the first F layers (1:F here, 0:F-1 in C); indices into
# Julia collections are 1-based (layer l, stage s, replica r: grad_norms[l],
# stages(plan)[s], role(plan, rank).stage); ranks stay 0-based, as in MPI.

const _STRATEGIES = Dict(:optimal => WEFT_PIPE_STRATEGY_OPTIMAL,
                         :greedy => WEFT_PIPE_STRATEGY_GREEDY,
                         :even => WEFT_PIPE_STRATEGY_EVEN)

function _strategy(strategy)
    code = get(_STRATEGIES, Symbol(strategy), nothing)
    code === nothing &&
        throw(ArgumentError("strategy is :optimal, :greedy or :even; got " *
                            repr(strategy)))
    return code
end

"""
    freeze_bound(layers, alpha, t) -> Int

The AutoFreeze schedule bound after freeze point `t` (0: before the first):
`ceil(layers * (1 - (1 - alpha)^t))`, exact at integers (`freeze_bound(8, 0.5, 1) == 4`).
`alpha` in (0, 1]; the paper's is 1/3.
"""
function freeze_bound(layers::Integer, alpha::Real, t::Integer)
    frozen = Ref{Cint}(0)
    _check(weft_pipe_freeze_bound(frozen, layers, alpha, t))
    return Int(frozen[])
end

# An option struct of type T as the library makes it (its weft_*_options_init: the
# defaults live in C alone), with each field that `given` names and is not `nothing`
# replaced. Keywords left out, or passed as `nothing`, so keep the library's defaults.
function _options(::Type{T}, init, version, given::NamedTuple) where {T}
    defaults = Ref{T}()
    _check(init(defaults, version))
    return T(map(f -> _option_field(T, defaults[], given, f), fieldnames(T))...)
end

function _option_field(::Type{T}, defaults, given::NamedTuple, field::Symbol) where {T}
    value = get(given, field, nothing)
    return value === nothing ? getfield(defaults, field) : convert(fieldtype(T, field), value)
end

"""
    next_frozen(layers, t, previous; grad_norms=nothing, alpha=nothing,
                gradient_aware=nothing, freeze_last=nothing) -> Int

The frozen count after freeze point `t`, given the count before it (`previous`): the
schedule bound, or with `gradient_aware` at most the trainable layer (`l > previous`) whose
accumulated gradient norm `grad_norms[l]` is the smallest (one norm per layer, summed over
the interval). Never below `previous` (layers never unfreeze) and, unless `freeze_last`, at
most `layers - 1` (the head keeps training).
"""
function next_frozen(layers::Integer, t::Integer, previous::Integer;
                     grad_norms::Union{Nothing,AbstractVector{<:Real}}=nothing,
                     alpha::Real=1 / 3, gradient_aware::Bool=false, freeze_last::Bool=false)
    # No norms: an empty vector (weft takes NULL, 0 and a pointer with 0 alike).
    norms = grad_norms === nothing ? Cdouble[] : convert(Vector{Cdouble}, grad_norms)
    options = Ref(_options(weft_pipe_freeze_options, weft_pipe_freeze_options_init,
                           WEFT_PIPE_FREEZE_OPTIONS_VERSION,
                           (alpha=alpha, gradient_aware=gradient_aware,
                            freeze_last=freeze_last)))
    frozen = Ref{Cint}(0)
    _check(weft_pipe_next_frozen(frozen, layers, t, previous, norms, length(norms),
                                 options))
    return Int(frozen[])
end

"""
    parameter_costs(sizes; frozen=0, lambda=nothing) -> Vector{Float64}

Per-layer costs from parameter counts: a trainable layer costs its count, each of the first
`frozen` layers `lambda` times it (frozen layers run forward only; `nothing`: the plan
options' default, 1/6).
"""
function parameter_costs(sizes::AbstractVector{<:Real}; frozen::Integer=0,
                         lambda::Union{Nothing,Real}=nothing)
    if lambda === nothing
        lambda = _options(weft_pipe_plan_options, weft_pipe_plan_options_init,
                          WEFT_PIPE_PLAN_OPTIONS_VERSION, NamedTuple()).lambda
    end
    values = convert(Vector{Cdouble}, sizes)
    return first(_read_arrays(Cdouble) do buffer, capacity, count
        weft_pipe_parameter_costs(buffer, capacity, count, values, length(values), frozen,
                                  lambda)
    end)
end

"""
    LayerPartition

Layers in contiguous stages: `boundaries` has K + 1 entries, layer counts (stage `s` holds
layers `boundaries[s]+1:boundaries[s+1]`, see [`stages`](@ref)); `stage_costs[s]` is the
cost of stage `s`, `max_cost` the largest.
"""
struct LayerPartition
    boundaries::Vector{Int}
    stage_costs::Vector{Float64}
    max_cost::Float64
end

_ranges(b::AbstractVector{<:Integer}) = [b[s]+1:b[s+1] for s in 1:length(b)-1]

"The layers of each stage, as 1-based ranges (an empty range for an empty stage)."
stages(p::LayerPartition) = _ranges(p.boundaries)

"""
    partition_layers(costs, stages; strategy=:optimal) -> LayerPartition

Partitions the layers (one cost each) into `stages` contiguous stages. `:optimal`
minimizes the largest stage, never leaves a stage empty and takes the lexicographically
smallest boundaries among the optimal partitions; `:greedy` is PipeTransformer's walk (it
may leave stages empty); `:even` gives every stage the same number of layers (the first
L mod K one more). Not `partition`: `Iterators.partition` is another thing.
"""
function partition_layers(costs::AbstractVector{<:Real}, num_stages::Integer;
                          strategy=:optimal)
    values = convert(Vector{Cdouble}, costs)
    code = _strategy(strategy)
    max_cost = Ref{Cdouble}(0)
    b = first(_read_arrays(Cint) do buffer, capacity, count
        weft_pipe_partition(buffer, capacity, count, max_cost, values, length(values),
                            num_stages, code)
    end)
    bounds = Int.(b)
    costs_by_stage = Float64[sum(values[r]; init=0.0) for r in _ranges(bounds)]
    return LayerPartition(bounds, costs_by_stage, max_cost[])
end

"""
    PipePlan(sizes, frozen=0; machines=nothing, devices_per_machine=nothing, k0=nothing,
             lambda=nothing, strategy=nothing, micro_batches=nothing, previous=nothing)

The AutoPipe/AutoDP plan for the first `frozen` layers frozen, of a model whose layers have
`sizes` parameters, on `machines * devices_per_machine` devices. `previous === nothing`:
the initial plan, K = `k0` (M0, the largest stage of the partition of all layers on k0
stages, stands for what a device holds). Otherwise K starts from `previous`'s and halves
while the balanced partition on K/2 stages fits under M0; the ranks of the replicas this
adds are [`newly_active`](@ref). Use the same sizes and options for every plan of a run.
`micro_batches = 0` means 4 K. Options left out, or `nothing`, keep the library's defaults
(`weft_pipe_plan_options_init`: 1 machine of 8 devices, `k0 = 8`, `lambda = 1/6`,
`:optimal`, `micro_batches = 0`).

Read it with [`plan_info`](@ref), [`boundaries`](@ref), [`stage_costs`](@ref),
[`stages`](@ref), [`newly_active`](@ref) and [`role`](@ref). Plain data, freed by a
finalizer (or `finalize(plan)`).

    plan = PipePlan(ones(12))                 # K = 8 on 1 machine of 8 devices
    plan = PipePlan(ones(12), 7; previous=plan)
    plan_info(plan).k                         # 4: two replicas
    newly_active(plan)                        # [4, 5, 6, 7] (0-based ranks)
    role(plan, 5)                             # (replica = 2, stage = 2), 1-based
"""
mutable struct PipePlan
    ptr::Ptr{weft_pipe_plan}

    function PipePlan(ptr::Ptr{weft_pipe_plan})
        ptr == C_NULL && throw(ArgumentError("a PipePlan needs a weft_pipe_plan"))
        return finalizer(_destroy!, new(ptr))
    end
end

# weft_pipe_plan_destroy only frees memory: safe from a finalizer.
function _destroy!(plan::PipePlan)
    ptr = plan.ptr
    plan.ptr = Ptr{weft_pipe_plan}(C_NULL)
    weft_pipe_plan_destroy(ptr)
    return nothing
end

Base.cconvert(::Type{Ptr{weft_pipe_plan}}, p::PipePlan) = p
Base.unsafe_convert(::Type{Ptr{weft_pipe_plan}}, p::PipePlan) = p.ptr

function PipePlan(sizes::AbstractVector{<:Real}, frozen::Integer=0;
                  machines::Union{Nothing,Integer}=nothing,
                  devices_per_machine::Union{Nothing,Integer}=nothing,
                  k0::Union{Nothing,Integer}=nothing, lambda::Union{Nothing,Real}=nothing,
                  strategy=nothing, micro_batches::Union{Nothing,Integer}=nothing,
                  previous::Union{Nothing,PipePlan}=nothing)
    values = convert(Vector{Cdouble}, sizes)
    options = Ref(_options(weft_pipe_plan_options, weft_pipe_plan_options_init,
                           WEFT_PIPE_PLAN_OPTIONS_VERSION,
                           (machines=machines, devices_per_machine=devices_per_machine,
                            k0=k0, lambda=lambda,
                            strategy=strategy === nothing ? nothing : _strategy(strategy),
                            micro_batches=micro_batches)))
    # A freed previous plan would pass NULL: an initial plan, silently.
    previous !== nothing && previous.ptr == C_NULL &&
        throw(ArgumentError("the previous PipePlan was freed"))
    out = Ref{Ptr{weft_pipe_plan}}(C_NULL)
    prev = previous === nothing ? Ptr{weft_pipe_plan}(C_NULL) : previous
    _check(weft_pipe_plan_create(out, values, length(values), frozen, options, prev))
    return PipePlan(out[])
end

"""
    plan_info(plan) -> (frozen, k, replicas, micro_batches, world, m0, max_cost)

The plan's summary as a named tuple: frozen layers, pipeline length K, replicas,
micro-batches per mini-batch, ranks, M0 (the largest stage of the initial partition) and
the largest stage of this plan.
"""
function plan_info(plan::PipePlan)
    info = Ref(weft_pipe_plan_info())
    _check(weft_pipe_plan_get_info(info, plan))
    i = info[]
    return (frozen=Int(i.frozen), k=Int(i.k), replicas=Int(i.replicas),
            micro_batches=Int(i.micro_batches), world=Int(i.world), m0=i.m0,
            max_cost=i.max_cost)
end

"K + 1 layer counts: stage `s` holds layers `boundaries[s]+1:boundaries[s+1]`."
boundaries(plan::PipePlan) = _read_ranks() do buffer, capacity, count
    weft_pipe_plan_boundaries(buffer, capacity, count, plan)
end

"The cost of each of the K stages."
stage_costs(plan::PipePlan) = first(_read_arrays(Cdouble) do buffer, capacity, count
    weft_pipe_plan_stage_costs(buffer, capacity, count, plan)
end)

"The layers of each of the K stages, as 1-based ranges."
stages(plan::PipePlan) = _ranges(boundaries(plan))

"""
    newly_active(plan) -> Vector{Int}

The ranks (0-based, sorted) active in a replica the previous plan did not have, or idle
before: they receive their layers from an existing replica. Empty for an initial plan.
"""
newly_active(plan::PipePlan) = _read_ranks() do buffer, capacity, count
    weft_pipe_plan_newly_active(buffer, capacity, count, plan)
end

"""
    role(plan, rank) -> (replica=r, stage=s) or nothing

What `rank` (0-based) does: stage `s` of pipeline replica `r`, both 1-based; `nothing` for
an idle rank.
"""
function role(plan::PipePlan, rank::Integer)
    replica = Ref{Cint}(-1)
    stage = Ref{Cint}(-1)
    _check(weft_pipe_plan_role(replica, stage, plan, rank))
    replica[] < 0 && return nothing
    return (replica=Int(replica[]) + 1, stage=Int(stage[]) + 1)
end

function Base.show(io::IO, plan::PipePlan)
    if plan.ptr == C_NULL
        print(io, "Weft.PipePlan(freed)")
    else
        i = plan_info(plan)
        print(io, "Weft.PipePlan(frozen=", i.frozen, ", k=", i.k, ", replicas=", i.replicas,
              ", micro_batches=", i.micro_batches, ")")
    end
end

const _SCHEDULES = Dict("gpipe" => WEFT_PIPE_SCHEDULE_GPIPE,
                        "1f1b" => WEFT_PIPE_SCHEDULE_1F1B)

"""
    schedule_bubble(kind, stages, micro_batches) -> (bubble=..., cycles=...)

The micro-batch schedule `kind` (`:gpipe`, fill-drain, or `"1f1b"`) of `stages` stages and
`micro_batches` micro-batches, with unit time per forward and backward: the idle fraction
of its stage-slots, `(K - 1) / (M + K - 1)`, and its length in clock cycles, `2 (M + K -
1)`.
"""
function schedule_bubble(kind::Union{Symbol,AbstractString}, num_stages::Integer,
                         micro_batches::Integer)
    code = get(_SCHEDULES, String(kind), nothing)
    code === nothing &&
        throw(ArgumentError("kind is :gpipe or \"1f1b\"; got $(repr(kind))"))
    bubble = Ref{Cdouble}(0)
    cycles = Ref{Cint}(0)
    _check(weft_pipe_schedule_bubble(bubble, cycles, code, num_stages, micro_batches))
    return (bubble=bubble[], cycles=Int(cycles[]))
end

# ---- the elastic pipeline trainer ----------------------------------------------------------

const _OPTIMIZERS = Dict("sgd" => WEFT_PIPE_OPTIMIZER_SGD, "adam" => WEFT_PIPE_OPTIMIZER_ADAM,
                         "adamw" => WEFT_PIPE_OPTIMIZER_ADAMW)
const _LOSSES = Dict("cross_entropy" => WEFT_PIPE_LOSS_CROSS_ENTROPY,
                     "mse" => WEFT_PIPE_LOSS_MSE)

function _pick(table, value, what)
    code = get(table, String(value), nothing)
    code === nothing && throw(ArgumentError(
        "$what is one of $(join(sort!(collect(keys(table))), ", ")); got $(repr(value))"))
    return code
end

"""
    PipeTrainer(path; k0=0, freeze=true, alpha=1/3, gradient_aware=false,
                freeze_every_epochs=1, autopipe=true, autodp=true, cache=false,
                cache_dir="", schedule=:gpipe, micro_batches=0, batch_size=64, seed=1,
                optimizer=:adam, lr=1e-3, momentum=0.0, weight_decay=0.0,
                loss=:cross_entropy, name="pipe", decentralized=false)

Elastic pipeline training (AutoFreeze, AutoPipe, AutoDP, AutoCache) of the TorchScript model
at `path`: a file written by `torch.jit.save` of a module whose children, in order, are the
layers (e.g. a scripted `torch.nn.Sequential`). Collective: every rank makes the trainer
and calls [`train_epoch!`](@ref) and [`evaluate`](@ref), in the same order, after
`Weft.init()`. `optimizer` is `:sgd`, `:adam` or `:adamw`; `loss` `:cross_entropy` or
`:mse`; `schedule` `:gpipe` or `"1f1b"`. Two trainers alive at once need different names.
With `decentralized`, the replicas of a stage average parameters with one peer replica per
step instead of allreducing gradients. The values above are the library's defaults
(`weft_pipe_trainer_options_init`), which keywords left out, or `nothing`, keep.
`close(trainer)` frees it (a finalizer does otherwise).

    trainer = PipeTrainer("model.pt"; alpha=0.5, batch_size=32, lr=1e-2)
    m = train_epoch!(trainer, x, y)   # x: features × N Float32, y: N labels in 1:C
    println(m.line)
    evaluate(trainer, x, y)           # accuracy
"""
mutable struct PipeTrainer
    ptr::Ptr{weft_pipe_trainer}
    loss::Cint
end

function PipeTrainer(path::AbstractString; k0::Union{Nothing,Integer}=nothing,
                     freeze::Union{Nothing,Bool}=nothing, alpha::Union{Nothing,Real}=nothing,
                     gradient_aware::Union{Nothing,Bool}=nothing,
                     freeze_every_epochs::Union{Nothing,Integer}=nothing,
                     autopipe::Union{Nothing,Bool}=nothing, autodp::Union{Nothing,Bool}=nothing,
                     cache::Union{Nothing,Bool}=nothing,
                     cache_dir::Union{Nothing,AbstractString}=nothing, schedule=nothing,
                     micro_batches::Union{Nothing,Integer}=nothing,
                     batch_size::Union{Nothing,Integer}=nothing,
                     seed::Union{Nothing,Integer}=nothing, optimizer=nothing,
                     lr::Union{Nothing,Real}=nothing, momentum::Union{Nothing,Real}=nothing,
                     weight_decay::Union{Nothing,Real}=nothing, loss=nothing,
                     name::Union{Nothing,AbstractString}=nothing,
                     decentralized::Union{Nothing,Bool}=nothing)
    sched = schedule === nothing ? nothing : _pick(_SCHEDULES, schedule, "schedule")
    opt = optimizer === nothing ? nothing : _pick(_OPTIMIZERS, optimizer, "optimizer")
    loss_given = loss === nothing ? nothing : _pick(_LOSSES, loss, "loss")
    dir = cache_dir === nothing ? nothing : String(cache_dir)
    prefix = name === nothing ? nothing : String(name)
    out = Ref{Ptr{weft_pipe_trainer}}(C_NULL)
    local options
    GC.@preserve dir prefix begin
        options = Ref(_options(weft_pipe_trainer_options, weft_pipe_trainer_options_init,
            WEFT_PIPE_TRAINER_OPTIONS_VERSION,
            (k0=k0, freeze=freeze, alpha=alpha, gradient_aware=gradient_aware,
             freeze_every_epochs=freeze_every_epochs, autopipe=autopipe, autodp=autodp,
             cache=cache, cache_dir=dir === nothing ? nothing : pointer(dir),
             schedule=sched, micro_batches=micro_batches, batch_size=batch_size, seed=seed,
             optimizer=opt, lr=lr, momentum=momentum, weight_decay=weight_decay,
             loss=loss_given, name=prefix === nothing ? nothing : pointer(prefix),
             decentralized=decentralized)))
        _check(weft_pipe_trainer_create(out, path, options))
    end
    return finalizer(_destroy!, PipeTrainer(out[], options[].loss))
end

# weft_pipe_trainer_destroy frees memory only (no communication): safe from a finalizer.
function _destroy!(trainer::PipeTrainer)
    ptr = trainer.ptr
    trainer.ptr = Ptr{weft_pipe_trainer}(C_NULL)
    weft_pipe_trainer_destroy(ptr)
    return nothing
end

Base.close(trainer::PipeTrainer) = _destroy!(trainer)

Base.cconvert(::Type{Ptr{weft_pipe_trainer}}, t::PipeTrainer) = t
function Base.unsafe_convert(::Type{Ptr{weft_pipe_trainer}}, t::PipeTrainer)
    t.ptr == C_NULL && throw(WeftError(Int(WEFT_ERR_FAILED_PRECONDITION),
                                       "the PipeTrainer was closed"))
    return t.ptr
end

# Class labels 1:C (Julia's) as the 0-based int64 indices weft takes; other targets as
# they are.
_targets(trainer::PipeTrainer, y::AbstractArray{<:Integer}) =
    trainer.loss == WEFT_PIPE_LOSS_CROSS_ENTROPY ? Int64.(y) .- 1 : _dense(y)
_targets(::PipeTrainer, y::AbstractArray) = _dense(y)

"""
    train_epoch!(trainer, inputs, targets) -> metrics

Collective: one epoch over the whole training set (the same on every rank), then the
freeze point's transition. `inputs`: Float32 or Float64 with the samples along the LAST
dimension (features × N, as Flux has them); `targets`: N class labels in `1:C` for
cross-entropy, or floats shaped like the outputs (C × N) for MSE. The metrics are a named
tuple with the fields of `weft_pipe_epoch_metrics` (epoch 0-based, as in the line) and
`line`, the machine-readable "PIPE epoch=..." line.
"""
function train_epoch!(trainer::PipeTrainer, inputs::AbstractArray, targets::AbstractArray)
    x = _Tensor(_dense(inputs))
    y = _Tensor(_targets(trainer, targets))
    metrics = Ref(weft_pipe_epoch_metrics())
    GC.@preserve x y _check(weft_pipe_trainer_train_epoch(metrics, trainer, x.dl, y.dl))
    m = metrics[]
    return (epoch=Int(m.epoch), frozen=Int(m.frozen), k=Int(m.k), replicas=Int(m.replicas),
            micro_batches=Int(m.micro_batches), bubble_fraction=m.bubble_fraction,
            train_seconds=m.train_seconds, samples=Int(m.samples),
            samples_per_second=m.samples_per_second, loss=m.loss,
            syncs_per_second=m.syncs_per_second, cache_hit_rate=m.cache_hit_rate,
            transitioned=m.transitioned != 0, next_frozen=Int(m.next_frozen),
            next_k=Int(m.next_k), next_replicas=Int(m.next_replicas),
            transition_seconds=m.transition_seconds,
            transition_bytes=Int(m.transition_bytes), line=last_line(trainer))
end

"""
    evaluate(trainer, inputs, targets) -> accuracy

Collective: the fraction of the samples whose highest output is the label (`targets`: N
labels in `1:C`; a cross-entropy trainer).
"""
function evaluate(trainer::PipeTrainer, inputs::AbstractArray, targets::AbstractArray)
    x = _Tensor(_dense(inputs))
    y = _Tensor(_targets(trainer, targets))
    accuracy = Ref{Cdouble}(0)
    GC.@preserve x y _check(weft_pipe_trainer_evaluate(accuracy, trainer, x.dl, y.dl))
    return accuracy[]
end

"The last epoch's \"PIPE epoch=...\" line (\"\" before the first)."
function last_line(trainer::PipeTrainer)
    needed = Ref{Csize_t}(0)
    _check(weft_pipe_trainer_last_line(Ptr{Cchar}(C_NULL), 0, needed, trainer))
    buffer = Vector{UInt8}(undef, needed[])
    GC.@preserve buffer _check(weft_pipe_trainer_last_line(pointer(buffer), length(buffer),
                                                           needed, trainer))
    return String(buffer[1:end-1])
end

"""
    role(trainer) -> (replica=r, stage=s) or nothing

This rank's place in the trainer's current plan (1-based); `nothing` when idle.
"""
function role(trainer::PipeTrainer)
    replica = Ref{Cint}(-1)
    stage = Ref{Cint}(-1)
    _check(weft_pipe_trainer_role(replica, stage, trainer))
    replica[] < 0 && return nothing
    return (replica=Int(replica[]) + 1, stage=Int(stage[]) + 1)
end

"The trainer's current plan (what the next epoch trains with), as [`plan_info`](@ref)."
function plan_info(trainer::PipeTrainer)
    info = Ref(weft_pipe_plan_info())
    _check(weft_pipe_trainer_get_plan_info(info, trainer))
    i = info[]
    return (frozen=Int(i.frozen), k=Int(i.k), replicas=Int(i.replicas),
            micro_batches=Int(i.micro_batches), world=Int(i.world), m0=i.m0,
            max_cost=i.max_cost)
end

# ---- settings ----------------------------------------------------------------------------

"Overrides a WEFT_* setting in this process (validated at once; most are read at init)."
config_set(name::AbstractString, value) = _check(weft_config_set(name, string(value)))

"Drops an override made with `config_set`."
config_unset(name::AbstractString) = _check(weft_config_unset(name))

"The value of a WEFT_* setting in force, as text."
function config_get(name::AbstractString)
    value = Ref{Ptr{Cchar}}(C_NULL)
    _check(weft_config_get(value, name))
    return _string_or_empty(value[])
end

"A table of every setting: value in force, default, description."
config_describe() = _string_or_empty(weft_config_describe())

# ---- timeline (Chrome trace) -------------------------------------------------------------

"Starts writing this rank's trace to `path` (needs `Weft.init()`)."
timeline_start(path::AbstractString) = _check(weft_timeline_start(path))

timeline_stop() = _check(weft_timeline_stop())

"Starts a user span (e.g. \"forward\") on the timeline row of `tensor_name`."
timeline_start_activity(tensor_name::AbstractString, activity::AbstractString) =
    _check(weft_timeline_start_activity(tensor_name, activity))

timeline_end_activity(tensor_name::AbstractString) =
    _check(weft_timeline_end_activity(tensor_name))

"Whether a timeline is being written."
timeline_active() = weft_timeline_active() != 0

"""
    timeline_context(f, tensor_name, activity)

Runs `f()` inside a user span: `timeline_context("x", "forward") do ... end`.
"""
function timeline_context(f, tensor_name::AbstractString, activity::AbstractString)
    timeline_start_activity(tensor_name, activity)
    try
        return f()
    finally
        timeline_end_activity(tensor_name)
    end
end

end  # module Weft
