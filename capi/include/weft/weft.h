/* weft's stable C ABI: the one public header every binding (Python, Go, Julia) and every
 * C program uses. C99; no C++ type or exception crosses it.
 *
 * Conventions (capi/README.md has the stability rules):
 *  - Names are weft_<module>_<verb>; macros are WEFT_*. The process model (weft_init,
 *    weft_rank, ...) and the error functions have no module part.
 *  - Every call that can fail returns a weft_status (0 = WEFT_OK). On failure,
 *    weft_last_error() says what was expected and what was found, for this thread.
 *  - Objects the library creates are opaque handles with a create/destroy pair, returned
 *    through an out-parameter that comes first; destroy(NULL) does nothing.
 *  - Arrays are returned into caller buffers as (buffer, capacity, *count): *count is always
 *    set to the number of elements available; (NULL, 0) only asks for that count; a buffer
 *    too small is WEFT_ERR_OUT_OF_RANGE with nothing written.
 *  - Strings the library returns (const char*) stay valid until the next weft call on the
 *    same thread; copy them to keep them.
 *  - Tensors are DLPack DLTensors on the CPU (kDLCPU). weft reads an input and writes an
 *    output only during the op; for a nonblocking op, both must stay alive until the
 *    request has completed (weft_request_keep_alive ties their owner to the request).
 *  - Option structs carry a version field; initialize them with the matching _INIT macro, or
 *    with weft_<x>_options_init(&options, WEFT_<X>_OPTIONS_VERSION), which writes the
 *    library's defaults (what bindings use, so that no binding repeats them), so
 *    that a program compiled against an older header keeps working. NULL options means the
 *    defaults.
 *  - Ops are matched across ranks by name, or by call order when name is NULL or "".
 *    Every rank must call every op. The output may be the input (in place), but may not
 *    share only part of the input's memory (WEFT_ERR_INVALID_ARGUMENT). An op refused
 *    on one rank (a bad argument) still takes its place in the call order: the other
 *    ranks' op fails with that rank's reason instead of waiting for it.
 *  - Thread-safe: any thread may call any function after weft_init(), except that unnamed
 *    ops (and barrier, set_topology) are refused on threads other than weft_init()'s (or
 *    the one that called weft_comm_claim_call_order since), whose order could differ
 *    across ranks: name ops started on other threads. One topology or
 *    schedule object must not be changed (add_edge, next) by two threads at once.
 */
#ifndef WEFT_WEFT_H_
#define WEFT_WEFT_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#define WEFT_VERSION_MAJOR 0
#define WEFT_VERSION_MINOR 1
#define WEFT_VERSION_PATCH 0
/* major * 10000 + minor * 100 + patch */
#define WEFT_VERSION_NUMBER \
  (WEFT_VERSION_MAJOR * 10000 + WEFT_VERSION_MINOR * 100 + WEFT_VERSION_PATCH)

#if defined(__GNUC__) || defined(__clang__)
#define WEFT_API __attribute__((visibility("default")))
#else
#define WEFT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status, errors, version ------------------------------------------------------- */

typedef enum weft_status {
  WEFT_OK = 0,
  WEFT_ERR_INVALID_ARGUMENT = 1,   /* bad shape, dtype, rank, weight, name, option */
  WEFT_ERR_FAILED_PRECONDITION = 2, /* not initialized, ops in flight, mismatched ranks */
  WEFT_ERR_NOT_FOUND = 3,          /* no such window or named object */
  WEFT_ERR_OUT_OF_RANGE = 4,       /* a caller buffer is too small */
  WEFT_ERR_UNIMPLEMENTED = 5,      /* not supported by this build or device */
  WEFT_ERR_DEADLINE_EXCEEDED = 6,  /* a stall passed WEFT_STALL_TIMEOUT_SECONDS */
  WEFT_ERR_ABORTED = 7,            /* the op was abandoned (shutdown, a peer failed) */
  WEFT_ERR_UNAVAILABLE = 8,        /* a peer or transport is unreachable */
  WEFT_ERR_RESOURCE_EXHAUSTED = 9, /* out of memory */
  WEFT_ERR_INTERNAL = 10,          /* a bug in weft or in the library below it */
  WEFT_ERR_UNKNOWN = 11
} weft_status;

/* The generic text of a status ("invalid argument"); never NULL. */
WEFT_API const char* weft_status_string(weft_status status);
/* The message of the most recent failed weft call on this thread ("" if none). */
WEFT_API const char* weft_last_error(void);
/* "0.1.0": the version of the library loaded at run time. */
WEFT_API const char* weft_version(void);
/* WEFT_VERSION_NUMBER of the library loaded at run time. */
WEFT_API int weft_version_number(void);

/* ---- process model ------------------------------------------------------------------ */

/* Starts MPI (unless the program already did) and weft's engine. The default topology is
 * the exponential graph over all ranks. Twice is an error; init after shutdown works. */
WEFT_API weft_status weft_init(void);
/* Errors name the portable call "init()" (weft_init here, weft.init in Python, ...).
 * Waits until every rank has called it; ops that cannot complete then fail. */
WEFT_API weft_status weft_shutdown(void);
WEFT_API int weft_is_initialized(void);
/* Finalizes MPI if weft started it (after weft_shutdown() if still initialized); nothing
 * more if the program started MPI. Then weft_init() fails. It runs by itself at process
 * exit (atexit); call it last where exit handlers do not run (Go's runtime). */
WEFT_API weft_status weft_finalize(void);
/* Ends the whole job now, from a rank that cannot go on (an error nothing caught) while
 * the others may wait for it in an op: closes this rank's timeline, then MPI_Abort(code),
 * which makes Open MPI's launcher stop every rank. Without a running MPI job it ends this
 * process alone, with exit status `code`. Never returns. */
