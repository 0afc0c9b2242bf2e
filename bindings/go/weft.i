/* SWIG interface for the Go binding: the low-level layer (package cweft) over weft.h.
 *
 * Generated at build time, never checked in:
 *   swig -go -cgo -intgosize 64 -module cweft -I<dir of weft/weft.h> \
 *        -outdir internal/cweft -o internal/cweft/weft_wrap.c weft.i
 * (generate.sh runs exactly this). The idiomatic package weft.dev/weft is written by hand
 * on top of what this file produces; nothing outside it should import cweft.
 *
 * What the typemaps are for, and the cgo rule each one respects
 * (https://pkg.go.dev/cmd/cgo#hdr-Passing_pointers):
 *  - Go may pass a Go pointer to C as a call argument if the memory it points to holds no
 *    Go pointers, and C must not keep it after the call returns.
 *  - Go must not store a Go pointer in C memory (so a Go-built DLTensor or option struct
 *    whose pointer fields point at Go memory can never be handed to C).
 * Hence:
 *  - Out-parameters (int*, double*, size_t*) take a pointer to a Go variable of exactly
 *    the C width (*int32, *float64, *uint64; SWIG's default *int would let C write 4 of
 *    the 8 bytes of a Go int).
 *  - Enum out-parameters (weft_computation_event*) are *int32 too (an enum is an int in C,
 *    and SWIG's default would be a pointer to a Go int).
 *  - int64_t by value is a Go int64, and int64_t* out-parameters are *int64.
 *  - Handle out-parameters (weft_topology**, weft_schedule**, weft_request**,
 *    weft_step_counter**, weft_pipe_plan**, DLManagedTensor**) take a pointer to a Go
 *    uintptr-based handle (Swigcptr...): C writes a C pointer into Go memory, which is
 *    allowed.
 *  - Option and info structs without pointer fields (weft_pipe_freeze_options,
 *    weft_pipe_plan_options, weft_pipe_plan_info) are Go structs of the same layout
 *    (PipeFreezeOptions, ...; checked by both sides), passed by pointer for the call: Go
 *    memory holding no Go pointers, as the first rule allows. A nil pointer is NULL (the
 *    defaults).
 *  - Input arrays (const double*, size_t n) take a Go slice, lent for the call.
 *  - (buffer, capacity) pairs of the (buffer, capacity, *count) convention take a Go slice:
 *    buffer = its backing array, capacity = its length; *count is a *uint64.
 *  - const char** (weft_config_get) comes back as *string, copied before the next call can
 *    invalidate it.
 *  - DLTensor: the ABI's ops take `const DLTensor*`, whose data and shape are pointers; a
 *    DLTensor in Go memory pointing at Go data breaks the first rule and one in C memory
 *    pointing at Go data breaks the second. So the DLTensor-taking ops are wrapped by the
 *    weftgo_* entry points below, which take the tensor flattened into arguments (data
 *    pointer, dtype, shape slice) and build the DLTensor on the C stack for the duration of
 *    the call: a blocking op lends Go memory to weft without a copy. A nonblocking op (a
 *    non-NULL request) keeps its buffers after the call returns, so its data must be C
 *    memory (weftgo_alloc); shapes and options are copied by weft when the op is submitted
 *    and may stay in Go memory.
 *  - DLManagedTensor* results (allgather, recv_any) are opaque handles to C memory:
 *    weftgo_managed_* read them and call their deleter.
 */
%module cweft

%{
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <weft/trainer.h> /* and weft.h */
%}

/* Linking: users only add -L<dir of libweft.so> (and the include paths); see README.md.
 * The trainer (weft/trainer.h) is in libweft_trainer.so, which loads LibTorch; this one
 * package wraps both, so Go programs link both. */
%insert(cgo_comment_typedefs) %{
#cgo LDFLAGS: -lweft_trainer -lweft
%}

/* DLPack types are opaque here (weft.h's #include of dlpack.h is not followed by SWIG). */
typedef struct DLManagedTensor DLManagedTensor;

/* ---- replaced by the weftgo_* entry points below ---------------------------------------- */
%ignore weft_comm_allreduce;
%ignore weft_comm_allreduce_nonblocking;
%ignore weft_comm_broadcast;
%ignore weft_comm_broadcast_nonblocking;
%ignore weft_comm_allgather;
%ignore weft_comm_allgather_nonblocking;
%ignore weft_comm_neighbor_allgather;
%ignore weft_comm_neighbor_allgather_nonblocking;
%ignore weft_comm_neighbor_allreduce;
%ignore weft_comm_neighbor_allreduce_nonblocking;
%ignore weft_comm_hierarchical_neighbor_allreduce;
%ignore weft_comm_hierarchical_neighbor_allreduce_nonblocking;
%ignore weft_comm_pair_gossip;
%ignore weft_comm_pair_gossip_nonblocking;
%ignore weft_comm_allreduce_ranks;
%ignore weft_comm_allreduce_ranks_nonblocking;
%ignore weft_comm_broadcast_ranks;
%ignore weft_comm_broadcast_ranks_nonblocking;
%ignore weft_comm_send;
%ignore weft_comm_send_nonblocking;
%ignore weft_comm_recv;
%ignore weft_comm_recv_nonblocking;
/* weft_comm_recv_any and its nonblocking form take no tensor: wrapped as they are. */
/* The option structs hold pointers: the weftgo_* entry points take their fields as
 * arguments and build them on the C stack. */
%ignore weft_neighbor_allreduce_options;
%ignore weft_neighbor_allgather_options;
%ignore weft_hierarchical_options;
/* Takes a C function pointer; weftgo_request_free_after_completion wraps it. */
%ignore weft_request_keep_alive;
/* One-sided windows: the tensor-taking calls and the option structs (pointer fields) are
 * replaced by weftgo_win_*; the name-only calls are wrapped as they are. */
%ignore weft_win_create;
%ignore weft_win_put;
%ignore weft_win_put_nonblocking;
%ignore weft_win_accumulate;
%ignore weft_win_accumulate_nonblocking;
%ignore weft_win_get;
%ignore weft_win_get_nonblocking;
%ignore weft_win_update;
%ignore weft_win_put_options;
%ignore weft_win_get_options;
%ignore weft_win_update_options;

/* ---- scalar out-parameters --------------------------------------------------------------- */
%define WEFTGO_SCALAR_OUT(CTYPE, GOTYPE)
%typemap(gotype) CTYPE* WEFTGO_OUT "*GOTYPE"
%typemap(in) CTYPE* WEFTGO_OUT %{ $1 = ($1_ltype)$input; %}
%enddef
WEFTGO_SCALAR_OUT(int, int32)
WEFTGO_SCALAR_OUT(double, float64)
WEFTGO_SCALAR_OUT(size_t, uint64)
WEFTGO_SCALAR_OUT(int64_t, int64)

%apply int* WEFTGO_OUT { int* result, int* done, int* communicate };
%apply double* WEFTGO_OUT { double* weight, double* self_weight, double* p };
/* pipe: frozen counts, schedule cycles, a rank's role; a partition's largest stage, the
 * bubble fraction. */
%apply int* WEFTGO_OUT { int* frozen, int* cycles, int* replica, int* stage };
%apply double* WEFTGO_OUT { double* max_cost, double* bubble, double* accuracy };
%apply size_t* WEFTGO_OUT { size_t* count, size_t* needed };
%apply int64_t* WEFTGO_OUT {
  int64_t* steps_per_communication, int64_t* countdown, int64_t* total,
  int64_t* since_communication
};
/* An enum is written by C as an int: a Go int32 (checked below). */
%apply int* WEFTGO_OUT { weft_computation_event* event };
%{
_Static_assert(sizeof(weft_computation_event) == sizeof(int32_t),
               "weft_computation_event* is passed as a Go *int32");
%}

/* ---- int64_t by value -------------------------------------------------------------------- */
/* SWIG does not know int64_t without stdint.i (whose typedef differs by platform): give it
 * long long's typemaps, a Go int64. */
%apply long long { int64_t };

/* ---- handle out-parameters --------------------------------------------------------------- */
%typemap(gotype) weft_topology** "*SwigcptrStruct_SS_weft_topology"
%typemap(gotype) weft_schedule** "*SwigcptrStruct_SS_weft_schedule"
%typemap(gotype) weft_request** "*SwigcptrStruct_SS_weft_request"
%typemap(gotype) weft_step_counter** "*SwigcptrStruct_SS_weft_step_counter"
%typemap(gotype) weft_pipe_plan** "*SwigcptrStruct_SS_weft_pipe_plan"
%typemap(gotype) weft_pipe_trainer** "*SwigcptrStruct_SS_weft_pipe_trainer"
%typemap(gotype) DLManagedTensor** "*SwigcptrStruct_SS_DLManagedTensor"
%typemap(in) weft_topology**, weft_schedule**, weft_request**, weft_step_counter**,
             weft_pipe_plan**, weft_pipe_trainer**, DLManagedTensor**
%{ $1 = ($1_ltype)$input; %}

/* ---- (buffer, capacity) from a Go slice -------------------------------------------------- */
%define WEFTGO_BUFFER(CTYPE, GOTYPE)
%typemap(gotype) (CTYPE* WEFTGO_BUF, size_t capacity) "[]GOTYPE"
%typemap(in) (CTYPE* WEFTGO_BUF, size_t capacity) %{
  $1 = ($1_ltype)$input.array;
  $2 = (size_t)$input.len;
%}
%enddef
WEFTGO_BUFFER(int, int32)
WEFTGO_BUFFER(double, float64)
%apply (int* WEFTGO_BUF, size_t capacity) { (int* ranks, size_t capacity) };
%apply (double* WEFTGO_BUF, size_t capacity) { (double* weights, size_t capacity) };
%apply (int* WEFTGO_BUF, size_t capacity) { (int* boundaries, size_t capacity) };
%apply (double* WEFTGO_BUF, size_t capacity) { (double* costs, size_t capacity) };

/* An input array whose length the caller guarantees (weights: size * size). */
%typemap(gotype) const double* weights "[]float64"
%typemap(in) const double* weights %{ $1 = ($1_ltype)$input.array; %}

/* pipe: per-layer inputs (sizes, costs, gradient norms) as a []float64 lent for the call. */
%typemap(gotype) (const double* WEFTGO_IN, size_t num) "[]float64"
%typemap(in) (const double* WEFTGO_IN, size_t num) %{
  $1 = ($1_ltype)$input.array;
  $2 = (size_t)$input.len;
%}
%apply (const double* WEFTGO_IN, size_t num) {
  (const double* sizes, size_t num_layers), (const double* costs, size_t num_layers),
  (const double* grad_norms, size_t num_norms)
};

/* pipe: the option structs and the plan's info as Go structs of the same layout (no pointer
 * fields), passed by pointer; checked here and by internal_test.go. */