WEFT_API void weft_abort(int code);
/* Unnamed ops (name NULL or "") are matched across ranks by their order on the thread that
 * called weft_init, and refused on any other thread. This makes the calling thread that
 * thread instead; before weft_init it does nothing. It is for runtimes that move the
 * caller's code between threads (the Go binding claims the order before each unnamed op,
 * which it serializes): threads that claim it while others run unnamed ops give those ops
 * an order that can differ across ranks. */
WEFT_API void weft_comm_claim_call_order(void);
/* These return -1 before weft_init(). */
WEFT_API int weft_rank(void);
WEFT_API int weft_size(void);
WEFT_API int weft_local_rank(void);
WEFT_API int weft_local_size(void);
WEFT_API int weft_machine_rank(void);
WEFT_API int weft_machine_size(void);
/* 1 when every machine runs the same number of ranks and each machine's ranks are
 * consecutive (machine m holds ranks m * local_size ...), else 0; -1 before weft_init(). */
WEFT_API int weft_is_homogeneous(void);
/* *result = 1 when MPI windows here use MPI's unified memory model, else 0. Needs
 * weft_init(); not collective. */
WEFT_API weft_status weft_unified_mpi_window_model(int* result);
/* 1 when this build runs CUDA tensors on NCCL, else 0. */
WEFT_API int weft_nccl_built(void);

/* ---- topologies ----------------------------------------------------------------------- */

/* A weighted directed graph over ranks: W[i][j] is the weight of the edge i -> j, applied by
 * the receiver j; W[i][i] is rank i's self weight. Pure data: usable before weft_init(). */
typedef struct weft_topology weft_topology;

/* `size` ranks, no edges, every self weight 1. */
WEFT_API weft_status weft_topology_create(weft_topology** out, int size);
/* From a dense row-major size x size matrix: w[i*size+j] != 0 (i != j) is an edge. */
WEFT_API weft_status weft_topology_from_weight_matrix(weft_topology** out, int size,
                                                      const double* weights);
/* Generators (comm/topology.h defines each). */
WEFT_API weft_status weft_topology_exponential(weft_topology** out, int size, int base);
WEFT_API weft_status weft_topology_exponential_two(weft_topology** out, int size);
WEFT_API weft_status weft_topology_symmetric_exponential(weft_topology** out, int size,
                                                         int base);
/* rows = cols = 0: rows is the largest divisor of size not above sqrt(size). */
WEFT_API weft_status weft_topology_mesh_grid_2d(weft_topology** out, int size, int rows,
                                                int cols);
WEFT_API weft_status weft_topology_star(weft_topology** out, int size, int center);
/* style 0: bidirectional, 1/3 each; 1: i -> i-1 with 1/2; 2: i -> i+1 with 1/2. */
WEFT_API weft_status weft_topology_ring(weft_topology** out, int size, int style);
WEFT_API weft_status weft_topology_fully_connected(weft_topology** out, int size);
WEFT_API weft_status weft_topology_clone(weft_topology** out, const weft_topology* topo);
WEFT_API void weft_topology_destroy(weft_topology* topo);

/* Adds (or re-weights) the edge from -> to. */
WEFT_API weft_status weft_topology_add_edge(weft_topology* topo, int from, int to,
                                            double weight);
WEFT_API weft_status weft_topology_set_self_weight(weft_topology* topo, int rank,
                                                   double weight);

/* -1 for NULL. */
WEFT_API int weft_topology_size(const weft_topology* topo);
/* 0 when there is no edge; the self weight when from == to. */
WEFT_API weft_status weft_topology_weight(double* weight, const weft_topology* topo, int from,
                                          int to);
/* Neighbors sorted by rank, self excluded. */
WEFT_API weft_status weft_topology_in_neighbors(int* ranks, size_t capacity, size_t* count,
                                                const weft_topology* topo, int rank);
WEFT_API weft_status weft_topology_out_neighbors(int* ranks, size_t capacity, size_t* count,
                                                 const weft_topology* topo, int rank);
/* The dense row-major matrix (size * size doubles). */
WEFT_API weft_status weft_topology_weight_matrix(double* weights, size_t capacity,
                                                 size_t* count, const weft_topology* topo);
/* (W[r][r], {i: W[i][r] for each in-neighbor i}), neighbors sorted by rank. */
WEFT_API weft_status weft_topology_recv_weights(double* self_weight, int* ranks,
                                                double* weights, size_t capacity,
                                                size_t* count, const weft_topology* topo,
                                                int rank);
/* (W[r][r], {j: W[r][j] for each out-neighbor j}): row r. */
WEFT_API weft_status weft_topology_send_weights(double* self_weight, int* ranks,
                                                double* weights, size_t capacity,
                                                size_t* count, const weft_topology* topo,
                                                int rank);
/* Every rank has the same in-degree and the same out-degree. */
WEFT_API weft_status weft_topology_is_regular(int* result, const weft_topology* topo);
/* Same size and same edges (weights ignored). */
WEFT_API weft_status weft_topology_is_equivalent(int* result, const weft_topology* a,
                                                 const weft_topology* b);

/* ---- dynamic schedules ---------------------------------------------------------------- */

/* An infinite sequence of steps, each a (send ranks, receive ranks) pair. */
typedef struct weft_schedule weft_schedule;

/* One peer per step over `topo` (copied): rank's out-neighbors sorted clockwise. */
WEFT_API weft_status weft_schedule_one_peer(weft_schedule** out, const weft_topology* topo,
                                            int rank);
/* Machine level: ranks are machine indices. */
WEFT_API weft_status weft_schedule_machine_exponential_two(weft_schedule** out,
                                                           int machine_size,
                                                           int machine_rank);
WEFT_API weft_status weft_schedule_inner_outer_ring(weft_schedule** out, int world_size,
                                                    int local_size, int rank);
WEFT_API weft_status weft_schedule_inner_outer_exponential_two(weft_schedule** out,
                                                               int world_size, int local_size,
                                                               int rank);
WEFT_API void weft_schedule_destroy(weft_schedule* schedule);
/* Advances to the next step (the first call yields step 0). */
WEFT_API weft_status weft_schedule_next(weft_schedule* schedule);
/* The current step's ranks; WEFT_ERR_FAILED_PRECONDITION before the first next(). */
WEFT_API weft_status weft_schedule_send_ranks(int* ranks, size_t capacity, size_t* count,
                                              const weft_schedule* schedule);
WEFT_API weft_status weft_schedule_recv_ranks(int* ranks, size_t capacity, size_t* count,
                                              const weft_schedule* schedule);

/* ---- the process's topology ---------------------------------------------------------- */

/* Collective: every rank passes an equivalent graph; fails, changing nothing, while ops
 * are in flight. `topo` is copied. */
WEFT_API weft_status weft_comm_set_topology(const weft_topology* topo, int is_weighted);
/* A copy of the topology in force (destroy it). */
WEFT_API weft_status weft_comm_load_topology(weft_topology** out);
WEFT_API int weft_comm_is_topo_weighted(void);
WEFT_API weft_status weft_comm_in_neighbor_ranks(int* ranks, size_t capacity, size_t* count);
WEFT_API weft_status weft_comm_out_neighbor_ranks(int* ranks, size_t capacity, size_t* count);
/* The graph between machines used by the hierarchical op. */
WEFT_API weft_status weft_comm_set_machine_topology(const weft_topology* topo,
                                                    int is_weighted);
WEFT_API weft_status weft_comm_load_machine_topology(weft_topology** out);

/* ---- requests (nonblocking ops) ------------------------------------------------------- */

typedef struct weft_request weft_request;

/* *done = 1 once the op has completed (successfully or not). */
WEFT_API weft_status weft_request_poll(int* done, const weft_request* request);
/* Waits for the op and returns its status; waiting again returns the same status. */
WEFT_API weft_status weft_request_wait(weft_request* request);
/* For allgather ops and weft_comm_recv_any, after a successful wait: moves the
 * library-allocated result to the caller, who calls (*out)->deleter(*out) when done with
 * it. Once only. */
WEFT_API weft_status weft_request_take_output(DLManagedTensor** out, weft_request* request);
/* Calls release(owner) once the op has completed and the request has been freed, on
 * whichever thread gets there last (possibly weft's engine thread; release must not call
 * weft). Lets a caller free a request early without freeing the op's buffers. */
WEFT_API weft_status weft_request_keep_alive(weft_request* request, void* owner,
                                             void (*release)(void* owner));
/* Frees the handle; an op still running completes in the background. NULL is fine. */
WEFT_API void weft_request_free(weft_request* request);

/* ---- outputs -------------------------------------------------------------------------- */

/* A new host (CPU) tensor with like's dtype and shape: contiguous, 64-byte aligned,
 * uninitialized, for use as an op's output. Outputs of 64 KiB and more come from memory
 * that earlier freed outputs of the same size gave back (up to WEFT_OUTPUT_CACHE_BYTES per
 * process), which spares the page faults of fresh memory: a loop of out-of-place ops into
 * such outputs runs about as fast as in place. Free it with (*out)->deleter(*out). A `like`
 * on a GPU is refused (WEFT_INVALID_ARGUMENT). */
WEFT_API weft_status weft_tensor_empty_like(DLManagedTensor** out, const DLTensor* like);

/* ---- ops ------------------------------------------------------------------------------ */

/* Neighbor allreduce (docs/comm.md): y = self_weight * x + sum_j src_weight[j] * d_j * x_j.
 * has_weights = 0: the topology's weights (or a uniform average on an unweighted one).
 * has_weights = 1: self_weight and the num_src (src_ranks[k], src_weights[k]) pairs;
 *   num_src may be 0 (no senders).
 * has_dst = 1 (needs has_weights): send to exactly dst_ranks for this call, scaled by
 *   dst_weights[k] (dst_weights NULL: 1 each).
 * Weights may be any finite numbers, negative or above 1 included (I - W style
 * combinations); NaN and infinity are refused. */
#define WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_VERSION 1
typedef struct weft_neighbor_allreduce_options {
  unsigned int version;
  int has_weights;
  double self_weight;
  size_t num_src;
  const int* src_ranks;
  const double* src_weights;
  int has_dst;
  size_t num_dst;
  const int* dst_ranks;
  const double* dst_weights;
  int enable_topo_check; /* kept for Bluefog compatibility: weft always checks */
} weft_neighbor_allreduce_options;
#define WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_INIT \
  { WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_VERSION, 0, 1.0, 0, NULL, NULL, 0, 0, NULL, NULL, 1 }
/* Writes the defaults (the _INIT macro's values) for a struct of `version`
 * (WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_VERSION); every option struct has such a function. */
WEFT_API weft_status weft_neighbor_allreduce_options_init(weft_neighbor_allreduce_options* options,
                                                          unsigned int version);

/* has_ranks = 1: receive from src_ranks (output in that order) and send to dst_ranks
 * instead of the topology's neighbors. */