%{
_Static_assert(sizeof(weft_pipe_strategy) == sizeof(int32_t),
               "weft_pipe_strategy is an int32 field of cweft.PipePlanOptions");
_Static_assert(sizeof(weft_pipe_freeze_options) == 24 &&
               offsetof(weft_pipe_freeze_options, alpha) == 8 &&
               offsetof(weft_pipe_freeze_options, gradient_aware) == 16 &&
               offsetof(weft_pipe_freeze_options, freeze_last) == 20,
               "weft_pipe_freeze_options must match cweft.PipeFreezeOptions");
_Static_assert(sizeof(weft_pipe_plan_options) == 32 &&
               offsetof(weft_pipe_plan_options, machines) == 4 &&
               offsetof(weft_pipe_plan_options, devices_per_machine) == 8 &&
               offsetof(weft_pipe_plan_options, k0) == 12 &&
               offsetof(weft_pipe_plan_options, lambda) == 16 &&
               offsetof(weft_pipe_plan_options, strategy) == 24 &&
               offsetof(weft_pipe_plan_options, micro_batches) == 28,
               "weft_pipe_plan_options must match cweft.PipePlanOptions");
_Static_assert(sizeof(weft_pipe_plan_info) == 40 && offsetof(weft_pipe_plan_info, k) == 4 &&
               offsetof(weft_pipe_plan_info, replicas) == 8 &&
               offsetof(weft_pipe_plan_info, micro_batches) == 12 &&
               offsetof(weft_pipe_plan_info, world) == 16 &&
               offsetof(weft_pipe_plan_info, m0) == 24 &&
               offsetof(weft_pipe_plan_info, max_cost) == 32,
               "weft_pipe_plan_info must match cweft.PipePlanInfo");
%}
%insert(go_wrapper) %{
// PipeFreezeOptions is laid out like the C struct weft_pipe_freeze_options.
type PipeFreezeOptions struct {
	Version       uint32
	Alpha         float64
	GradientAware int32
	FreezeLast    int32
}

// PipePlanOptions is laid out like the C struct weft_pipe_plan_options.
type PipePlanOptions struct {
	Version           uint32
	Machines          int32
	DevicesPerMachine int32
	K0                int32
	Lambda            float64
	Strategy          int32
	MicroBatches      int32
}

// PipePlanInfo is laid out like the C struct weft_pipe_plan_info.
type PipePlanInfo struct {
	Frozen       int32
	K            int32
	Replicas     int32
	MicroBatches int32
	World        int32
	M0           float64
	MaxCost      float64
}
%}
%typemap(gotype) const weft_pipe_freeze_options* options "*PipeFreezeOptions"
%typemap(gotype) const weft_pipe_plan_options* options "*PipePlanOptions"
%typemap(gotype) weft_pipe_plan_info* info "*PipePlanInfo"
%typemap(in) const weft_pipe_freeze_options* options, const weft_pipe_plan_options* options,
             weft_pipe_plan_info* info
%{ $1 = ($1_ltype)$input; %}
%ignore weft_pipe_freeze_options;
%ignore weft_pipe_plan_options;
%ignore weft_pipe_plan_info;

/* ---- pipe: the elastic pipeline trainer --------------------------------------------------- */
/* Its options hold strings (cache_dir, name) and its data DLTensors: weftgo_pipe_trainer_*
 * below take the numbers as a pointer-free struct of Go memory (weftgo_pipe_trainer_numbers,
 * the same layout on both sides), the strings and the tensors' fields as arguments, and
 * build the ABI's structs on the C stack. The metrics are a Go struct of the C layout. */
%ignore weft_pipe_trainer_create;
%ignore weft_pipe_trainer_train_epoch;
%ignore weft_pipe_trainer_evaluate;
%ignore weft_pipe_trainer_options;
%ignore weft_pipe_epoch_metrics;
%{
typedef struct weftgo_pipe_trainer_numbers {
  int64_t batch_size;
  uint64_t seed;
  double alpha;
  double lr;
  double momentum;
  double weight_decay;
  int32_t k0;
  int32_t freeze;
  int32_t gradient_aware;
  int32_t freeze_every_epochs;
  int32_t autopipe;
  int32_t autodp;
  int32_t cache;
  int32_t schedule;
  int32_t micro_batches;
  int32_t optimizer;
  int32_t loss;
  int32_t decentralized;
} weftgo_pipe_trainer_numbers;
_Static_assert(sizeof(weftgo_pipe_trainer_numbers) == 96 &&
               offsetof(weftgo_pipe_trainer_numbers, alpha) == 16 &&
               offsetof(weftgo_pipe_trainer_numbers, k0) == 48 &&
               offsetof(weftgo_pipe_trainer_numbers, loss) == 88,
               "weftgo_pipe_trainer_numbers must match cweft.PipeTrainerNumbers");
_Static_assert(sizeof(weft_pipe_epoch_metrics) == 112 &&
               offsetof(weft_pipe_epoch_metrics, epoch) == 4 &&
               offsetof(weft_pipe_epoch_metrics, bubble_fraction) == 24 &&
               offsetof(weft_pipe_epoch_metrics, samples) == 40 &&
               offsetof(weft_pipe_epoch_metrics, transitioned) == 80 &&
               offsetof(weft_pipe_epoch_metrics, transition_seconds) == 96 &&
               offsetof(weft_pipe_epoch_metrics, transition_bytes) == 104,
               "weft_pipe_epoch_metrics must match cweft.PipeEpochMetrics");
%}
%insert(go_wrapper) %{
// PipeTrainerNumbers is laid out like the C struct weftgo_pipe_trainer_numbers: the
// numeric fields of weft_pipe_trainer_options.
type PipeTrainerNumbers struct {
	BatchSize         int64
	Seed              uint64
	Alpha             float64
	LR                float64
	Momentum          float64
	WeightDecay       float64
	K0                int32
	Freeze            int32
	GradientAware     int32
	FreezeEveryEpochs int32
	AutoPipe          int32
	AutoDP            int32
	Cache             int32
	Schedule          int32
	MicroBatches      int32
	Optimizer         int32
	Loss              int32
	Decentralized     int32
}

// PipeEpochMetrics is laid out like the C struct weft_pipe_epoch_metrics.
type PipeEpochMetrics struct {
	Version           uint32
	Epoch             int32
	Frozen            int32
	K                 int32
	Replicas          int32
	MicroBatches      int32
	BubbleFraction    float64
	TrainSeconds      float64
	Samples           int64
	SamplesPerSecond  float64
	Loss              float64
	SyncsPerSecond    float64
	CacheHitRate      float64
	Transitioned      int32
	NextFrozen        int32
	NextK             int32
	NextReplicas      int32
	TransitionSeconds float64
	TransitionBytes   int64
}
%}
%typemap(gotype) const weftgo_pipe_trainer_numbers* numbers "*PipeTrainerNumbers"
%typemap(gotype) weft_pipe_epoch_metrics* metrics "*PipeEpochMetrics"
%typemap(in) const weftgo_pipe_trainer_numbers* numbers, weft_pipe_epoch_metrics* metrics
%{ $1 = ($1_ltype)$input; %}
/* The last line into a []byte (capacity: its length). */
%typemap(gotype) (char* buf, size_t cap) "[]byte"
%typemap(in) (char* buf, size_t cap) %{
  $1 = ($1_ltype)$input.array;
  $2 = (size_t)$input.len;
%}

/* A (rank, weight) pair; the same layout in C and Go (checked by both). */
%{
typedef struct weftgo_rank_weight {
  int32_t rank;
  double weight;
} weftgo_rank_weight;
_Static_assert(sizeof(weftgo_rank_weight) == 16 && offsetof(weftgo_rank_weight, weight) == 8,
               "weftgo_rank_weight must match cweft.RankWeight");
%}
%insert(go_wrapper) %{
// RankWeight is a (rank, weight) pair, laid out like the C struct weftgo_rank_weight.
type RankWeight struct {
	Rank   int32
	Weight float64
}
%}

/* recv/send weights fill two arrays; Go gets them as one []RankWeight (so the two can never
 * have different lengths). The C arrays are temporaries copied into the slice afterwards. */
%typemap(gotype) (int* ranks, double* weights, size_t capacity) "[]RankWeight"
%typemap(in) (int* ranks, double* weights, size_t capacity) {
  $3 = (size_t)$input.len;
  $1 = (int*)calloc($3 + 1, sizeof(int));
  $2 = (double*)calloc($3 + 1, sizeof(double));
  if ($1 == NULL || $2 == NULL) {
    free($1);
    free($2);
    _swig_gopanic("weft: out of memory");
  }
}
%typemap(argout) (int* ranks, double* weights, size_t capacity) {
  weftgo_rank_weight* dst = (weftgo_rank_weight*)$input.array;
  for (size_t i = 0; i < $3; ++i) {
    dst[i].rank = $1[i];
    dst[i].weight = $2[i];
  }
}
%typemap(freearg) (int* ranks, double* weights, size_t capacity) {
  free($1);
  free($2);
}

/* A window's (in-neighbor, version) pair; the same layout in C and Go (checked by both). */
%{
typedef struct weftgo_rank_version {
  int64_t rank;
  int64_t version;
} weftgo_rank_version;
_Static_assert(sizeof(weftgo_rank_version) == 16 && offsetof(weftgo_rank_version, version) == 8,
               "weftgo_rank_version must match cweft.RankVersion");
%}
%insert(go_wrapper) %{
// RankVersion is an (in-neighbor, version) pair, laid out like the C struct
// weftgo_rank_version.
type RankVersion struct {
	Rank    int64
	Version int64
}
%}

/* weft_win_version fills two arrays; Go gets one []RankVersion (C temporaries, copied). */
%typemap(gotype) (int* ranks, int64_t* versions, size_t capacity) "[]RankVersion"
%typemap(in) (int* ranks, int64_t* versions, size_t capacity) {
  $3 = (size_t)$input.len;
  $1 = (int*)calloc($3 + 1, sizeof(int));
  $2 = (int64_t*)calloc($3 + 1, sizeof(int64_t));
  if ($1 == NULL || $2 == NULL) {
    free($1);
    free($2);
    _swig_gopanic("weft: out of memory");
  }
}
%typemap(argout) (int* ranks, int64_t* versions, size_t capacity) {
  weftgo_rank_version* dst = (weftgo_rank_version*)$input.array;
  for (size_t i = 0; i < $3; ++i) {
    dst[i].rank = $1[i];
    dst[i].version = $2[i];
  }
}
%typemap(freearg) (int* ranks, int64_t* versions, size_t capacity) {
  free($1);
  free($2);
}

/* ---- const char** ------------------------------------------------------------------------ */
/* C writes a C pointer into a Go unsafe.Pointer (allowed: it is not a Go pointer); the
 * string is copied into Go memory before the next weft call on this thread can free it. */