#define WEFT_NEIGHBOR_ALLGATHER_OPTIONS_VERSION 1
typedef struct weft_neighbor_allgather_options {
  unsigned int version;
  int has_ranks;
  size_t num_src;
  const int* src_ranks;
  size_t num_dst;
  const int* dst_ranks;
} weft_neighbor_allgather_options;
#define WEFT_NEIGHBOR_ALLGATHER_OPTIONS_INIT \
  { WEFT_NEIGHBOR_ALLGATHER_OPTIONS_VERSION, 0, 0, NULL, 0, NULL }
WEFT_API weft_status weft_neighbor_allgather_options_init(weft_neighbor_allgather_options* options,
                                                          unsigned int version);

/* Machine-level weights keyed by machine index; the same rules as neighbor allreduce. */
#define WEFT_HIERARCHICAL_OPTIONS_VERSION 1
typedef struct weft_hierarchical_options {
  unsigned int version;
  int has_weights;
  double self_weight;
  size_t num_src;
  const int* src_machines;
  const double* src_machine_weights;
  int has_dst;
  size_t num_dst;
  const int* dst_machines;
  const double* dst_machine_weights;
} weft_hierarchical_options;
#define WEFT_HIERARCHICAL_OPTIONS_INIT \
  { WEFT_HIERARCHICAL_OPTIONS_VERSION, 0, 1.0, 0, NULL, NULL, 0, 0, NULL, NULL }
WEFT_API weft_status weft_hierarchical_options_init(weft_hierarchical_options* options,
                                                    unsigned int version);

/* Sum (average = 0) or mean (average = 1) over all ranks. */
WEFT_API weft_status weft_comm_allreduce(const DLTensor* in, DLTensor* out, int average,
                                         const char* name);
WEFT_API weft_status weft_comm_allreduce_nonblocking(weft_request** request,
                                                     const DLTensor* in, DLTensor* out,
                                                     int average, const char* name);

WEFT_API weft_status weft_comm_broadcast(const DLTensor* in, DLTensor* out, int root_rank,
                                         const char* name);
WEFT_API weft_status weft_comm_broadcast_nonblocking(weft_request** request,
                                                     const DLTensor* in, DLTensor* out,
                                                     int root_rank, const char* name);

/* Process sets: the same ops among `ranks` only (num_ranks entries, distinct, in any order,
 * the caller among them; num_ranks = 0: every rank, as weft_comm_allreduce). Only those
 * ranks call, all passing the same set; they are matched among themselves by name, or by
 * their call order within the set when name is NULL or "". Disjoint sets run independently
 * (e.g. the replicas of one pipeline stage). A rank listing every rank matches ranks
 * calling weft_comm_allreduce. A rank outside the set, a rank listed twice or out of range
 * is WEFT_ERR_INVALID_ARGUMENT; ranks disagreeing on the set stall (then
 * WEFT_ERR_DEADLINE_EXCEEDED after WEFT_STALL_TIMEOUT_SECONDS). */
WEFT_API weft_status weft_comm_allreduce_ranks(const DLTensor* in, DLTensor* out, int average,
                                               const int* ranks, size_t num_ranks,
                                               const char* name);
WEFT_API weft_status weft_comm_allreduce_ranks_nonblocking(weft_request** request,
                                                           const DLTensor* in, DLTensor* out,
                                                           int average, const int* ranks,
                                                           size_t num_ranks, const char* name);
/* root_rank is a rank of the world, and one of `ranks`. */
WEFT_API weft_status weft_comm_broadcast_ranks(const DLTensor* in, DLTensor* out,
                                               int root_rank, const int* ranks,
                                               size_t num_ranks, const char* name);
WEFT_API weft_status weft_comm_broadcast_ranks_nonblocking(weft_request** request,
                                                           const DLTensor* in, DLTensor* out,
                                                           int root_rank, const int* ranks,
                                                           size_t num_ranks, const char* name);

/* Concatenation along dim 0 of every rank's tensor, in rank order (dim 0 may differ).
 * The result is allocated by weft; free it with (*out)->deleter(*out). */
WEFT_API weft_status weft_comm_allgather(DLManagedTensor** out, const DLTensor* in,
                                         const char* name);
WEFT_API weft_status weft_comm_allgather_nonblocking(weft_request** request,
                                                     const DLTensor* in, const char* name);

/* Concatenation of the in-neighbors' tensors (ordered by rank, or as src_ranks). */
WEFT_API weft_status weft_comm_neighbor_allgather(
    DLManagedTensor** out, const DLTensor* in, const weft_neighbor_allgather_options* options,
    const char* name);
WEFT_API weft_status weft_comm_neighbor_allgather_nonblocking(
    weft_request** request, const DLTensor* in, const weft_neighbor_allgather_options* options,
    const char* name);

WEFT_API weft_status weft_comm_neighbor_allreduce(
    const DLTensor* in, DLTensor* out, const weft_neighbor_allreduce_options* options,
    const char* name);
WEFT_API weft_status weft_comm_neighbor_allreduce_nonblocking(
    weft_request** request, const DLTensor* in, DLTensor* out,
    const weft_neighbor_allreduce_options* options, const char* name);

/* Sum inside each machine, exchange between machines, average over local_size. */
WEFT_API weft_status weft_comm_hierarchical_neighbor_allreduce(
    const DLTensor* in, DLTensor* out, const weft_hierarchical_options* options,
    const char* name);
WEFT_API weft_status weft_comm_hierarchical_neighbor_allreduce_nonblocking(
    weft_request** request, const DLTensor* in, DLTensor* out,
    const weft_hierarchical_options* options, const char* name);

/* Both peers end with self_weight * own + pair_weight * the peer's. */
WEFT_API weft_status weft_comm_pair_gossip(const DLTensor* in, DLTensor* out, int peer,
                                           double self_weight, double pair_weight,
                                           const char* name);
WEFT_API weft_status weft_comm_pair_gossip_nonblocking(weft_request** request,
                                                       const DLTensor* in, DLTensor* out,
                                                       int peer, double self_weight,
                                                       double pair_weight, const char* name);

/* Point to point: only the two ranks call. A send to dst matches the receive on dst from
 * this rank with the same name; unnamed (NULL or ""), a pair's ops match in call order, so
 * both ranks must issue them in the same order. Negotiated like every op: a dtype or shape
 * mismatch is an error on both ranks, a missing peer a stall (then
 * WEFT_ERR_DEADLINE_EXCEEDED). dst/src equal to the caller or out of range is
 * WEFT_ERR_INVALID_ARGUMENT. A send completes once the data has left `in`. */
WEFT_API weft_status weft_comm_send(const DLTensor* in, int dst, const char* name);
WEFT_API weft_status weft_comm_send_nonblocking(weft_request** request, const DLTensor* in,
                                                int dst, const char* name);
/* Receives into `out`, which has the sender's dtype and shape. */
WEFT_API weft_status weft_comm_recv(DLTensor* out, int src, const char* name);
WEFT_API weft_status weft_comm_recv_nonblocking(weft_request** request, DLTensor* out,
                                                int src, const char* name);
/* Receives whatever dtype and shape the sender sends, into a tensor allocated by weft (as
 * for allgather); free it with (*out)->deleter(*out). The nonblocking form's result comes
 * from weft_request_take_output. */
WEFT_API weft_status weft_comm_recv_any(DLManagedTensor** out, int src, const char* name);
WEFT_API weft_status weft_comm_recv_any_nonblocking(weft_request** request, int src,
                                                    const char* name);

WEFT_API weft_status weft_comm_barrier(void);
WEFT_API weft_status weft_comm_barrier_nonblocking(weft_request** request);

/* Groups, as NCCL's ncclGroupStart/ncclGroupEnd: the ops this thread starts between
 * weft_comm_group_start() and weft_comm_group_end() do not wake weft's engine thread; the
 * outermost group end does. A burst of nonblocking ops then reaches the engine whole and is
 * negotiated and fused as one, instead of the first op starting alone. A hint, not a
 * barrier: an engine thread awake anyway, or a wait or poll, takes the ops as they come. Ops
 * in a group are matched and checked as any others. Groups nest and belong to the calling
 * thread: start and end a group on one thread. weft_comm_group_end() with no group open on
 * the thread is WEFT_ERR_FAILED_PRECONDITION. Neither needs weft_init(). */
WEFT_API weft_status weft_comm_group_start(void);
WEFT_API weft_status weft_comm_group_end(void);

/* For a binding or program that rejects an op's arguments before it can call the op (a
 * value it cannot convert to a DLTensor, say): takes that op's place in the call order, as
 * weft's own argument checks do, so that the op's other ranks fail with `message` instead
 * of waiting for this rank, and later unnamed ops stay paired with the right ones. `name`
 * is the op's name (NULL or "": unnamed; for WEFT_OP_WIN_CREATE, the window's); `ranks`
 * the process set of an allreduce or broadcast (NULL, 0: every rank); `peer` the
 * destination of a send or the source of a recv (ignored otherwise). Returns `code`, which
 * must not be WEFT_OK, with weft_last_error() = message. Where the op has no place to take
 * (weft not initialized, a bad peer or set, an unnamed op from another thread), only that
 * is done: every rank running the same code rejects it alike. */
typedef enum weft_op {
  WEFT_OP_ALLREDUCE = 0,
  WEFT_OP_BROADCAST = 1,
  WEFT_OP_ALLGATHER = 2,
  WEFT_OP_NEIGHBOR_ALLGATHER = 3,
  WEFT_OP_NEIGHBOR_ALLREDUCE = 4,
  WEFT_OP_HIERARCHICAL_NEIGHBOR_ALLREDUCE = 5,
  WEFT_OP_PAIR_GOSSIP = 6,
  WEFT_OP_SEND = 7,
  WEFT_OP_RECV = 8,
  WEFT_OP_WIN_CREATE = 9
} weft_op;
WEFT_API weft_status weft_comm_refuse(weft_op op, const char* name, const int* ranks,
                                      size_t num_ranks, int peer, weft_status code,
                                      const char* message);

/* ---- one-sided windows ---------------------------------------------------------------- */
/* One-sided windows. A window associates a tensor x with a name;
 * every rank holds one receive buffer per in-neighbor (topology at creation) and exposes x
 * for gets. Puts and gets are one-sided. weft_comm_set_topology fails while windows exist.
 * Nonblocking forms return requests (weft_request_poll/wait/free). */

/* self_weight multiplies the tensor passed to the put (normally the window's own) and the
 * window's p after the put. has_dst = 0: every
 * out-neighbor with weight 1; else dst_ranks with dst_weights (NULL: 1 each).
 * require_mutex: hold the destinations' window mutexes around the put. */
#define WEFT_WIN_PUT_OPTIONS_VERSION 1
typedef struct weft_win_put_options {
  unsigned int version;
  double self_weight;
  int has_dst;
  size_t num_dst;
  const int* dst_ranks;
  const double* dst_weights;
  int require_mutex;
} weft_win_put_options;
#define WEFT_WIN_PUT_OPTIONS_INIT { WEFT_WIN_PUT_OPTIONS_VERSION, 1.0, 0, 0, NULL, NULL, 0 }
WEFT_API weft_status weft_win_put_options_init(weft_win_put_options* options, unsigned int version);