%typemap(gotype) const char** value "*string"
%typemap(imtype) const char** value "*unsafe.Pointer"
%typemap(goin) const char** value %{ $result = new(unsafe.Pointer) %}
%typemap(in) const char** value %{ $1 = ($1_ltype)$input; %}
%typemap(goargout) const char** value %{
	if *$input != nil {
		*$1 = C.GoString((*C.char)(*$input))
	}
%}

/* ---- slices passed for the duration of one call ----------------------------------------- */
%typemap(gotype) (const int64_t* shape, size_t ndim) "[]int64"
%typemap(in) (const int64_t* shape, size_t ndim) %{
  $1 = ($1_ltype)$input.array;
  $2 = (size_t)$input.len;
%}
%apply (const int64_t* shape, size_t ndim) { (const int64_t* target_shape, size_t target_ndim) };
%typemap(gotype) (const int* ranks, size_t num) "[]int32"
%typemap(in) (const int* ranks, size_t num) %{
  $1 = ($1_ltype)$input.array;
  $2 = (size_t)$input.len;
%}
%apply (const int* ranks, size_t num) {
  (const int* src_ranks, size_t num_src), (const int* dst_ranks, size_t num_dst),
  (const int* ranks, size_t num_ranks)
};
%typemap(gotype) (const weftgo_rank_weight* pairs, size_t num) "[]RankWeight"
%typemap(in) (const weftgo_rank_weight* pairs, size_t num) %{
  $1 = ($1_ltype)$input.array;
  $2 = (size_t)$input.len;
%}
%apply (const weftgo_rank_weight* pairs, size_t num) {
  (const weftgo_rank_weight* src, size_t num_src), (const weftgo_rank_weight* dst, size_t num_dst)
};

/* Tensor data: a Go or C pointer passed as a real pointer argument (cgo checks it), or
 * C memory coming back from weftgo_alloc / weftgo_managed_data. */
%typemap(gotype) void* "unsafe.Pointer"
%typemap(in) void* %{ $1 = $input; %}
%typemap(out) void* %{ $result = $1; %}

/* ---- the C ABI itself -------------------------------------------------------------------- */
%include "weft/weft.h"
%include "weft/trainer.h"

/* ---- weftgo_*: tensors and options flattened into arguments ------------------------------ */
%{
#include <stdatomic.h>

/* Frees a buffer from weftgo_alloc (the release of weft_request_keep_alive). */
static void weftgo_release(void* owner) { free(owner); }

/* Shared C memory (weftgo_shared_alloc): a reference count in the 64 bytes before the data.
 * A window's tensor is one: the Go Window holds a reference until weft_win_free has
 * succeeded, each blocking call on it one for the call, and each nonblocking op one until
 * it has completed and its request is freed, so that the memory outlives every user. */
static atomic_long* weftgo_shared_refs(void* data) {
  return (atomic_long*)((char*)data - 64);
}
static void weftgo_shared_release(void* data) {
  if (atomic_fetch_sub(weftgo_shared_refs(data), 1) == 1) free((char*)data - 64);
}
_Static_assert(sizeof(atomic_long) <= 64, "the reference count must fit the header");

/* After a nonblocking op on shared `data` has started (status OK): one more reference,
 * dropped by weft once the op has completed and its request is freed. */
static weft_status weftgo_hold(weft_request** request, weft_status status, void* data) {
  if (request == NULL || status != WEFT_OK || data == NULL) return status;
  atomic_fetch_add(weftgo_shared_refs(data), 1);
  if (weft_request_keep_alive(*request, data, weftgo_shared_release) != WEFT_OK) {
    /* Not expected for a fresh request; stay safe: finish the op, then drop the reference. */
    weft_request_wait(*request);
    weftgo_shared_release(data);
  }
  return WEFT_OK;
}

/* A CPU DLTensor over `data` (dtype (code, bits), lanes 1), shape borrowed, contiguous. */
static DLTensor weftgo_tensor(void* data, int code, int bits, const int64_t* shape,
                              size_t ndim) {
  DLTensor t;
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = (int)ndim;
  t.dtype.code = (uint8_t)code;
  t.dtype.bits = (uint8_t)bits;
  t.dtype.lanes = 1;
  t.shape = (int64_t*)shape;
  t.strides = NULL;
  t.byte_offset = 0;
  return t;
}

/* Splits (rank, weight) pairs into the two arrays the ABI takes; the caller frees *weights
 * (one block holds both arrays). Out of memory is a Go panic, as for Go's own allocations
 * (a status would come without a weft_last_error() message). */
static void weftgo_split(const weftgo_rank_weight* pairs, size_t num, int** ranks,
                         double** weights) {
  *ranks = NULL;
  *weights = NULL;
  if (num == 0) return;
  /* doubles first, so that both arrays are aligned */
  void* block = malloc(num * (sizeof(double) + sizeof(int)));
  if (block == NULL) _swig_gopanic("weft: out of memory");
  *weights = (double*)block;
  *ranks = (int*)(*weights + num);
  for (size_t i = 0; i < num; ++i) {
    (*ranks)[i] = pairs[i].rank;
    (*weights)[i] = pairs[i].weight;
  }
}

%}