/* has_src = 0: every in-neighbor with weight 1. */
#define WEFT_WIN_GET_OPTIONS_VERSION 1
typedef struct weft_win_get_options {
  unsigned int version;
  int has_src;
  size_t num_src;
  const int* src_ranks;
  const double* src_weights;
  int require_mutex;
} weft_win_get_options;
#define WEFT_WIN_GET_OPTIONS_INIT { WEFT_WIN_GET_OPTIONS_VERSION, 0, 0, NULL, NULL, 0 }
WEFT_API weft_status weft_win_get_options_init(weft_win_get_options* options, unsigned int version);

/* has_weights = 0: the topology's receive weights if it was set weighted, else the uniform
 * average over x and every buffer; else
 * x <- self_weight * x + sum_k neighbor_weights[k] * buf[neighbor_ranks[k]].
 * reset: zero the buffers used. require_mutex: hold this rank's own mutex. */
#define WEFT_WIN_UPDATE_OPTIONS_VERSION 1
typedef struct weft_win_update_options {
  unsigned int version;
  int has_weights;
  double self_weight;
  size_t num_neighbors;
  const int* neighbor_ranks;
  const double* neighbor_weights;
  int reset;
  int require_mutex;
} weft_win_update_options;
#define WEFT_WIN_UPDATE_OPTIONS_INIT \
  { WEFT_WIN_UPDATE_OPTIONS_VERSION, 0, 1.0, 0, NULL, NULL, 0, 0 }
WEFT_API weft_status weft_win_update_options_init(weft_win_update_options* options,
                                                  unsigned int version);

/* zero_init: buffers start as zeros instead of copies of x (the associated p: 1 for this
 * rank, 0 for every neighbor buffer, either way). transport: "mpi" (MPI RMA) or
 * "ucx" (UCX RDMA); NULL or "": WEFT_TRANSPORT. Every rank must choose the same. */
#define WEFT_WIN_CREATE_OPTIONS_VERSION 1
typedef struct weft_win_create_options {
  unsigned int version;
  int zero_init;
  const char* transport;
} weft_win_create_options;
#define WEFT_WIN_CREATE_OPTIONS_INIT { WEFT_WIN_CREATE_OPTIONS_VERSION, 0, NULL }
WEFT_API weft_status weft_win_create_options_init(weft_win_create_options* options,
                                                  unsigned int version);

/* Collective. x must stay alive (and in place) until the window is freed: gets read it,
 * updates write it. NULL options: buffers start as copies of x, transport WEFT_TRANSPORT. */
WEFT_API weft_status weft_win_create(DLTensor* x, const char* name,
                                     const weft_win_create_options* options);
/* Collective. NULL or "": every window. An unknown name is WEFT_ERR_NOT_FOUND. */
WEFT_API weft_status weft_win_free(const char* name);
/* Writes weight * x into each destination's buffer for this rank. x has the window's dtype
 * and shape (usually it is the window's own tensor). */
WEFT_API weft_status weft_win_put(DLTensor* x, const char* name,
                                  const weft_win_put_options* options);
WEFT_API weft_status weft_win_put_nonblocking(weft_request** request, DLTensor* x,
                                              const char* name,
                                              const weft_win_put_options* options);
/* The same, adding into the destination's buffer (atomically per element). */
WEFT_API weft_status weft_win_accumulate(DLTensor* x, const char* name,
                                         const weft_win_put_options* options);
WEFT_API weft_status weft_win_accumulate_nonblocking(weft_request** request, DLTensor* x,
                                                     const char* name,
                                                     const weft_win_put_options* options);
/* Reads weight * x_j of each source into this rank's buffer for j. */
WEFT_API weft_status weft_win_get(const char* name, const weft_win_get_options* options);
WEFT_API weft_status weft_win_get_nonblocking(weft_request** request, const char* name,
                                              const weft_win_get_options* options);
/* Local: combines the buffers into the window's tensor, in place. */
WEFT_API weft_status weft_win_update(const char* name, const weft_win_update_options* options);
/* Local: x <- x + sum of every buffer (a sum, not an average); then zeroes the buffers. */
WEFT_API weft_status weft_win_update_then_collect(const char* name, int require_mutex);
/* Puts (and gets) into each buffer since its last update: (in-neighbor, count) pairs. */
WEFT_API weft_status weft_win_version(int* ranks, int64_t* versions, size_t capacity,
                                      size_t* count, const char* name);
/* The scalar p following x's weights (push-sum); starts at 1. */
WEFT_API weft_status weft_win_associated_p(double* p, const char* name);
/* Whether weft_win_update and a put's self_weight also apply to p, for every window of the
 * process (default 1). With 0, p stays as it is (Bluefog's default). Usable any time. */
WEFT_API void weft_win_set_associated_p_ops(int on);
WEFT_API int weft_win_associated_p_ops(void);
/* The window mutexes of ranks (num_ranks = 0: this rank's own), taken in rank order;
 * waits while another rank holds one. */
WEFT_API weft_status weft_win_mutex_acquire(const char* name, const int* ranks,
                                            size_t num_ranks);
WEFT_API weft_status weft_win_mutex_release(const char* name, const int* ranks,
                                            size_t num_ranks);

/* ---- optimizers: the step counter ----------------------------------------------------- */