%inline %{
/* Every weftgo_* op: request NULL runs it blocking (in and out may be Go memory, lent for the
 * call); request non-NULL starts it nonblocking and then in and out must be C memory that
 * stays valid until the request has completed. in == out is in place. */

/* num_ranks = 0: every rank (the plain entry points); else the process set `ranks`. */
weft_status weftgo_allreduce(weft_request** request, void* in, void* out, int code, int bits,
                             const int64_t* shape, size_t ndim, int average, const int* ranks,
                             size_t num_ranks, const char* name) {
  DLTensor i = weftgo_tensor(in, code, bits, shape, ndim);
  DLTensor o = weftgo_tensor(out, code, bits, shape, ndim);
  if (num_ranks > 0) {
    return request == NULL ? weft_comm_allreduce_ranks(&i, &o, average, ranks, num_ranks, name)
                           : weft_comm_allreduce_ranks_nonblocking(request, &i, &o, average,
                                                                   ranks, num_ranks, name);
  }
  return request == NULL ? weft_comm_allreduce(&i, &o, average, name)
                         : weft_comm_allreduce_nonblocking(request, &i, &o, average, name);
}

weft_status weftgo_broadcast(weft_request** request, void* in, void* out, int code, int bits,
                             const int64_t* shape, size_t ndim, int root_rank, const int* ranks,
                             size_t num_ranks, const char* name) {
  DLTensor i = weftgo_tensor(in, code, bits, shape, ndim);
  DLTensor o = weftgo_tensor(out, code, bits, shape, ndim);
  if (num_ranks > 0) {
    return request == NULL
               ? weft_comm_broadcast_ranks(&i, &o, root_rank, ranks, num_ranks, name)
               : weft_comm_broadcast_ranks_nonblocking(request, &i, &o, root_rank, ranks,
                                                       num_ranks, name);
  }
  return request == NULL ? weft_comm_broadcast(&i, &o, root_rank, name)
                         : weft_comm_broadcast_nonblocking(request, &i, &o, root_rank, name);
}

weft_status weftgo_send(weft_request** request, void* in, int code, int bits,
                        const int64_t* shape, size_t ndim, int dst, const char* name) {
  DLTensor i = weftgo_tensor(in, code, bits, shape, ndim);
  return request == NULL ? weft_comm_send(&i, dst, name)
                         : weft_comm_send_nonblocking(request, &i, dst, name);
}

weft_status weftgo_recv(weft_request** request, void* out, int code, int bits,
                        const int64_t* shape, size_t ndim, int src, const char* name) {
  DLTensor o = weftgo_tensor(out, code, bits, shape, ndim);
  return request == NULL ? weft_comm_recv(&o, src, name)
                         : weft_comm_recv_nonblocking(request, &o, src, name);
}

/* Blocking (request NULL): the result is stored in *out. Nonblocking: take it from the
 * request with weft_request_take_output. */
weft_status weftgo_allgather(weft_request** request, DLManagedTensor** out, void* in, int code,
                             int bits, const int64_t* shape, size_t ndim, const char* name) {
  DLTensor i = weftgo_tensor(in, code, bits, shape, ndim);
  return request == NULL ? weft_comm_allgather(out, &i, name)
                         : weft_comm_allgather_nonblocking(request, &i, name);
}

/* has_ranks = 0: the topology's neighbors (src/dst must be empty). */
weft_status weftgo_neighbor_allgather(weft_request** request, DLManagedTensor** out, void* in,
                                      int code, int bits, const int64_t* shape, size_t ndim,
                                      int has_ranks, const int* src_ranks, size_t num_src,
                                      const int* dst_ranks, size_t num_dst, const char* name) {
  DLTensor i = weftgo_tensor(in, code, bits, shape, ndim);
  weft_neighbor_allgather_options o = WEFT_NEIGHBOR_ALLGATHER_OPTIONS_INIT;
  o.has_ranks = has_ranks;
  o.num_src = num_src;
  o.src_ranks = src_ranks;
  o.num_dst = num_dst;
  o.dst_ranks = dst_ranks;
  return request == NULL ? weft_comm_neighbor_allgather(out, &i, &o, name)
                         : weft_comm_neighbor_allgather_nonblocking(request, &i, &o, name);
}

weft_status weftgo_neighbor_allreduce(weft_request** request, void* in, void* out, int code,
                                      int bits, const int64_t* shape, size_t ndim,
                                      int has_weights, double self_weight,
                                      const weftgo_rank_weight* src, size_t num_src,
                                      int has_dst, const weftgo_rank_weight* dst,
                                      size_t num_dst, const char* name) {
  DLTensor i = weftgo_tensor(in, code, bits, shape, ndim);
  DLTensor t = weftgo_tensor(out, code, bits, shape, ndim);
  int *src_ranks, *dst_ranks;
  double *src_weights, *dst_weights;
  weftgo_split(src, num_src, &src_ranks, &src_weights);
  weftgo_split(dst, num_dst, &dst_ranks, &dst_weights);
  weft_neighbor_allreduce_options o = WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_INIT;
  o.has_weights = has_weights;
  o.self_weight = self_weight;
  o.num_src = num_src;
  o.src_ranks = src_ranks;
  o.src_weights = src_weights;
  o.has_dst = has_dst;
  o.num_dst = num_dst;
  o.dst_ranks = dst_ranks;
  o.dst_weights = dst_weights;
  weft_status status =
      request == NULL ? weft_comm_neighbor_allreduce(&i, &t, &o, name)
                      : weft_comm_neighbor_allreduce_nonblocking(request, &i, &t, &o, name);
  free(src_weights); /* the blocks start with the weights */
  free(dst_weights);
  return status;
}

/* Weights keyed by machine index. */
weft_status weftgo_hierarchical_neighbor_allreduce(
    weft_request** request, void* in, void* out, int code, int bits, const int64_t* shape,
    size_t ndim, int has_weights, double self_weight, const weftgo_rank_weight* src,
    size_t num_src, int has_dst, const weftgo_rank_weight* dst, size_t num_dst,
    const char* name) {
  DLTensor i = weftgo_tensor(in, code, bits, shape, ndim);
  DLTensor t = weftgo_tensor(out, code, bits, shape, ndim);
  int *src_machines, *dst_machines;
  double *src_weights, *dst_weights;
  weftgo_split(src, num_src, &src_machines, &src_weights);
  weftgo_split(dst, num_dst, &dst_machines, &dst_weights);
  weft_hierarchical_options o = WEFT_HIERARCHICAL_OPTIONS_INIT;
  o.has_weights = has_weights;
  o.self_weight = self_weight;
  o.num_src = num_src;
  o.src_machines = src_machines;
  o.src_machine_weights = src_weights;
  o.has_dst = has_dst;
  o.num_dst = num_dst;
  o.dst_machines = dst_machines;
  o.dst_machine_weights = dst_weights;
  weft_status status =
      request == NULL
          ? weft_comm_hierarchical_neighbor_allreduce(&i, &t, &o, name)
          : weft_comm_hierarchical_neighbor_allreduce_nonblocking(request, &i, &t, &o, name);
  free(src_weights);
  free(dst_weights);
  return status;
}

weft_status weftgo_pair_gossip(weft_request** request, void* in, void* out, int code, int bits,
                               const int64_t* shape, size_t ndim, int peer, double self_weight,
                               double pair_weight, const char* name) {
  DLTensor i = weftgo_tensor(in, code, bits, shape, ndim);
  DLTensor o = weftgo_tensor(out, code, bits, shape, ndim);
  return request == NULL
             ? weft_comm_pair_gossip(&i, &o, peer, self_weight, pair_weight, name)
             : weft_comm_pair_gossip_nonblocking(request, &i, &o, peer, self_weight,
                                                 pair_weight, name);
}

/* ---- one-sided windows ------------------------------------------------------------------- */
/* `data` is shared C memory (weftgo_shared_alloc): weft keeps the pointer until the window is
 * freed. */

weft_status weftgo_win_create(void* data, int code, int bits, const int64_t* shape, size_t ndim,
                              const char* name, int zero_init, const char* transport) {
  DLTensor x = weftgo_tensor(data, code, bits, shape, ndim);
  weft_win_create_options o = WEFT_WIN_CREATE_OPTIONS_INIT;
  o.zero_init = zero_init;
  o.transport = transport;  /* "" means WEFT_TRANSPORT */
  return weft_win_create(&x, name, &o);
}

/* Put (accumulate = 0) or accumulate of shared `data`; request non-NULL: nonblocking, and
 * the op holds a reference to `data` until it has completed. */
weft_status weftgo_win_put(weft_request** request, int accumulate, void* data, int code,
                           int bits, const int64_t* shape, size_t ndim, const char* name,
                           double self_weight, int has_dst, const weftgo_rank_weight* dst,
                           size_t num_dst, int require_mutex) {
  DLTensor x = weftgo_tensor(data, code, bits, shape, ndim);
  int* dst_ranks;
  double* dst_weights;
  weftgo_split(dst, num_dst, &dst_ranks, &dst_weights);
  weft_win_put_options o = WEFT_WIN_PUT_OPTIONS_INIT;
  o.self_weight = self_weight;
  o.has_dst = has_dst;
  o.num_dst = num_dst;
  o.dst_ranks = dst_ranks;
  o.dst_weights = dst_weights;
  o.require_mutex = require_mutex;
  weft_status status;
  if (request == NULL) {
    status = accumulate ? weft_win_accumulate(&x, name, &o) : weft_win_put(&x, name, &o);
  } else {
    status = accumulate ? weft_win_accumulate_nonblocking(request, &x, name, &o)
                        : weft_win_put_nonblocking(request, &x, name, &o);
    status = weftgo_hold(request, status, data);
  }
  free(dst_weights);
  return status;
}

/* has_src = 0: every in-neighbor with weight 1. */
weft_status weftgo_win_get(weft_request** request, const char* name, int has_src,
                           const weftgo_rank_weight* src, size_t num_src, int require_mutex) {
  int* src_ranks;
  double* src_weights;
  weftgo_split(src, num_src, &src_ranks, &src_weights);
  weft_win_get_options o = WEFT_WIN_GET_OPTIONS_INIT;
  o.has_src = has_src;
  o.num_src = num_src;
  o.src_ranks = src_ranks;
  o.src_weights = src_weights;
  o.require_mutex = require_mutex;
  weft_status status = request == NULL ? weft_win_get(name, &o)
                                       : weft_win_get_nonblocking(request, name, &o);
  free(src_weights);
  return status;
}

/* has_weights = 0: the uniform average over x and every buffer. */
weft_status weftgo_win_update(const char* name, int has_weights, double self_weight,
                              const weftgo_rank_weight* src, size_t num_src, int reset,
                              int require_mutex) {
  int* ranks;
  double* weights;
  weftgo_split(src, num_src, &ranks, &weights);
  weft_win_update_options o = WEFT_WIN_UPDATE_OPTIONS_INIT;
  o.has_weights = has_weights;
  o.self_weight = self_weight;
  o.num_neighbors = num_src;
  o.neighbor_ranks = ranks;
  o.neighbor_weights = weights;
  o.reset = reset;
  o.require_mutex = require_mutex;
  weft_status status = weft_win_update(name, &o);
  free(weights);
  return status;
}

/* ---- pipe: the elastic pipeline trainer --------------------------------------------------- */

/* cache_dir "" is none, name "" is "pipe" (the C defaults). */
weft_status weftgo_pipe_trainer_create(weft_pipe_trainer** out, const char* path,
                                       const weftgo_pipe_trainer_numbers* numbers,
                                       const char* cache_dir, const char* name) {
  weft_pipe_trainer_options o = WEFT_PIPE_TRAINER_OPTIONS_INIT;
  o.k0 = numbers->k0;
  o.freeze = numbers->freeze;
  o.alpha = numbers->alpha;
  o.gradient_aware = numbers->gradient_aware;
  o.freeze_every_epochs = numbers->freeze_every_epochs;
  o.autopipe = numbers->autopipe;
  o.autodp = numbers->autodp;
  o.cache = numbers->cache;
  o.cache_dir = cache_dir;
  o.schedule = (weft_pipe_schedule_kind)numbers->schedule;
  o.micro_batches = numbers->micro_batches;
  o.batch_size = numbers->batch_size;
  o.seed = numbers->seed;
  o.optimizer = (weft_pipe_optimizer_kind)numbers->optimizer;
  o.lr = numbers->lr;
  o.momentum = numbers->momentum;
  o.weight_decay = numbers->weight_decay;
  o.loss = (weft_pipe_loss_kind)numbers->loss;
  o.name = name;
  o.decentralized = numbers->decentralized;
  return weft_pipe_trainer_create(out, path, &o);
}

/* The training set, lent for the call: inputs and targets as (data, dtype, shape). metrics:
 * Go memory of the C layout (its version set by the caller). */
weft_status weftgo_pipe_trainer_train_epoch(weft_pipe_trainer* trainer, void* in, int code,
                                            int bits, const int64_t* shape, size_t ndim,
                                            void* targets, int target_code, int target_bits,
                                            const int64_t* target_shape, size_t target_ndim,
                                            weft_pipe_epoch_metrics* metrics) {
  DLTensor x = weftgo_tensor(in, code, bits, shape, ndim);
  DLTensor y = weftgo_tensor(targets, target_code, target_bits, target_shape, target_ndim);
  return weft_pipe_trainer_train_epoch(trainer, &x, &y, metrics);
}

weft_status weftgo_pipe_trainer_evaluate(weft_pipe_trainer* trainer, void* in, int code,
                                         int bits, const int64_t* shape, size_t ndim,
                                         void* targets, int target_code, int target_bits,
                                         const int64_t* target_shape, size_t target_ndim,
                                         double* accuracy) {
  DLTensor x = weftgo_tensor(in, code, bits, shape, ndim);
  DLTensor y = weftgo_tensor(targets, target_code, target_bits, target_shape, target_ndim);
  return weft_pipe_trainer_evaluate(trainer, &x, &y, accuracy);
}

/* 64-byte aligned shared memory holding one reference; NULL when out of memory. */
void* weftgo_shared_alloc(size_t nbytes) {
  size_t rounded = (nbytes + 63) / 64 * 64;
  char* block = (char*)aligned_alloc(64, 64 + rounded);
  if (block == NULL) return NULL;
  atomic_init((atomic_long*)block, 1);
  return block + 64;
}

void weftgo_shared_ref(void* data) { atomic_fetch_add(weftgo_shared_refs(data), 1); }

/* Drops a reference; the last one frees the memory. */
void weftgo_shared_unref(void* data) { weftgo_shared_release(data); }

/* ---- process exit ------------------------------------------------------------------------ */

/* Ends the process through the C library's exit(), so that atexit handlers run: weft's
 * finalizes MPI (when weft started it). Go never calls exit(): returning from main and
 * os.Exit end the process with the exit_group system call, and mpirun then reports the rank
 * as having exited without MPI_Finalize. */
/* ---- C memory for nonblocking ops -------------------------------------------------------- */

/* 64-byte aligned, at least one line (so that an empty buffer is a valid pointer); NULL when
 * out of memory. */
void* weftgo_alloc(size_t nbytes) {
  size_t rounded = (nbytes + 63) / 64 * 64;
  return aligned_alloc(64, rounded == 0 ? 64 : rounded);
}

void weftgo_free(void* p) { free(p); }

/* Frees `buffer` (from weftgo_alloc) once the op has completed and the request is freed: lets
 * Go free a request early without freeing memory the engine still uses. */
weft_status weftgo_request_free_after_completion(weft_request* request, void* buffer) {
  return weft_request_keep_alive(request, buffer, weftgo_release);
}

/* ---- DLManagedTensor results ------------------------------------------------------------- */

void* weftgo_managed_data(const DLManagedTensor* t) {
  return (char*)t->dl_tensor.data + t->dl_tensor.byte_offset;
}

/* long long: the Go int64 (SWIG has no int64_t without stdint.i, whose typedef differs). */
long long weftgo_managed_numel(const DLManagedTensor* t) {
  long long n = 1;
  for (int d = 0; d < t->dl_tensor.ndim; ++d) n *= t->dl_tensor.shape[d];
  return n;
}

/* The shape (recv_any: the sender's). */
int weftgo_managed_ndim(const DLManagedTensor* t) { return t->dl_tensor.ndim; }
long long weftgo_managed_dim(const DLManagedTensor* t, int d) { return t->dl_tensor.shape[d]; }

/* code * 256 + bits, to check against what the caller expects. */
int weftgo_managed_dtype(const DLManagedTensor* t) {
  return t->dl_tensor.dtype.code * 256 + t->dl_tensor.dtype.bits;
}

void weftgo_managed_delete(DLManagedTensor* t) {
  if (t != NULL && t->deleter != NULL) t->deleter(t);
}
%}