/* The state machine behind num_steps_per_communication (J) of the distributed optimizers
 * (optim/README.md has the rules): every counted computation (forward or backward,
 * whichever the optimizer counts) brings a countdown from J towards 0; the one that reaches
 * 0 starts the communication; a step then is an S (wait, combine, start over), a step
 * before is an s (local update only); a counted computation with the countdown already at 0
 * is a misuse to warn about. Every binding's optimizers use this one, so all behave alike.
 * Units: an optimizer counting backward computations per parameter (communication launched
 * as each gradient is ready) gives each parameter a unit; each counts down on its own, and
 * a pass that finds units at 0 warns once. Needs no weft_init(); one counter must not be
 * used by two threads at once. */
typedef struct weft_step_counter weft_step_counter;

typedef enum weft_count_kind {
  WEFT_COUNT_FORWARD = 0,
  WEFT_COUNT_BACKWARD = 1
} weft_count_kind;

typedef enum weft_computation_event {
  WEFT_COMPUTATION_IGNORED = 0,     /* not counted (no-grad, nothing requires grad) */
  WEFT_COMPUTATION_COUNTED = 1,     /* counted; the countdown is not at 0 */
  WEFT_COMPUTATION_COMMUNICATE = 2, /* counted and reached 0: start the communication now */
  WEFT_COMPUTATION_MISUSE = 3       /* counted with the countdown at 0: warn (the text is
                                       weft_step_counter_misuse_warning) */
} weft_computation_event;

/* steps_per_communication >= 1, units >= 1. */
WEFT_API weft_status weft_step_counter_create(weft_step_counter** counter,
                                              int64_t steps_per_communication,
                                              weft_count_kind counts, int units);
WEFT_API void weft_step_counter_destroy(weft_step_counter* counter);
/* A computation of `unit` finished; `counted` 0 for one under no-grad or of a model with no
 * parameter that requires grad (it changes nothing). */
WEFT_API weft_status weft_step_counter_computation(weft_computation_event* event,
                                                   weft_step_counter* counter, int unit,
                                                   int counted);
/* A step: *communicate is 1 for an S (wait for what was launched, launch the units not yet
 * at 0, combine; the countdowns restart from J), 0 for an s. WEFT_ERR_FAILED_PRECONDITION
 * before any counted computation (the optimizer is not seeing the model's computations). */
WEFT_API weft_status weft_step_counter_step(int* communicate, weft_step_counter* counter);
/* Takes effect at once when nothing was counted since the last S, else at the next S. */
WEFT_API weft_status weft_step_counter_set_steps_per_communication(
    weft_step_counter* counter, int64_t steps_per_communication);
WEFT_API weft_status weft_step_counter_steps_per_communication(
    int64_t* steps_per_communication, const weft_step_counter* counter);
/* J minus the unit's counted computations since the last S, floored at 0. */
WEFT_API weft_status weft_step_counter_countdown(int64_t* countdown,
                                                 const weft_step_counter* counter, int unit);
/* Counted computations (passes) since creation and since the last S. */
WEFT_API weft_status weft_step_counter_computations(int64_t* total,
                                                    int64_t* since_communication,
                                                    const weft_step_counter* counter);
/* The warning for the last WEFT_COMPUTATION_MISUSE ("" before any); NULL for NULL. Valid
 * until the next weft call on this thread, like every string weft returns. */
WEFT_API const char* weft_step_counter_misuse_warning(const weft_step_counter* counter);

/* ---- pipe: freezing, partitioning, AutoPipe/AutoDP plans -------------------------------- */

/* Pure computations (no weft_init() needed) behind elastic pipelining; pipe/README.md has
 * the rules. Layers are indexed from 0; "sizes" are per-layer parameter counts. */

/* The AutoFreeze schedule bound after freeze point t: ceil(L (1 - (1 - alpha)^t)), exact at
 * integers. alpha in (0, 1], layers >= 1, t >= 0. */
WEFT_API weft_status weft_pipe_freeze_bound(int* frozen, int layers, double alpha, int t);

#define WEFT_PIPE_FREEZE_OPTIONS_VERSION 1
typedef struct weft_pipe_freeze_options {
  unsigned int version;
  double alpha;       /* default 1/3 */
  int gradient_aware; /* min(bound, 1 + the trainable layer with the smallest norm) */
  int freeze_last;    /* allow freezing the last layer (default 0: at most L - 1) */
} weft_pipe_freeze_options;
#define WEFT_PIPE_FREEZE_OPTIONS_INIT \
  { WEFT_PIPE_FREEZE_OPTIONS_VERSION, 1.0 / 3.0, 0, 0 }
WEFT_API weft_status weft_pipe_freeze_options_init(weft_pipe_freeze_options* options,
                                                   unsigned int version);

/* The frozen count after freeze point t, given the count before it. grad_norms (one per
 * layer, summed over the interval) only for the gradient-aware policy (else NULL, 0). */
WEFT_API weft_status weft_pipe_next_frozen(int* frozen, int layers, int t, int previous,
                                           const double* grad_norms, size_t num_norms,
                                           const weft_pipe_freeze_options* options);

typedef enum weft_pipe_strategy {
  WEFT_PIPE_STRATEGY_OPTIMAL = 0, /* minimize the largest stage; no empty stage */
  WEFT_PIPE_STRATEGY_GREEDY = 1,  /* PipeTransformer's greedy walk, for comparison */
  WEFT_PIPE_STRATEGY_EVEN = 2     /* equal layer counts */
} weft_pipe_strategy;

/* Per-layer costs from parameter counts: the first `frozen` layers cost lambda times their
 * count (frozen layers run forward only; the paper uses 1/6). Array convention. */
WEFT_API weft_status weft_pipe_parameter_costs(double* costs, size_t capacity, size_t* count,
                                               const double* sizes, size_t num_layers,
                                               int frozen, double lambda);
/* Contiguous partition of the layers into `stages`: boundaries (stages + 1 entries, stage s
 * holds layers [b[s], b[s + 1])) into the caller's buffer (array convention), the largest
 * stage cost into *max_cost (may be NULL). */
WEFT_API weft_status weft_pipe_partition(int* boundaries, size_t capacity, size_t* count,
                                         double* max_cost, const double* costs,
                                         size_t num_layers, int stages,
                                         weft_pipe_strategy strategy);

/* An AutoPipe/AutoDP plan: pipeline length K, partition, replicas, each rank's role. */
typedef struct weft_pipe_plan weft_pipe_plan;

#define WEFT_PIPE_PLAN_OPTIONS_VERSION 1
typedef struct weft_pipe_plan_options {
  unsigned int version;
  int machines;            /* default 1 */
  int devices_per_machine; /* default 8 */
  int k0;                  /* the initial pipeline length, default 8 */
  double lambda;           /* default 1/6 */
  weft_pipe_strategy strategy;
  int micro_batches;       /* 0: 4 K */
} weft_pipe_plan_options;
#define WEFT_PIPE_PLAN_OPTIONS_INIT \
  { WEFT_PIPE_PLAN_OPTIONS_VERSION, 1, 8, 8, 1.0 / 6.0, WEFT_PIPE_STRATEGY_OPTIMAL, 0 }
WEFT_API weft_status weft_pipe_plan_options_init(weft_pipe_plan_options* options,
                                                 unsigned int version);

/* previous NULL: the initial plan (K = k0). Otherwise K halves from previous's while the
 * balanced partition on K/2 stages fits under M0, and the ranks of new replicas are the
 * newly active ones. */
WEFT_API weft_status weft_pipe_plan_create(weft_pipe_plan** plan, const double* sizes,
                                           size_t num_layers, int frozen,
                                           const weft_pipe_plan_options* options,
                                           const weft_pipe_plan* previous);
WEFT_API void weft_pipe_plan_destroy(weft_pipe_plan* plan);

/* A plan's summary. The caller sets version (WEFT_PIPE_PLAN_INFO_INIT); weft fills the
 * fields that version has. */
#define WEFT_PIPE_PLAN_INFO_VERSION 1
typedef struct weft_pipe_plan_info {
  unsigned int version;
  int frozen;
  int k;
  int replicas;
  int micro_batches;
  int world;
  double m0;       /* the largest stage of the initial partition */
  double max_cost; /* the largest stage of this plan's partition */
} weft_pipe_plan_info;
#define WEFT_PIPE_PLAN_INFO_INIT { WEFT_PIPE_PLAN_INFO_VERSION, 0, 0, 0, 0, 0, 0, 0 }
WEFT_API weft_status weft_pipe_plan_get_info(weft_pipe_plan_info* info,
                                             const weft_pipe_plan* plan);
/* Array convention: k + 1 boundaries; k stage costs; the newly active ranks (sorted). */
WEFT_API weft_status weft_pipe_plan_boundaries(int* boundaries, size_t capacity, size_t* count,
                                               const weft_pipe_plan* plan);
WEFT_API weft_status weft_pipe_plan_stage_costs(double* costs, size_t capacity, size_t* count,
                                                const weft_pipe_plan* plan);
WEFT_API weft_status weft_pipe_plan_newly_active(int* ranks, size_t capacity, size_t* count,
                                                 const weft_pipe_plan* plan);
/* The role of `rank`: replica and stage, both -1 for an idle rank. */
WEFT_API weft_status weft_pipe_plan_role(int* replica, int* stage, const weft_pipe_plan* plan,
                                         int rank);

typedef enum weft_pipe_schedule_kind {
  WEFT_PIPE_SCHEDULE_GPIPE = 0, /* fill-drain */
  WEFT_PIPE_SCHEDULE_1F1B = 1
} weft_pipe_schedule_kind;
/* The fraction of idle stage-slots of the schedule for `stages` and `micro_batches` (unit
 * time per forward and backward), and its length in clock cycles (may be NULL). */
WEFT_API weft_status weft_pipe_schedule_bubble(double* bubble, int* cycles,
                                               weft_pipe_schedule_kind kind, int stages,
                                               int micro_batches);

/* ---- configuration (WEFT_* settings) ------------------------------------------------ */

/* Overrides a setting in this process (wins over the environment); validated at once.
 * Most settings are read at weft_init(). */
WEFT_API weft_status weft_config_set(const char* name, const char* value);
/* Drops an override made with weft_config_set. */
WEFT_API weft_status weft_config_unset(const char* name);
/* The value in force, as text. */
WEFT_API weft_status weft_config_get(const char** value, const char* name);
/* A table of every setting: value in force, default, description. */
WEFT_API const char* weft_config_describe(void);

/* ---- timeline (Chrome trace) --------------------------------------------------------- */

/* Starts writing this rank's trace to `path` (WEFT_TIMELINE's naming: one file per rank
 * when size > 1). Needs weft_init(); fails if a timeline is already being written. Ops
 * already started show only the phases that begin after it. */
WEFT_API weft_status weft_timeline_start(const char* path);
/* Finishes and closes the trace; no-op when none is being written. */
WEFT_API weft_status weft_timeline_stop(void);
/* A user span on the row of `tensor_name`, from start to end (e.g. "forward"). */
WEFT_API weft_status weft_timeline_start_activity(const char* tensor_name,
                                                  const char* activity);
WEFT_API weft_status weft_timeline_end_activity(const char* tensor_name);
/* 1 while a trace is being written (WEFT_TIMELINE or weft_timeline_start), else 0. */
WEFT_API int weft_timeline_active(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WEFT_WEFT_H_ */
