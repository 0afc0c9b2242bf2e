/* The C ABI from a C99 program under mpirun: every group of calls with exact values, and
 * the error paths. Any failed check prints the rank, line and weft_last_error() and exits
 * non-zero, which makes mpirun abort the job (no hang). */
/* nanosleep: POSIX on top of C99. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <weft/weft.h>

#include "tests/capi/check.h"

static void TestBeforeInit(void) {
  float x[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  DLTensor t = Tensor(x, kDLFloat, 32, 1, shape);
  weft_topology* topo = NULL;
  CHECK(weft_is_initialized() == 0);
  CHECK(weft_rank() == -1 && weft_size() == -1 && weft_machine_size() == -1);
  CHECK(weft_is_homogeneous() == -1 && weft_timeline_active() == 0);
  weft_comm_claim_call_order(); /* does nothing before init */
  OK(weft_comm_group_start());  /* groups need no init */
  OK(weft_comm_group_end());
  FAILS(weft_comm_group_end(), WEFT_ERR_FAILED_PRECONDITION, "no group is open");
  {
    int unified = -1;
    FAILS(weft_unified_mpi_window_model(&unified), WEFT_ERR_FAILED_PRECONDITION, "init");
  }
  FAILS(weft_comm_allreduce(&t, &t, 1, NULL), WEFT_ERR_FAILED_PRECONDITION, "call init() first");
  FAILS(weft_comm_barrier(), WEFT_ERR_FAILED_PRECONDITION, "not initialized");
  FAILS(weft_comm_load_topology(&topo), WEFT_ERR_FAILED_PRECONDITION, "not initialized");
  CHECK(topo == NULL);
  FAILS(weft_timeline_start("/tmp/never.json"), WEFT_ERR_FAILED_PRECONDITION, "init");
}

/* weft_<x>_options_init writes what the _INIT macro says (the library's defaults). */
static void TestOptionsInit(void) {
  weft_neighbor_allreduce_options nar;
  weft_neighbor_allgather_options nag;
  weft_hierarchical_options hier;
  weft_win_put_options put;
  weft_win_get_options get;
  weft_win_update_options upd;
  weft_win_create_options create;
  weft_pipe_freeze_options freeze;
  weft_pipe_plan_options plan;
  memset(&nar, 0x5A, sizeof nar);
  OK(weft_neighbor_allreduce_options_init(&nar, WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_VERSION));
  CHECK(nar.version == 1 && nar.has_weights == 0 && nar.self_weight == 1.0 && nar.num_src == 0 &&
        nar.src_ranks == NULL && nar.src_weights == NULL && nar.has_dst == 0 && nar.num_dst == 0 &&
        nar.dst_ranks == NULL && nar.dst_weights == NULL && nar.enable_topo_check == 1);
  memset(&nag, 0x5A, sizeof nag);
  OK(weft_neighbor_allgather_options_init(&nag, WEFT_NEIGHBOR_ALLGATHER_OPTIONS_VERSION));
  CHECK(nag.version == 1 && nag.has_ranks == 0 && nag.num_src == 0 && nag.src_ranks == NULL &&
        nag.num_dst == 0 && nag.dst_ranks == NULL);
  memset(&hier, 0x5A, sizeof hier);
  OK(weft_hierarchical_options_init(&hier, WEFT_HIERARCHICAL_OPTIONS_VERSION));
  CHECK(hier.has_weights == 0 && hier.self_weight == 1.0 && hier.num_src == 0 &&
        hier.src_machines == NULL && hier.has_dst == 0 && hier.dst_machines == NULL);
  memset(&put, 0x5A, sizeof put);
  OK(weft_win_put_options_init(&put, WEFT_WIN_PUT_OPTIONS_VERSION));
  CHECK(put.self_weight == 1.0 && put.has_dst == 0 && put.dst_ranks == NULL &&
        put.require_mutex == 0);
  memset(&get, 0x5A, sizeof get);
  OK(weft_win_get_options_init(&get, WEFT_WIN_GET_OPTIONS_VERSION));
  CHECK(get.has_src == 0 && get.src_ranks == NULL && get.require_mutex == 0);
  memset(&upd, 0x5A, sizeof upd);
  OK(weft_win_update_options_init(&upd, WEFT_WIN_UPDATE_OPTIONS_VERSION));
  CHECK(upd.has_weights == 0 && upd.self_weight == 1.0 && upd.neighbor_ranks == NULL &&
        upd.reset == 0 && upd.require_mutex == 0);
  memset(&create, 0x5A, sizeof create);
  OK(weft_win_create_options_init(&create, WEFT_WIN_CREATE_OPTIONS_VERSION));
  CHECK(create.zero_init == 0 && create.transport == NULL);
  memset(&freeze, 0x5A, sizeof freeze);
  OK(weft_pipe_freeze_options_init(&freeze, WEFT_PIPE_FREEZE_OPTIONS_VERSION));
  CHECK(freeze.alpha == 1.0 / 3.0 && freeze.gradient_aware == 0 && freeze.freeze_last == 0);
  memset(&plan, 0x5A, sizeof plan);
  OK(weft_pipe_plan_options_init(&plan, WEFT_PIPE_PLAN_OPTIONS_VERSION));
  CHECK(plan.machines == 1 && plan.devices_per_machine == 8 && plan.k0 == 8 &&
        plan.lambda == 1.0 / 6.0 && plan.strategy == WEFT_PIPE_STRATEGY_OPTIMAL &&
        plan.micro_batches == 0);
  /* A version this library does not know, or no struct: refused, nothing written. */
  FAILS(weft_win_put_options_init(&put, 0), WEFT_ERR_INVALID_ARGUMENT, "version is 0");
  FAILS(weft_win_put_options_init(&put, WEFT_WIN_PUT_OPTIONS_VERSION + 1),
        WEFT_ERR_INVALID_ARGUMENT, "WEFT_WIN_PUT_OPTIONS_VERSION");
  FAILS(weft_pipe_plan_options_init(NULL, 1), WEFT_ERR_INVALID_ARGUMENT, "options is NULL");
}

/* weft_tensor_empty_like: needs no init; large outputs are reused once freed. */
static void TestOutputs(void) {
  float x[4] = {1, 2, 3, 4};
  int64_t shape[2] = {2, 2};
  int64_t big_shape[1] = {(1 << 20) / 4 + 3}; /* 1 MiB and 12 bytes */
  DLTensor t = Tensor(x, kDLFloat, 32, 2, shape);
  DLTensor big = Tensor(x, kDLInt, 64, 1, big_shape); /* describes; never read */
  DLManagedTensor* out = NULL;
  void* first;
  OK(weft_tensor_empty_like(&out, &t));
  CHECK(out != NULL && out->deleter != NULL && out->dl_tensor.ndim == 2);
  CHECK(out->dl_tensor.shape[0] == 2 && out->dl_tensor.shape[1] == 2);
  CHECK(out->dl_tensor.dtype.code == kDLFloat && out->dl_tensor.dtype.bits == 32);
  CHECK(out->dl_tensor.strides == NULL && out->dl_tensor.device.device_type == kDLCPU);
  CHECK(((uintptr_t)out->dl_tensor.data) % 64 == 0);
  ((float*)out->dl_tensor.data)[3] = 5; /* writable */
  out->deleter(out);

  { /* small outputs of every rank, the header and data in one block: aligned, whole */
    int64_t shapes[4][3] = {{0}, {0}, {3, 5, 7}, {65535}};
    int32_t ndims[4] = {0, 1, 3, 1};
    int i, d;
    for (i = 0; i < 4; ++i) {
      DLTensor s = Tensor(x, kDLUInt, 8, ndims[i], shapes[i]);
      size_t bytes = 1;
      OK(weft_tensor_empty_like(&out, &s));
      CHECK(out->dl_tensor.ndim == ndims[i] && out->dl_tensor.data != NULL);
      CHECK(((uintptr_t)out->dl_tensor.data) % 64 == 0);
      for (d = 0; d < ndims[i]; ++d) {
        CHECK(out->dl_tensor.shape[d] == shapes[i][d]);
        bytes *= (size_t)shapes[i][d];
      }
      memset(out->dl_tensor.data, 7, bytes);
      CHECK(out->dl_tensor.shape == NULL ||
            (char*)(out->dl_tensor.shape + ndims[i]) <= (char*)out->dl_tensor.data);
      out->deleter(out);
    }
  }

  OK(weft_tensor_empty_like(&out, &big));
  CHECK(out->dl_tensor.dtype.code == kDLInt && out->dl_tensor.dtype.bits == 64);
  memset(out->dl_tensor.data, 1, (size_t)big_shape[0] * 8);
  first = out->dl_tensor.data;
  out->deleter(out);
  OK(weft_tensor_empty_like(&out, &big));
  CHECK(out->dl_tensor.data == first); /* the freed block, not fresh pages */
  out->deleter(out);

  FAILS(weft_tensor_empty_like(NULL, &t), WEFT_ERR_INVALID_ARGUMENT, "out");
  FAILS(weft_tensor_empty_like(&out, NULL), WEFT_ERR_INVALID_ARGUMENT, "like");
  CHECK(out == NULL);
  t.device.device_type = kDLCUDA;
  FAILS(weft_tensor_empty_like(&out, &t), WEFT_ERR_INVALID_ARGUMENT, "host (CPU) outputs only");
  CHECK(out == NULL);
}

static void TestVersionAndStatus(void) {
  char expected[32];
  snprintf(expected, sizeof(expected), "%d.%d.%d", WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR,
           WEFT_VERSION_PATCH);
  CHECK(strcmp(weft_version(), expected) == 0);
  CHECK(weft_version_number() == WEFT_VERSION_NUMBER);
  CHECK(strcmp(weft_status_string(WEFT_OK), "ok") == 0);
  CHECK(strcmp(weft_status_string(WEFT_ERR_INVALID_ARGUMENT), "invalid argument") == 0);
  CHECK(strcmp(weft_status_string((weft_status)99), "unknown status code") == 0);
}

static void TestTopology(void) {
  weft_topology *exp2 = NULL, *exp = NULL, *ring = NULL, *star = NULL, *mesh = NULL;
  weft_topology *dense = NULL, *copy = NULL, *bad = NULL;
  int ranks[8];
  double weights[64], self_weight = 0;
  size_t count = 0, i;
  int flag = -1;
  double matrix[9] = {0.5, 0.5, 0, 0, 0.5, 0.5, 0.5, 0, 0.5};
  double w = 0;

  OK(weft_topology_exponential_two(&exp2, 8));
  CHECK(weft_topology_size(exp2) == 8);
  CHECK(weft_topology_size(NULL) == -1);
  OK(weft_topology_out_neighbors(ranks, 8, &count, exp2, 0));
  CHECK(count == 3 && ranks[0] == 1 && ranks[1] == 2 && ranks[2] == 4);
  OK(weft_topology_in_neighbors(ranks, 8, &count, exp2, 0));
  CHECK(count == 3 && ranks[0] == 4 && ranks[1] == 6 && ranks[2] == 7);
  /* A buffer too small: the count comes back and nothing is written. */
  ranks[0] = -7;
  FAILS(weft_topology_in_neighbors(ranks, 2, &count, exp2, 0), WEFT_ERR_OUT_OF_RANGE,
        "3 are needed");
  CHECK(count == 3 && ranks[0] == -7);
  OK(weft_topology_in_neighbors(NULL, 0, &count, exp2, 5));
  CHECK(count == 3);
  FAILS(weft_topology_in_neighbors(ranks, 8, &count, exp2, 8), WEFT_ERR_INVALID_ARGUMENT,
        "out of range");
  OK(weft_topology_recv_weights(&self_weight, ranks, weights, 8, &count, exp2, 0));
  CHECK(count == 3 && NEAR(self_weight, 0.25) && ranks[2] == 7 && NEAR(weights[2], 0.25));
  OK(weft_topology_send_weights(&self_weight, ranks, weights, 8, &count, exp2, 0));
  CHECK(count == 3 && ranks[2] == 4 && NEAR(weights[0], 0.25));
  OK(weft_topology_weight_matrix(weights, 64, &count, exp2));
  CHECK(count == 64);
  for (i = 0; i < 8; ++i) {
    double row = 0;
    size_t j;
    for (j = 0; j < 8; ++j) row += weights[i * 8 + j];
    CHECK(NEAR(row, 1.0));
  }
  OK(weft_topology_weight(&w, exp2, 3, 7));
  CHECK(NEAR(w, 0.25));
  OK(weft_topology_weight(&w, exp2, 3, 6));
  CHECK(w == 0.0);

  OK(weft_topology_exponential(&exp, 8, 2));
  OK(weft_topology_is_equivalent(&flag, exp2, exp));
  CHECK(flag == 1);
  OK(weft_topology_ring(&ring, 5, 0));
  OK(weft_topology_is_regular(&flag, ring));
  CHECK(flag == 1);
  OK(weft_topology_is_equivalent(&flag, exp2, ring));
  CHECK(flag == 0);
  OK(weft_topology_star(&star, 4, 0));
  OK(weft_topology_is_regular(&flag, star));
  CHECK(flag == 0);
  OK(weft_topology_weight(&w, star, 0, 0));
  CHECK(NEAR(w, 0.25));
  OK(weft_topology_mesh_grid_2d(&mesh, 6, 0, 0));
  OK(weft_topology_out_neighbors(ranks, 8, &count, mesh, 0));
  CHECK(count == 2); /* a 2 x 3 grid: the corner has two neighbors */
  FAILS(weft_topology_mesh_grid_2d(&bad, 6, 4, 4), WEFT_ERR_INVALID_ARGUMENT,
        "weft_topology_mesh_grid_2d");
  CHECK(bad == NULL);
  FAILS(weft_topology_ring(&bad, 0, 0), WEFT_ERR_INVALID_ARGUMENT, "weft_topology_ring");
  FAILS(weft_topology_ring(NULL, 4, 0), WEFT_ERR_INVALID_ARGUMENT, "out is NULL");

  OK(weft_topology_from_weight_matrix(&dense, 3, matrix));
  OK(weft_topology_out_neighbors(ranks, 8, &count, dense, 2));
  CHECK(count == 1 && ranks[0] == 0);
  OK(weft_topology_clone(&copy, dense));
  OK(weft_topology_add_edge(copy, 2, 1, 0.25));
  OK(weft_topology_set_self_weight(copy, 2, 0.25));
  OK(weft_topology_weight(&w, copy, 2, 1));
  CHECK(NEAR(w, 0.25));
  OK(weft_topology_weight(&w, dense, 2, 1)); /* the clone is independent */
  CHECK(w == 0.0);
  FAILS(weft_topology_add_edge(copy, 1, 1, 0.5), WEFT_ERR_INVALID_ARGUMENT, "");
  FAILS(weft_topology_add_edge(copy, 0, 3, 0.5), WEFT_ERR_INVALID_ARGUMENT, "");

  weft_topology_destroy(NULL);
  weft_topology_destroy(exp2);
  weft_topology_destroy(exp);
  weft_topology_destroy(ring);
  weft_topology_destroy(star);
  weft_topology_destroy(mesh);
  weft_topology_destroy(dense);
  weft_topology_destroy(copy);
}

static void TestSchedules(void) {
  weft_topology* exp2 = NULL;
  weft_schedule* s = NULL;
  int send[8], recv[8];
  size_t ns = 0, nr = 0;
  const int expected_targets[4] = {1, 2, 1, 2};
  int step;

  OK(weft_topology_exponential_two(&exp2, 4));
  OK(weft_schedule_one_peer(&s, exp2, 0));
  weft_topology_destroy(exp2); /* the schedule holds its own copy */
  FAILS(weft_schedule_send_ranks(send, 8, &ns, s), WEFT_ERR_FAILED_PRECONDITION,
        "weft_schedule_next");
  for (step = 0; step < 4; ++step) {
    OK(weft_schedule_next(s));
    OK(weft_schedule_send_ranks(send, 8, &ns, s));
    CHECK(ns == 1 && send[0] == expected_targets[step]);
    /* Rank 0 of an exponential-2 graph on 4 ranks hears from rank 3 at even steps (3 -> 0
     * is its first target) and from rank 2 at odd steps (2 -> 0 is its second). */
    OK(weft_schedule_recv_ranks(recv, 8, &nr, s));
    CHECK(nr == 1 && recv[0] == (step % 2 == 0 ? 3 : 2));
  }
  weft_schedule_destroy(s);

  OK(weft_schedule_machine_exponential_two(&s, 4, 0));
  OK(weft_schedule_next(s));
  OK(weft_schedule_send_ranks(send, 8, &ns, s));
  OK(weft_schedule_recv_ranks(recv, 8, &nr, s));
  CHECK(ns == 1 && send[0] == 1 && nr == 1 && recv[0] == 3);
  OK(weft_schedule_next(s));
  OK(weft_schedule_send_ranks(send, 8, &ns, s));
  CHECK(ns == 1 && send[0] == 2);
  weft_schedule_destroy(s);

  OK(weft_schedule_inner_outer_ring(&s, 8, 4, 0));
  OK(weft_schedule_next(s));
  OK(weft_schedule_send_ranks(send, 8, &ns, s));
  CHECK(ns >= 1);
  weft_schedule_destroy(s);
  OK(weft_schedule_inner_outer_exponential_two(&s, 8, 4, 5));
  OK(weft_schedule_next(s));
  weft_schedule_destroy(s);
  weft_schedule_destroy(NULL);
  s = NULL;
  FAILS(weft_schedule_one_peer(&s, NULL, 0), WEFT_ERR_INVALID_ARGUMENT, "topo is NULL");
  FAILS(weft_schedule_inner_outer_ring(&s, 8, 3, 0), WEFT_ERR_INVALID_ARGUMENT, "");
  CHECK(s == NULL);
}

/* Runs `pattern` (F: a counted computation, S / s: a step expected to communicate / not,
 * ' ': nothing) through `c`, one unit. Stores the 1-based numbers of the computations that
 * came back WEFT_COMPUTATION_MISUSE in misuses[] and returns how many there were. */
static size_t RunPattern(weft_step_counter* c, const char* pattern, int* misuses,
                         size_t capacity) {
  size_t n = 0, i;
  int f = 0;
  for (i = 0; pattern[i] != '\0'; ++i) {
    const char ch = pattern[i];
    if (ch == ' ') continue;
    if (ch == 'F') {
      weft_computation_event e = WEFT_COMPUTATION_IGNORED;
      ++f;
      OK(weft_step_counter_computation(&e, c, 0, 1));
      CHECK(e == WEFT_COMPUTATION_COUNTED || e == WEFT_COMPUTATION_COMMUNICATE ||
            e == WEFT_COMPUTATION_MISUSE);
      if (e == WEFT_COMPUTATION_MISUSE) {
        CHECK(n < capacity);
        misuses[n++] = f;
      }
    } else {
      int communicate = -1;
      OK(weft_step_counter_step(&communicate, c));
      if (communicate != (ch == 'S' ? 1 : 0)) {
        fprintf(stderr, "rank %d: %s:%d: pattern \"%s\", position %lu: expected an %c, the "
                "step returned communicate = %d\n", g_rank, __FILE__, __LINE__, pattern,
                (unsigned long)i, ch, communicate);
        exit(1);
      }
    }
  }
  return n;
}

/* The state machine of num_steps_per_communication (docs/optim.md): plain
 * data, before weft_init(). */
static void TestStepCounter(void) {
  static const char* const admissible[] = {"FFFS", "FsFsFS", "FFsFS", "FsFFS", "FFFS FFFS",
                                           "FsFsFS FFsFS", "FsFsFSFs FsFSFsFs"};
  static const char* const inadmissible[] = {"FFFFS", "FFsFFS"};
  weft_step_counter *c = NULL, *bad = NULL;
  weft_computation_event e = WEFT_COMPUTATION_MISUSE;
  int misuses[8], communicate = -1;
  int64_t j = 0, countdown = -1, total = -1, since = -1;
  size_t k;
  int u;

  /* J = 3, forward: no pattern of the design's admissible ones warns (the last one is the
   * drifting case, silent by design). */
  for (k = 0; k < sizeof(admissible) / sizeof(admissible[0]); ++k) {
    OK(weft_step_counter_create(&c, 3, WEFT_COUNT_FORWARD, 1));
    CHECK(c != NULL);
    CHECK(RunPattern(c, admissible[k], misuses, 8) == 0);
    CHECK(strcmp(weft_step_counter_misuse_warning(c), "") == 0);
    weft_step_counter_destroy(c);
    c = NULL;
  }
  /* ... and the inadmissible ones warn exactly once, at the 4th F. */
  for (k = 0; k < sizeof(inadmissible) / sizeof(inadmissible[0]); ++k) {
    const char* w;
    OK(weft_step_counter_create(&c, 3, WEFT_COUNT_FORWARD, 1));
    CHECK(RunPattern(c, inadmissible[k], misuses, 8) == 1);
    CHECK(misuses[0] == 4);
    w = weft_step_counter_misuse_warning(c);
    CHECK(w != NULL && strstr(w, "num_steps_per_communication") != NULL);
    CHECK(strstr(w, "forward computation just counted is number 4") != NULL);
    CHECK(strstr(w, "backward") == NULL);
    weft_step_counter_destroy(c);
    c = NULL;
  }

  /* Events, countdowns and counts through FFsFS. */
  OK(weft_step_counter_create(&c, 3, WEFT_COUNT_FORWARD, 1));
  OK(weft_step_counter_steps_per_communication(&j, c));
  CHECK(j == 3);
  OK(weft_step_counter_countdown(&countdown, c, 0));
  CHECK(countdown == 3);
  OK(weft_step_counter_computations(&total, &since, c));
  CHECK(total == 0 && since == 0);
  OK(weft_step_counter_computation(&e, c, 0, 1));
  CHECK(e == WEFT_COMPUTATION_COUNTED);
  OK(weft_step_counter_countdown(&countdown, c, 0));
  CHECK(countdown == 2);
  OK(weft_step_counter_computation(&e, c, 0, 0)); /* under no-grad: nothing changes */
  CHECK(e == WEFT_COMPUTATION_IGNORED);
  OK(weft_step_counter_computation(&e, c, 0, 1));
  CHECK(e == WEFT_COMPUTATION_COUNTED);
  OK(weft_step_counter_countdown(&countdown, c, 0));
  CHECK(countdown == 1);
  OK(weft_step_counter_step(&communicate, c));
  CHECK(communicate == 0);
  OK(weft_step_counter_countdown(&countdown, c, 0)); /* an s does not reset */
  CHECK(countdown == 1);
  OK(weft_step_counter_computation(&e, c, 0, 1));
  CHECK(e == WEFT_COMPUTATION_COMMUNICATE);
  OK(weft_step_counter_countdown(&countdown, c, 0));
  CHECK(countdown == 0);
  OK(weft_step_counter_computations(&total, &since, c));
  CHECK(total == 3 && since == 3);
  OK(weft_step_counter_step(&communicate, c));
  CHECK(communicate == 1);
  OK(weft_step_counter_countdown(&countdown, c, 0));
  CHECK(countdown == 3);
  OK(weft_step_counter_computations(&total, &since, c));
  CHECK(total == 3 && since == 0);
  /* Past the countdown, it stays at 0. */
  CHECK(RunPattern(c, "FFFFF", misuses, 8) == 2 && misuses[0] == 4 && misuses[1] == 5);
  OK(weft_step_counter_countdown(&countdown, c, 0));
  CHECK(countdown == 0);
  CHECK(RunPattern(c, "S", misuses, 8) == 0);

  /* Changing J: at once when nothing was counted since the last S, else at the next S. */
  OK(weft_step_counter_set_steps_per_communication(c, 2));
  OK(weft_step_counter_steps_per_communication(&j, c));
  CHECK(j == 2);
  CHECK(RunPattern(c, "FFS F", misuses, 8) == 0);
  OK(weft_step_counter_set_steps_per_communication(c, 1));
  OK(weft_step_counter_steps_per_communication(&j, c));
  CHECK(j == 2);
  CHECK(RunPattern(c, "sFS FS FS", misuses, 8) == 0);
  OK(weft_step_counter_steps_per_communication(&j, c));
  CHECK(j == 1);
  FAILS(weft_step_counter_set_steps_per_communication(c, 0), WEFT_ERR_INVALID_ARGUMENT,
        "num_steps_per_communication must be at least 1, got 0");
  OK(weft_step_counter_steps_per_communication(&j, c));
  CHECK(j == 1);

  /* Bad arguments. */
  FAILS(weft_step_counter_computation(&e, c, 1, 1), WEFT_ERR_INVALID_ARGUMENT,
        "out of range");
  FAILS(weft_step_counter_computation(&e, c, -1, 1), WEFT_ERR_INVALID_ARGUMENT,
        "out of range");
  FAILS(weft_step_counter_countdown(&countdown, c, 1), WEFT_ERR_INVALID_ARGUMENT,
        "out of range");
  FAILS(weft_step_counter_step(NULL, c), WEFT_ERR_INVALID_ARGUMENT, "communicate is NULL");
  FAILS(weft_step_counter_step(&communicate, NULL), WEFT_ERR_INVALID_ARGUMENT,
        "counter is NULL");
  FAILS(weft_step_counter_computation(&e, NULL, 0, 1), WEFT_ERR_INVALID_ARGUMENT,
        "counter is NULL");
  FAILS(weft_step_counter_computations(&total, &since, NULL), WEFT_ERR_INVALID_ARGUMENT,
        "counter is NULL");
  CHECK(weft_step_counter_misuse_warning(NULL) == NULL);
  weft_step_counter_destroy(c);
  c = NULL;

  FAILS(weft_step_counter_create(&bad, 0, WEFT_COUNT_FORWARD, 1), WEFT_ERR_INVALID_ARGUMENT,
        "num_steps_per_communication must be at least 1, got 0");
  CHECK(bad == NULL && strlen(weft_last_error()) > 0);
  FAILS(weft_step_counter_create(&bad, -2, WEFT_COUNT_BACKWARD, 1), WEFT_ERR_INVALID_ARGUMENT,
        "got -2");
  FAILS(weft_step_counter_create(&bad, 3, WEFT_COUNT_FORWARD, 0), WEFT_ERR_INVALID_ARGUMENT,
        "at least one unit");
  FAILS(weft_step_counter_create(&bad, 3, (weft_count_kind)7, 1), WEFT_ERR_INVALID_ARGUMENT,
        "WEFT_COUNT_FORWARD or WEFT_COUNT_BACKWARD");
  FAILS(weft_step_counter_create(NULL, 3, WEFT_COUNT_FORWARD, 1), WEFT_ERR_INVALID_ARGUMENT,
        "counter is NULL");
  CHECK(bad == NULL);
  weft_step_counter_destroy(NULL);

  /* A step before any counted computation: the optimizer is not seeing the model. */
  OK(weft_step_counter_create(&c, 1, WEFT_COUNT_FORWARD, 1));
  OK(weft_step_counter_computation(&e, c, 0, 0)); /* under no-grad: still nothing counted */
  CHECK(e == WEFT_COMPUTATION_IGNORED);
  communicate = -1;
  FAILS(weft_step_counter_step(&communicate, c), WEFT_ERR_FAILED_PRECONDITION,
        "before any counted forward computation");
  CHECK(strlen(weft_last_error()) > 0 && communicate == -1);
  CHECK(RunPattern(c, "FSs", misuses, 8) == 0); /* then: an S, and an s with nothing new */
  weft_step_counter_destroy(c);
  c = NULL;

  /* Backward, one unit per parameter (3), J = 2: each unit counts down on its own, and a
   * pass that finds units at 0 warns once, from the first unit that sees it. */
  OK(weft_step_counter_create(&c, 2, WEFT_COUNT_BACKWARD, 3));
  FAILS(weft_step_counter_step(&communicate, c), WEFT_ERR_FAILED_PRECONDITION,
        "before any counted backward computation");
  for (u = 2; u >= 0; --u) {
    OK(weft_step_counter_computation(&e, c, u, 1));
    CHECK(e == WEFT_COMPUTATION_COUNTED);
  }
  OK(weft_step_counter_step(&communicate, c));
  CHECK(communicate == 0);
  for (u = 2; u >= 1; --u) {
    OK(weft_step_counter_computation(&e, c, u, 1));
    CHECK(e == WEFT_COMPUTATION_COMMUNICATE);
  }
  OK(weft_step_counter_countdown(&countdown, c, 1));
  CHECK(countdown == 0);
  OK(weft_step_counter_countdown(&countdown, c, 0));
  CHECK(countdown == 1);
  OK(weft_step_counter_computation(&e, c, 0, 1));
  CHECK(e == WEFT_COMPUTATION_COMMUNICATE);
  OK(weft_step_counter_computations(&total, &since, c));
  CHECK(total == 2 && since == 2);
  CHECK(strcmp(weft_step_counter_misuse_warning(c), "") == 0);
  /* A third pass before the step: one warning for the whole pass. */
  OK(weft_step_counter_computation(&e, c, 1, 1));
  CHECK(e == WEFT_COMPUTATION_MISUSE);
  OK(weft_step_counter_computation(&e, c, 0, 1));
  CHECK(e == WEFT_COMPUTATION_COUNTED);
  OK(weft_step_counter_computation(&e, c, 2, 1));
  CHECK(e == WEFT_COMPUTATION_COUNTED);
  {
    const char* w = weft_step_counter_misuse_warning(c);
    CHECK(w != NULL && strstr(w, "num_steps_per_communication") != NULL);
    CHECK(strstr(w, "backward computation just counted is number 3") != NULL);
    CHECK(strstr(w, "forward") == NULL);
  }
  OK(weft_step_counter_computations(&total, &since, c));
  CHECK(total == 3 && since == 3);
  OK(weft_step_counter_step(&communicate, c));
  CHECK(communicate == 1);
  for (u = 0; u < 3; ++u) {
    OK(weft_step_counter_countdown(&countdown, c, u));
    CHECK(countdown == 2);
  }
  /* A unit that never reaches 0 (an unused parameter) does not hold back the S. */
  OK(weft_step_counter_computation(&e, c, 0, 1));
  OK(weft_step_counter_computation(&e, c, 0, 1));
  CHECK(e == WEFT_COMPUTATION_COMMUNICATE);
  OK(weft_step_counter_step(&communicate, c));
  CHECK(communicate == 1);
  weft_step_counter_destroy(c);
}

/* Checks one plan against its expected shape: info, boundaries, stage costs, newly active
 * ranks (a sorted list of n_new) and, for every rank of the world, its role. */
static void CheckPlan(const weft_pipe_plan* plan, int frozen, int k, int replicas,
                      int micro_batches, int world, double max_cost, const int* boundaries,
                      const double* stage_costs, const int* newly_active, size_t n_new,
                      const int* replica_of, const int* stage_of) {
  weft_pipe_plan_info info = WEFT_PIPE_PLAN_INFO_INIT;
  int ints[64];
  double costs[64];
  size_t count = 99, i;
  int r;
  OK(weft_pipe_plan_get_info(&info, plan));
  CHECK(info.frozen == frozen && info.k == k && info.replicas == replicas);
  CHECK(info.micro_batches == micro_batches && info.world == world);
  CHECK(NEAR(info.m0, 2.0) && NEAR(info.max_cost, max_cost));
  /* The array convention: (NULL, 0) asks for the count. */
  OK(weft_pipe_plan_boundaries(NULL, 0, &count, plan));
  CHECK(count == (size_t)k + 1);
  OK(weft_pipe_plan_boundaries(ints, 64, &count, plan));
  CHECK(count == (size_t)k + 1);
  for (i = 0; i < count; ++i) CHECK(ints[i] == boundaries[i]);
  OK(weft_pipe_plan_stage_costs(costs, 64, &count, plan));
  CHECK(count == (size_t)k);
  for (i = 0; i < count; ++i) CHECK(NEAR(costs[i], stage_costs[i]));
  OK(weft_pipe_plan_newly_active(ints, 64, &count, plan));
  CHECK(count == n_new);
  for (i = 0; i < count; ++i) CHECK(ints[i] == newly_active[i]);
  for (r = 0; r < world; ++r) {
    int replica = -7, stage = -7;
    OK(weft_pipe_plan_role(&replica, &stage, plan, r));
    CHECK(replica == replica_of[r] && stage == stage_of[r]);
  }
}

/* Elastic pipelining's pure computations (pipe/README.md): freezing, partitioning, AutoPipe/AutoDP
 * plans, schedules. Plain data: before weft_init(). */
static void TestPipe(void) {
  const weft_pipe_freeze_options freeze_defaults = WEFT_PIPE_FREEZE_OPTIONS_INIT;
  weft_pipe_freeze_options fo = WEFT_PIPE_FREEZE_OPTIONS_INIT;
  weft_pipe_plan_options po = WEFT_PIPE_PLAN_OPTIONS_INIT;
  weft_pipe_plan *plan = NULL, *next = NULL, *bad = NULL;
  double sizes[12], norms[12], costs[16], max_cost = -1, bubble = -1;
  int ints[16], f = -1, t, cycles = -1;
  size_t count = 0, i;

  /* ---- the AutoFreeze schedule bound ---- */
  CHECK(freeze_defaults.version == WEFT_PIPE_FREEZE_OPTIONS_VERSION);
  CHECK(NEAR(freeze_defaults.alpha, 1.0 / 3.0) && freeze_defaults.gradient_aware == 0 &&
        freeze_defaults.freeze_last == 0);
  /* L = 12, alpha = 1/3: F_t = ceil(12 (1 - (2/3)^t)) = ceil(12 (3^t - 2^t) / 3^t), in exact
   * integer arithmetic here: 0, 4, 7 (6.67), 9 (8.44), 10 (9.63), 11 (10.42). */
  {
    static const int expected[6] = {0, 4, 7, 9, 10, 11};
    long three = 1, two = 1;
    for (t = 0; t < 6; ++t) {
      const long exact = (12 * (three - two) + three - 1) / three; /* integer ceiling */
      CHECK(exact == expected[t]);
      OK(weft_pipe_freeze_bound(&f, 12, 1.0 / 3.0, t));
      CHECK(f == expected[t]);
      three *= 3;
      two *= 2;
    }
  }
  /* Exact at integers: 8 (1 - 1/2) is 4, not 5; 10 (1 - 0.7) is 3 despite 0.3's rounding. */
  OK(weft_pipe_freeze_bound(&f, 8, 0.5, 1));
  CHECK(f == 4);
  OK(weft_pipe_freeze_bound(&f, 8, 0.5, 3));
  CHECK(f == 7);
  OK(weft_pipe_freeze_bound(&f, 10, 0.3, 1));
  CHECK(f == 3);
  OK(weft_pipe_freeze_bound(&f, 12, 1.0, 1)); /* alpha 1: everything at the first point */
  CHECK(f == 12);
  FAILS(weft_pipe_freeze_bound(&f, 12, 0.0, 1), WEFT_ERR_INVALID_ARGUMENT, "alpha");
  FAILS(weft_pipe_freeze_bound(&f, 12, 1.5, 1), WEFT_ERR_INVALID_ARGUMENT, "alpha");
  FAILS(weft_pipe_freeze_bound(&f, 0, 0.5, 1), WEFT_ERR_INVALID_ARGUMENT, "layer");
  FAILS(weft_pipe_freeze_bound(&f, 12, 0.5, -1), WEFT_ERR_INVALID_ARGUMENT, "-1");
  FAILS(weft_pipe_freeze_bound(NULL, 12, 0.5, 1), WEFT_ERR_INVALID_ARGUMENT, "frozen is NULL");

  /* ---- the next frozen count ---- */
  OK(weft_pipe_next_frozen(&f, 12, 2, 4, NULL, 0, NULL)); /* the schedule: the bound */
  CHECK(f == 7);
  OK(weft_pipe_next_frozen(&f, 12, 1, 9, NULL, 0, NULL)); /* layers never unfreeze */
  CHECK(f == 9);
  fo.alpha = 1.0; /* the bound is L: the last layer stays trainable unless freeze_last */
  OK(weft_pipe_next_frozen(&f, 12, 1, 0, NULL, 0, &fo));
  CHECK(f == 11);
  fo.freeze_last = 1;
  OK(weft_pipe_next_frozen(&f, 12, 1, 0, NULL, 0, &fo));
  CHECK(f == 12);
  /* Gradient-aware: min(bound, 1 + the trainable layer with the smallest norm). */
  fo = freeze_defaults;
  fo.gradient_aware = 1;
  for (i = 0; i < 12; ++i) norms[i] = 10.0 + (double)i;
  norms[5] = 1.0;
  norms[2] = 0.5; /* already frozen (below previous = 4): not a candidate */
  OK(weft_pipe_next_frozen(&f, 12, 2, 4, norms, 12, &fo));
  CHECK(f == 6);
  norms[5] = 10.0;
  norms[9] = 1.0; /* 1 + 9 = 10 is above the bound 7 */
  OK(weft_pipe_next_frozen(&f, 12, 2, 4, norms, 12, &fo));
  CHECK(f == 7);
  norms[6] = norms[9] = 0.25; /* a tie: the earliest */
  OK(weft_pipe_next_frozen(&f, 12, 2, 4, norms, 12, &fo));
  CHECK(f == 7);
  norms[4] = 0.25;
  OK(weft_pipe_next_frozen(&f, 12, 2, 4, norms, 12, &fo));
  CHECK(f == 5);
  /* The same norms without the policy: ignored. */
  OK(weft_pipe_next_frozen(&f, 12, 2, 4, norms, 12, &freeze_defaults));
  CHECK(f == 7);
  FAILS(weft_pipe_next_frozen(&f, 12, 2, 4, NULL, 0, &fo), WEFT_ERR_INVALID_ARGUMENT,
        "12");
  FAILS(weft_pipe_next_frozen(&f, 12, 2, 4, norms, 5, &fo), WEFT_ERR_INVALID_ARGUMENT, "5");
  norms[8] = -1.0;
  FAILS(weft_pipe_next_frozen(&f, 12, 2, 4, norms, 12, &fo), WEFT_ERR_INVALID_ARGUMENT,
        "layer 8");
  FAILS(weft_pipe_next_frozen(&f, 12, 2, 4, NULL, 3, &fo), WEFT_ERR_INVALID_ARGUMENT,
        "grad_norms is NULL");
  FAILS(weft_pipe_next_frozen(&f, 12, 2, 13, NULL, 0, NULL), WEFT_ERR_INVALID_ARGUMENT, "13");
  FAILS(weft_pipe_next_frozen(NULL, 12, 2, 4, NULL, 0, NULL), WEFT_ERR_INVALID_ARGUMENT,
        "frozen is NULL");
  fo = freeze_defaults;
  fo.alpha = 0.0;
  FAILS(weft_pipe_next_frozen(&f, 12, 2, 4, NULL, 0, &fo), WEFT_ERR_INVALID_ARGUMENT, "alpha");
  fo = freeze_defaults;
  fo.version = 0;
  FAILS(weft_pipe_next_frozen(&f, 12, 2, 4, NULL, 0, &fo), WEFT_ERR_INVALID_ARGUMENT,
        "WEFT_PIPE_FREEZE_OPTIONS_INIT");
  fo.version = WEFT_PIPE_FREEZE_OPTIONS_VERSION + 1;
  FAILS(weft_pipe_next_frozen(&f, 12, 2, 4, NULL, 0, &fo), WEFT_ERR_INVALID_ARGUMENT,
        "weft_pipe_freeze_options");

  /* ---- per-layer costs ---- */
  {
    const double counts[6] = {6, 12, 18, 24, 30, 36};
    const double negative[3] = {1, -1, 1};
    OK(weft_pipe_parameter_costs(NULL, 0, &count, counts, 6, 2, 1.0 / 6.0));
    CHECK(count == 6);
    OK(weft_pipe_parameter_costs(costs, 16, &count, counts, 6, 2, 1.0 / 6.0));
    CHECK(count == 6 && NEAR(costs[0], 1) && NEAR(costs[1], 2) && costs[2] == 18 &&
          costs[5] == 36);
    OK(weft_pipe_parameter_costs(costs, 16, &count, counts, 6, 6, 0.5));
    CHECK(count == 6 && costs[0] == 3 && costs[5] == 18);
    costs[0] = -7;
    FAILS(weft_pipe_parameter_costs(costs, 5, &count, counts, 6, 2, 1.0 / 6.0),
          WEFT_ERR_OUT_OF_RANGE, "6 are needed");
    CHECK(count == 6 && costs[0] == -7); /* nothing written */
    FAILS(weft_pipe_parameter_costs(costs, 16, &count, negative, 3, 0, 1.0 / 6.0),
          WEFT_ERR_INVALID_ARGUMENT, "layer 1");
    FAILS(weft_pipe_parameter_costs(costs, 16, &count, counts, 6, 7, 1.0 / 6.0),
          WEFT_ERR_INVALID_ARGUMENT, "7");
    FAILS(weft_pipe_parameter_costs(costs, 16, &count, counts, 6, 0, 2.0),
          WEFT_ERR_INVALID_ARGUMENT, "lambda");
    FAILS(weft_pipe_parameter_costs(costs, 16, NULL, counts, 6, 0, 0.5),
          WEFT_ERR_INVALID_ARGUMENT, "count is NULL");
    FAILS(weft_pipe_parameter_costs(costs, 16, &count, NULL, 6, 0, 0.5),
          WEFT_ERR_INVALID_ARGUMENT, "sizes is NULL");
  }

  /* ---- partitions ---- */
  {
    const double c5[5] = {1, 2, 3, 4, 5};
    const double negative[3] = {1, -1, 1};
    /* Two stages: cutting after 1, 2, 3 or 4 layers gives largest stages 14, 12, 9, 10. */
    OK(weft_pipe_partition(ints, 16, &count, &max_cost, c5, 5, 2, WEFT_PIPE_STRATEGY_OPTIMAL));
    CHECK(count == 3 && ints[0] == 0 && ints[1] == 3 && ints[2] == 5 && max_cost == 9);
    /* Three stages: 5 and 4 alone, 1 + 2 + 3 = 6 (any other cut has a stage >= 7). */
    OK(weft_pipe_partition(ints, 16, &count, &max_cost, c5, 5, 3, WEFT_PIPE_STRATEGY_OPTIMAL));
    CHECK(count == 4 && ints[0] == 0 && ints[1] == 3 && ints[2] == 4 && ints[3] == 5);
    CHECK(max_cost == 6);
    OK(weft_pipe_partition(NULL, 0, &count, NULL, c5, 5, 3, WEFT_PIPE_STRATEGY_OPTIMAL));
    CHECK(count == 4);
    /* Even: the first L mod K stages get one layer more: 2, 2, 1 layers. */
    OK(weft_pipe_partition(ints, 16, &count, &max_cost, c5, 5, 3, WEFT_PIPE_STRATEGY_EVEN));
    CHECK(count == 4 && ints[1] == 2 && ints[2] == 4 && ints[3] == 5 && max_cost == 7);
    /* Greedy (the paper's walk): a contiguous partition, never better than the optimum. */
    OK(weft_pipe_partition(ints, 16, &count, &max_cost, c5, 5, 3, WEFT_PIPE_STRATEGY_GREEDY));
    CHECK(count == 4 && ints[0] == 0 && ints[3] == 5 && max_cost >= 6);
    for (i = 0; i + 1 < count; ++i) CHECK(ints[i] <= ints[i + 1]);
    /* ... which may leave stages empty, so it takes more stages than layers. */
    OK(weft_pipe_partition(ints, 16, &count, NULL, c5, 5, 6, WEFT_PIPE_STRATEGY_GREEDY));
    CHECK(count == 7 && ints[0] == 0 && ints[6] == 5);
    ints[0] = -7;
    FAILS(weft_pipe_partition(ints, 3, &count, &max_cost, c5, 5, 3, WEFT_PIPE_STRATEGY_OPTIMAL),
          WEFT_ERR_OUT_OF_RANGE, "4 are needed");
    CHECK(count == 4 && ints[0] == -7);
    FAILS(weft_pipe_partition(ints, 16, &count, &max_cost, c5, 5, 0, WEFT_PIPE_STRATEGY_OPTIMAL),
          WEFT_ERR_INVALID_ARGUMENT, "stages");
    FAILS(weft_pipe_partition(ints, 16, &count, &max_cost, c5, 5, 6, WEFT_PIPE_STRATEGY_OPTIMAL),
          WEFT_ERR_INVALID_ARGUMENT, "6 stages for 5 layers");
    FAILS(weft_pipe_partition(ints, 16, &count, &max_cost, c5, 5, 6, WEFT_PIPE_STRATEGY_EVEN),
          WEFT_ERR_INVALID_ARGUMENT, "6 stages for 5 layers");
    FAILS(weft_pipe_partition(ints, 16, &count, &max_cost, negative, 3, 2,
                              WEFT_PIPE_STRATEGY_OPTIMAL),
          WEFT_ERR_INVALID_ARGUMENT, "layer 1");
    FAILS(weft_pipe_partition(ints, 16, &count, &max_cost, c5, 0, 2, WEFT_PIPE_STRATEGY_OPTIMAL),
          WEFT_ERR_INVALID_ARGUMENT, "no layers");
    FAILS(weft_pipe_partition(ints, 16, &count, &max_cost, c5, 5, 2, (weft_pipe_strategy)7),
          WEFT_ERR_INVALID_ARGUMENT, "strategy");
    FAILS(weft_pipe_partition(ints, 16, NULL, &max_cost, c5, 5, 2, WEFT_PIPE_STRATEGY_OPTIMAL),
          WEFT_ERR_INVALID_ARGUMENT, "count is NULL");
  }

  /* ---- AutoPipe/AutoDP plans: 1 machine of 8 devices, k0 = 8, 12 equal layers ---- */
  for (i = 0; i < 12; ++i) sizes[i] = 1.0;
  CHECK(po.version == WEFT_PIPE_PLAN_OPTIONS_VERSION && po.machines == 1 &&
        po.devices_per_machine == 8 && po.k0 == 8 && NEAR(po.lambda, 1.0 / 6.0) &&
        po.strategy == WEFT_PIPE_STRATEGY_OPTIMAL && po.micro_batches == 0);
  {
    /* F = 0: K = k0 = 8, one replica on every rank, M = 4 K. M0 = ceil(12 / 8) = 2, and
     * the lexicographically smallest boundaries with stages <= 2 take single layers first. */
    static const int b0[9] = {0, 1, 2, 3, 4, 6, 8, 10, 12};
    static const double c0[8] = {1, 1, 1, 1, 2, 2, 2, 2};
    static const int replica0[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    static const int stage0[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    /* F = 4 (t = 1): 4/6 + 8 > 4 stages x M0, so K stays 8 (frozen layers at 1/6). */
    static const int b4[9] = {0, 5, 6, 7, 8, 9, 10, 11, 12};
    static const double c4[8] = {4.0 / 6.0 + 1, 1, 1, 1, 1, 1, 1, 1};
    /* F = 7 (t = 2): 7/6 + 5 fits 4 stages of <= 2 (not 2 stages): K = 4, 2 replicas, the
     * second (ranks 4-7) newly active. */
    static const int b7[5] = {0, 1, 8, 10, 12};
    static const double c7[4] = {1.0 / 6.0, 6.0 / 6.0 + 1, 2, 2};
    static const int new7[4] = {4, 5, 6, 7};
    static const int replica7[8] = {0, 0, 0, 0, 1, 1, 1, 1};
    static const int stage7[8] = {0, 1, 2, 3, 0, 1, 2, 3};
    /* F = 9 (t = 3): 9/6 + 3 > 2 stages x 2: K stays 4, nobody new. */
    static const int b9[5] = {0, 8, 10, 11, 12};
    static const double c9[4] = {8.0 / 6.0, 1.0 / 6.0 + 1, 1, 1};
    /* F = 10 (t = 4): 10/6 | 2 fits 2 stages: K = 2, 4 replicas; replicas 2 and 3 (ranks
     * 4-7) did not exist before, so those ranks are newly active. */
    static const int b10[3] = {0, 10, 12};
    static const double c10[2] = {10.0 / 6.0, 2};
    static const int replica10[8] = {0, 0, 1, 1, 2, 2, 3, 3};
    static const int stage10[8] = {0, 1, 0, 1, 0, 1, 0, 1};
    static const int frozen_at[5] = {0, 4, 7, 9, 10};

    /* The frozen counts come from the freeze schedule of the same model. */
    for (t = 0; t < 5; ++t) {
      OK(weft_pipe_next_frozen(&f, 12, t, t == 0 ? 0 : frozen_at[t - 1], NULL, 0, NULL));
      CHECK(f == frozen_at[t]);
    }
    OK(weft_pipe_plan_create(&plan, sizes, 12, 0, &po, NULL));
    CHECK(plan != NULL);
    CheckPlan(plan, 0, 8, 1, 32, 8, 2.0, b0, c0, NULL, 0, replica0, stage0);
    OK(weft_pipe_plan_create(&next, sizes, 12, 4, NULL, plan)); /* NULL: the defaults */
    CheckPlan(next, 4, 8, 1, 32, 8, 4.0 / 6.0 + 1, b4, c4, NULL, 0, replica0, stage0);
    weft_pipe_plan_destroy(plan);
    plan = next;
    OK(weft_pipe_plan_create(&next, sizes, 12, 7, &po, plan));
    CheckPlan(next, 7, 4, 2, 16, 8, 2.0, b7, c7, new7, 4, replica7, stage7);
    weft_pipe_plan_destroy(plan);
    plan = next;
    OK(weft_pipe_plan_create(&next, sizes, 12, 9, &po, plan));
    CheckPlan(next, 9, 4, 2, 16, 8, 8.0 / 6.0, b9, c9, NULL, 0, replica7, stage7);
    /* Errors with a previous plan: frozen going down, another world. */
    bad = plan; /* (any non-NULL value: a failed create sets *plan to NULL) */
    FAILS(weft_pipe_plan_create(&bad, sizes, 12, 8, &po, next), WEFT_ERR_INVALID_ARGUMENT,
          "never");
    CHECK(bad == NULL);
    po.machines = 2;
    FAILS(weft_pipe_plan_create(&bad, sizes, 12, 10, &po, next), WEFT_ERR_INVALID_ARGUMENT,
          "16");
    po.machines = 1;
    weft_pipe_plan_destroy(plan);
    plan = next;
    OK(weft_pipe_plan_create(&next, sizes, 12, 10, &po, plan));
    CheckPlan(next, 10, 2, 4, 8, 8, 2.0, b10, c10, new7, 4, replica10, stage10);
    weft_pipe_plan_destroy(plan);
    plan = next;
    next = NULL;
  }
  {
    /* An explicit M; 6 devices with k0 = 4 leave ranks 4 and 5 idle (-1, -1). */
    static const int b[5] = {0, 3, 6, 9, 12};
    static const double c[4] = {3, 3, 3, 3};
    static const int replica[6] = {0, 0, 0, 0, -1, -1};
    static const int stage[6] = {0, 1, 2, 3, -1, -1};
    weft_pipe_plan_options six = WEFT_PIPE_PLAN_OPTIONS_INIT;
    weft_pipe_plan_info info = WEFT_PIPE_PLAN_INFO_INIT;
    six.devices_per_machine = 6;
    six.k0 = 4;
    six.micro_batches = 6;
    OK(weft_pipe_plan_create(&next, sizes, 12, 0, &six, NULL));
    OK(weft_pipe_plan_get_info(&info, next));
    CHECK(info.k == 4 && info.replicas == 1 && info.micro_batches == 6 && info.world == 6);
    CHECK(info.m0 == 3 && info.max_cost == 3);
    OK(weft_pipe_plan_boundaries(ints, 16, &count, next));
    CHECK(count == 5);
    for (i = 0; i < 5; ++i) CHECK(ints[i] == b[i]);
    OK(weft_pipe_plan_stage_costs(costs, 16, &count, next));
    CHECK(count == 4 && costs[0] == c[0] && costs[3] == c[3]);
    for (t = 0; t < 6; ++t) {
      int replica_t = -7, stage_t = -7;
      OK(weft_pipe_plan_role(&replica_t, &stage_t, next, t));
      CHECK(replica_t == replica[t] && stage_t == stage[t]);
    }
    weft_pipe_plan_destroy(next);
    next = NULL;
  }
  /* Plan errors. */
  {
    weft_pipe_plan_options o = WEFT_PIPE_PLAN_OPTIONS_INIT;
    weft_pipe_plan_info info = WEFT_PIPE_PLAN_INFO_INIT;
    int replica = -7, stage = -7;
    double with_negative[12];
    memcpy(with_negative, sizes, sizeof(sizes));
    with_negative[3] = -1.0;
    bad = plan;
    FAILS(weft_pipe_plan_create(&bad, with_negative, 12, 0, NULL, NULL),
          WEFT_ERR_INVALID_ARGUMENT, "sizes[3]");
    CHECK(bad == NULL);
    FAILS(weft_pipe_plan_create(&bad, sizes, 4, 0, NULL, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "stages");
    FAILS(weft_pipe_plan_create(&bad, sizes, 12, 13, NULL, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "13");
    FAILS(weft_pipe_plan_create(&bad, sizes, 0, 0, NULL, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "layer");
    FAILS(weft_pipe_plan_create(&bad, NULL, 12, 0, NULL, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "sizes is NULL");
    FAILS(weft_pipe_plan_create(NULL, sizes, 12, 0, NULL, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "plan is NULL");
    o.k0 = 0;
    FAILS(weft_pipe_plan_create(&bad, sizes, 12, 0, &o, NULL), WEFT_ERR_INVALID_ARGUMENT, "k0");
    o.k0 = 9;
    FAILS(weft_pipe_plan_create(&bad, sizes, 12, 0, &o, NULL), WEFT_ERR_INVALID_ARGUMENT, "k0");
    o.k0 = 8;
    o.micro_batches = -1;
    FAILS(weft_pipe_plan_create(&bad, sizes, 12, 0, &o, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "micro_batches");
    o.micro_batches = 0;
    o.machines = 0;
    FAILS(weft_pipe_plan_create(&bad, sizes, 12, 0, &o, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "machine");
    o.machines = 1;
    o.strategy = (weft_pipe_strategy)9;
    FAILS(weft_pipe_plan_create(&bad, sizes, 12, 0, &o, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "strategy");
    o.strategy = WEFT_PIPE_STRATEGY_OPTIMAL;
    o.version = 0;
    FAILS(weft_pipe_plan_create(&bad, sizes, 12, 0, &o, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "WEFT_PIPE_PLAN_OPTIONS_INIT");
    o.version = WEFT_PIPE_PLAN_OPTIONS_VERSION + 1;
    FAILS(weft_pipe_plan_create(&bad, sizes, 12, 0, &o, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "weft_pipe_plan_options");
    CHECK(bad == NULL);
    FAILS(weft_pipe_plan_get_info(NULL, plan), WEFT_ERR_INVALID_ARGUMENT, "info is NULL");
    FAILS(weft_pipe_plan_get_info(&info, NULL), WEFT_ERR_INVALID_ARGUMENT, "plan is NULL");
    {
      weft_pipe_plan_info unversioned;
      memset(&unversioned, 0, sizeof(unversioned));
      FAILS(weft_pipe_plan_get_info(&unversioned, plan), WEFT_ERR_INVALID_ARGUMENT,
            "WEFT_PIPE_PLAN_INFO_INIT");
    }
    FAILS(weft_pipe_plan_boundaries(ints, 16, &count, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "plan is NULL");
    FAILS(weft_pipe_plan_stage_costs(costs, 16, NULL, plan), WEFT_ERR_INVALID_ARGUMENT,
          "count is NULL");
    ints[0] = -7;
    FAILS(weft_pipe_plan_newly_active(ints, 3, &count, plan), WEFT_ERR_OUT_OF_RANGE,
          "4 are needed");
    CHECK(count == 4 && ints[0] == -7);
    FAILS(weft_pipe_plan_role(&replica, &stage, plan, 8), WEFT_ERR_INVALID_ARGUMENT, "8");
    FAILS(weft_pipe_plan_role(&replica, &stage, plan, -1), WEFT_ERR_INVALID_ARGUMENT, "-1");
    CHECK(replica == -7 && stage == -7);
    FAILS(weft_pipe_plan_role(NULL, &stage, plan, 0), WEFT_ERR_INVALID_ARGUMENT,
          "replica is NULL");
    FAILS(weft_pipe_plan_role(&replica, NULL, plan, 0), WEFT_ERR_INVALID_ARGUMENT,
          "stage is NULL");
  }
  weft_pipe_plan_destroy(plan);
  weft_pipe_plan_destroy(NULL);

  /* ---- micro-batch schedules: bubble (K - 1) / (M + K - 1), 2 (M + K - 1) cycles ---- */
  OK(weft_pipe_schedule_bubble(&bubble, &cycles, WEFT_PIPE_SCHEDULE_GPIPE, 4, 8));
  CHECK(NEAR(bubble, 3.0 / 11.0) && cycles == 22);
  OK(weft_pipe_schedule_bubble(&bubble, &cycles, WEFT_PIPE_SCHEDULE_1F1B, 4, 8));
  CHECK(NEAR(bubble, 3.0 / 11.0) && cycles == 22);
  OK(weft_pipe_schedule_bubble(&bubble, NULL, WEFT_PIPE_SCHEDULE_GPIPE, 8, 32));
  CHECK(NEAR(bubble, 7.0 / 39.0));
  OK(weft_pipe_schedule_bubble(&bubble, &cycles, WEFT_PIPE_SCHEDULE_GPIPE, 1, 5));
  CHECK(bubble == 0.0 && cycles == 10);
  FAILS(weft_pipe_schedule_bubble(NULL, &cycles, WEFT_PIPE_SCHEDULE_GPIPE, 4, 8),
        WEFT_ERR_INVALID_ARGUMENT, "bubble is NULL");
  FAILS(weft_pipe_schedule_bubble(&bubble, &cycles, WEFT_PIPE_SCHEDULE_GPIPE, 0, 8),
        WEFT_ERR_INVALID_ARGUMENT, "K = 0");
  FAILS(weft_pipe_schedule_bubble(&bubble, &cycles, WEFT_PIPE_SCHEDULE_1F1B, 4, 0),
        WEFT_ERR_INVALID_ARGUMENT, "M = 0");
  FAILS(weft_pipe_schedule_bubble(&bubble, &cycles, (weft_pipe_schedule_kind)5, 4, 8),
        WEFT_ERR_INVALID_ARGUMENT, "kind");
}

/* y = x op over all ranks, x = rank + 1. */
static void TestCollectives(int rank, int size) {
  float x[4], y[4];
  int32_t xi[3];
  int64_t shape4[1] = {4}, shape3[1] = {3};
  DLTensor in = Tensor(x, kDLFloat, 32, 1, shape4), out = Tensor(y, kDLFloat, 32, 1, shape4);
  DLTensor ini = Tensor(xi, kDLInt, 32, 1, shape3);
  DLManagedTensor* gathered = NULL;
  int i, r;

  for (i = 0; i < 4; ++i) x[i] = (float)(rank + 1 + i);
  OK(weft_comm_allreduce(&in, &out, 1, "c.allreduce.avg"));
  for (i = 0; i < 4; ++i) CHECK(NEAR(y[i], (size + 1) / 2.0 + i));
  for (i = 0; i < 4; ++i) CHECK(NEAR(x[i], rank + 1 + i)); /* out of place */
  OK(weft_comm_allreduce(&in, &in, 0, NULL)); /* in place, unnamed: a sum */
  for (i = 0; i < 4; ++i) CHECK(NEAR(x[i], size * (size + 1) / 2.0 + size * i));

  for (i = 0; i < 3; ++i) xi[i] = rank * 10 + i;
  OK(weft_comm_broadcast(&ini, &ini, size - 1, "c.broadcast"));
  for (i = 0; i < 3; ++i) CHECK(xi[i] == (size - 1) * 10 + i);

  /* allgather: rank r contributes r + 1 rows of two values r. */
  {
    float rows[16];
    int64_t shape[2];
    DLTensor part;
    int64_t total = 0;
    int row = 0;
    shape[0] = rank + 1;
    shape[1] = 2;
    for (i = 0; i < 2 * (rank + 1); ++i) rows[i] = (float)rank;
    part = Tensor(rows, kDLFloat, 32, 2, shape);
    OK(weft_comm_allgather(&gathered, &part, "c.allgather"));
    CHECK(gathered != NULL && gathered->deleter != NULL);
    for (r = 0; r < size; ++r) total += r + 1;
    CHECK(gathered->dl_tensor.ndim == 2 && gathered->dl_tensor.shape[0] == total &&
          gathered->dl_tensor.shape[1] == 2);
    CHECK(gathered->dl_tensor.dtype.code == kDLFloat && gathered->dl_tensor.dtype.bits == 32);
    CHECK(((uintptr_t)gathered->dl_tensor.data) % 64 == 0);
    for (r = 0; r < size; ++r) {
      int k;
      for (k = 0; k < 2 * (r + 1); ++k) {
        CHECK(((const float*)gathered->dl_tensor.data)[row * 2 + k] == (float)r);
      }
      row += r + 1;
    }
    gathered->deleter(gathered);
  }
  OK(weft_comm_barrier());
}

static double RankValue(int r) { return (double)r; }

static void TestNeighborOps(int rank, int size) {
  double x[2], y[2];
  int64_t shape2[1] = {2};
  DLTensor in = Tensor(x, kDLFloat, 64, 1, shape2), out = Tensor(y, kDLFloat, 64, 1, shape2);
  int in_ranks[8];
  size_t n_in = 0, k;
  double expected;

  x[0] = RankValue(rank);
  x[1] = 2 * RankValue(rank);
  OK(weft_comm_in_neighbor_ranks(in_ranks, 8, &n_in));

  /* The default topology is unweighted: the uniform average over self and in-neighbors. */
  OK(weft_comm_neighbor_allreduce(&in, &out, NULL, "c.nar.default"));
  expected = RankValue(rank);
  for (k = 0; k < n_in; ++k) expected += RankValue(in_ranks[k]);
  expected /= (double)(n_in + 1);
  CHECK(NEAR(y[0], expected) && NEAR(y[1], 2 * expected));

  /* Explicit weights: half to self, the rest spread over the in-neighbors. */
  {
    weft_neighbor_allreduce_options o = WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_INIT;
    double src_w[8];
    for (k = 0; k < n_in; ++k) src_w[k] = 0.5 / (double)n_in;
    o.has_weights = 1;
    o.self_weight = n_in == 0 ? 1.0 : 0.5;
    o.num_src = n_in;
    o.src_ranks = in_ranks;
    o.src_weights = src_w;
    OK(weft_comm_neighbor_allreduce(&in, &out, &o, "c.nar.weighted"));
    expected = o.self_weight * RankValue(rank);
    for (k = 0; k < n_in; ++k) expected += src_w[k] * RankValue(in_ranks[k]);
    CHECK(NEAR(y[0], expected));
  }

  /* Dynamic: send to the next rank only (scaled by 2), receive from the previous. */
  {
    weft_neighbor_allreduce_options o = WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_INIT;
    int prev = (rank + size - 1) % size, next = (rank + 1) % size;
    double src_w = 0.25, dst_w = 2.0;
    o.has_weights = 1;
    o.self_weight = 0.5;
    o.num_src = size > 1 ? 1 : 0;
    o.src_ranks = &prev;
    o.src_weights = &src_w;
    o.has_dst = 1;
    o.num_dst = size > 1 ? 1 : 0;
    o.dst_ranks = &next;
    o.dst_weights = &dst_w;
    OK(weft_comm_neighbor_allreduce(&in, &out, &o, "c.nar.dynamic"));
    expected = 0.5 * RankValue(rank) + (size > 1 ? 0.25 * 2.0 * RankValue(prev) : 0.0);
    CHECK(NEAR(y[0], expected));
  }

  /* neighbor_allgather: the in-neighbors' values in rank order. */
  {
    DLManagedTensor* g = NULL;
    weft_neighbor_allgather_options o = WEFT_NEIGHBOR_ALLGATHER_OPTIONS_INIT;
    int prev = (rank + size - 1) % size, next = (rank + 1) % size;
    OK(weft_comm_neighbor_allgather(&g, &in, NULL, "c.nag"));
    CHECK(g->dl_tensor.shape[0] == (int64_t)(2 * n_in));
    for (k = 0; k < n_in; ++k) {
      CHECK(((const double*)g->dl_tensor.data)[2 * k] == RankValue(in_ranks[k]));
    }
    g->deleter(g);
    o.has_ranks = 1;
    o.num_src = size > 1 ? 1 : 0;
    o.src_ranks = &prev;
    o.num_dst = size > 1 ? 1 : 0;
    o.dst_ranks = &next;
    OK(weft_comm_neighbor_allgather(&g, &in, &o, "c.nag.ring"));
    CHECK(g->dl_tensor.shape[0] == (size > 1 ? 2 : 0));
    if (size > 1) CHECK(((const double*)g->dl_tensor.data)[1] == 2 * RankValue(prev));
    g->deleter(g);
  }

  /* Hierarchical with one machine: the average over the machine. */
  OK(weft_comm_hierarchical_neighbor_allreduce(&in, &out, NULL, "c.hier"));
  CHECK(NEAR(y[0], (size - 1) / 2.0));

  if (size % 2 == 0) {
    int peer = rank ^ 1;
    OK(weft_comm_pair_gossip(&in, &out, peer, 0.75, 0.25, "c.gossip"));
    CHECK(NEAR(y[0], 0.75 * rank + 0.25 * peer));
  }
}

/* Point to point: a ring of nonblocking sends and receives, a blocking pair, receives
 * that take the sender's dtype and shape, and unnamed ops matched in call order. */
static void TestPointToPoint(int rank, int size) {
  int64_t shape3[1] = {3};
  int prev = (rank + size - 1) % size, next = (rank + 1) % size;
  char recv_name[32], send_name[32];
  int i;

  if (size < 2) return;
  /* Named by the sender: on 2 ranks prev == next, and both directions are in flight. */
  {
    double out_data[3], in_data[3];
    DLTensor out = Tensor(out_data, kDLFloat, 64, 1, shape3);
    DLTensor in = Tensor(in_data, kDLFloat, 64, 1, shape3);
    weft_request *r = NULL, *s = NULL;
    DLManagedTensor* none = NULL;
    for (i = 0; i < 3; ++i) out_data[i] = rank * 100 + i;
    snprintf(recv_name, sizeof(recv_name), "c.ring%d", prev);
    snprintf(send_name, sizeof(send_name), "c.ring%d", rank);
    /* Receive first: neither waits for the other to be posted. */
    OK(weft_comm_recv_nonblocking(&r, &in, prev, recv_name));
    OK(weft_comm_send_nonblocking(&s, &out, next, send_name));
    OK(weft_request_wait(s));
    OK(weft_request_wait(r));
    for (i = 0; i < 3; ++i) CHECK(in_data[i] == prev * 100 + i);
    FAILS(weft_request_take_output(&none, r), WEFT_ERR_INVALID_ARGUMENT, "recv_any");
    weft_request_free(r);
    weft_request_free(s);
  }

  /* Blocking, between ranks 0 and 1 only: the others call nothing. */
  if (rank < 2) {
    int32_t v[3];
    DLTensor t = Tensor(v, kDLInt, 32, 1, shape3);
    if (rank == 0) {
      for (i = 0; i < 3; ++i) v[i] = 7 + i;
      OK(weft_comm_send(&t, 1, "c.p2p.blocking"));
    } else {
      OK(weft_comm_recv(&t, 0, "c.p2p.blocking"));
      for (i = 0; i < 3; ++i) CHECK(v[i] == 7 + i);
    }
    /* Unnamed: the pair's ops match in call order (the two sends carry 1 and 2). */
    if (rank == 0) {
      weft_request *a = NULL, *b = NULL;
      int32_t one[3] = {1, 1, 1}, two[3] = {2, 2, 2};
      DLTensor ta = Tensor(one, kDLInt, 32, 1, shape3), tb = Tensor(two, kDLInt, 32, 1, shape3);
      OK(weft_comm_send_nonblocking(&a, &ta, 1, NULL));
      OK(weft_comm_send_nonblocking(&b, &tb, 1, ""));
      OK(weft_request_wait(a));
      OK(weft_request_wait(b));
      weft_request_free(a);
      weft_request_free(b);
    } else {
      OK(weft_comm_recv(&t, 0, NULL));
      CHECK(v[0] == 1 && v[2] == 1);
      OK(weft_comm_recv(&t, 0, NULL));
      CHECK(v[0] == 2 && v[2] == 2);
    }
  }

  /* recv_any: rank 0 sends each rank a tensor of its own shape (dst x 2 int64). */
  if (rank == 0) {
    int64_t data[16];
    int64_t shape[2];
    int dst;
    for (dst = 1; dst < size; ++dst) {
      DLTensor t;
      shape[0] = dst;
      shape[1] = 2;
      for (i = 0; i < 2 * dst; ++i) data[i] = dst * 10 + i;
      t = Tensor(data, kDLInt, 64, 2, shape);
      OK(weft_comm_send(&t, dst, "c.recv_any"));
      /* The nonblocking receive below gets a float32 scalar-like [1]. */
      {
        float f = (float)dst + 0.5f;
        int64_t one[1] = {1};
        DLTensor tf = Tensor(&f, kDLFloat, 32, 1, one);
        OK(weft_comm_send(&tf, dst, "c.recv_any.nb"));
      }
    }
  } else {
    DLManagedTensor* got = NULL;
    weft_request* req = NULL;
    OK(weft_comm_recv_any(&got, 0, "c.recv_any"));
    CHECK(got != NULL && got->deleter != NULL);
    CHECK(got->dl_tensor.ndim == 2 && got->dl_tensor.shape[0] == rank &&
          got->dl_tensor.shape[1] == 2);
    CHECK(got->dl_tensor.dtype.code == kDLInt && got->dl_tensor.dtype.bits == 64);
    CHECK(((uintptr_t)got->dl_tensor.data) % 64 == 0);
    for (i = 0; i < 2 * rank; ++i) {
      CHECK(((const int64_t*)got->dl_tensor.data)[i] == rank * 10 + i);
    }
    got->deleter(got);
    got = NULL;
    OK(weft_comm_recv_any_nonblocking(&req, 0, "c.recv_any.nb"));
    OK(weft_request_wait(req));
    OK(weft_request_take_output(&got, req));
    CHECK(got->dl_tensor.ndim == 1 && got->dl_tensor.shape[0] == 1);
    CHECK(got->dl_tensor.dtype.code == kDLFloat && got->dl_tensor.dtype.bits == 32);
    CHECK(*(const float*)got->dl_tensor.data == (float)rank + 0.5f);
    got->deleter(got);
    FAILS(weft_request_take_output(&got, req), WEFT_ERR_FAILED_PRECONDITION, "already taken");
    weft_request_free(req);
  }
  OK(weft_comm_barrier());
}

/* Process sets: even and odd ranks each average, sum and broadcast among themselves under
 * the same names. */
static void TestProcessSets(int rank, int size) {
  int set[8];
  size_t n = 0;
  float x[2];
  int64_t y[2];
  int64_t shape2[1] = {2};
  DLTensor tx = Tensor(x, kDLFloat, 32, 1, shape2), ty = Tensor(y, kDLInt, 64, 1, shape2);
  double mean = 0;
  int64_t total = 0;
  int r, i, root;
  weft_request *a = NULL, *b = NULL;

  for (r = rank % 2; r < size; r += 2) set[n++] = r;
  for (i = 0; i < (int)n; ++i) {
    mean += set[i];
    total += set[i] + 1;
  }
  mean /= (double)n;
  root = set[n - 1];

  x[0] = x[1] = (float)rank;
  OK(weft_comm_allreduce_ranks(&tx, &tx, 1, set, n, "c.set.avg"));
  CHECK(NEAR(x[0], mean) && NEAR(x[1], mean));
  y[0] = y[1] = rank + 1;
  OK(weft_comm_allreduce_ranks(&ty, &ty, 0, set, n, NULL)); /* unnamed: per set */
  CHECK(y[0] == total && y[1] == total);
  x[0] = x[1] = rank == root ? 42.5f : -1.0f;
  OK(weft_comm_broadcast_ranks(&tx, &tx, root, set, n, "c.set.bcast"));
  CHECK(x[0] == 42.5f && x[1] == 42.5f);

  /* Nonblocking, and the set's ranks in reverse order (it is a set). */
  {
    int reversed[8];
    float out[2];
    DLTensor tout = Tensor(out, kDLFloat, 32, 1, shape2);
    for (i = 0; i < (int)n; ++i) reversed[i] = set[n - 1 - i];
    x[0] = x[1] = (float)rank;
    OK(weft_comm_allreduce_ranks_nonblocking(&a, &tx, &tout, 0, reversed, n, "c.set.nb"));
    y[0] = y[1] = rank == set[0] ? 5 : 0;
    OK(weft_comm_broadcast_ranks_nonblocking(&b, &ty, &ty, set[0], set, n, "c.set.nb.bcast"));
    OK(weft_request_wait(a));
    OK(weft_request_wait(b));
    CHECK(NEAR(out[0], mean * (double)n) && NEAR(x[0], rank)); /* a sum, out of place */
    CHECK(y[0] == 5 && y[1] == 5);
    weft_request_free(a);
    weft_request_free(b);
  }

  /* A set of one: the caller alone. */
  x[0] = x[1] = (float)rank;
  OK(weft_comm_allreduce_ranks(&tx, &tx, 0, &rank, 1, "c.set.alone"));
  CHECK(x[0] == (float)rank);

  /* num_ranks = 0 is every rank, and a set listing every rank matches it. */
  {
    int everyone[8];
    for (r = 0; r < size; ++r) everyone[r] = r;
    x[0] = x[1] = 1;
    OK(weft_comm_allreduce_ranks(&tx, &tx, 0, rank == 0 ? everyone : NULL,
                                 rank == 0 ? (size_t)size : 0, "c.set.world"));
    CHECK(x[0] == (float)size);
    x[0] = x[1] = 1;
    OK(weft_comm_allreduce(&tx, &tx, 0, "c.set.world2"));
    CHECK(x[0] == (float)size);
  }
}

static int g_released = 0;
static void Release(void* owner) { __atomic_add_fetch((int*)owner, 1, __ATOMIC_SEQ_CST); }

static void TestRequests(int rank, int size) {
  float x[4] = {1, 1, 1, 1}, y[4];
  int64_t shape4[1] = {4};
  DLTensor in = Tensor(x, kDLFloat, 32, 1, shape4), out = Tensor(y, kDLFloat, 32, 1, shape4);
  weft_request *req = NULL, *gather = NULL, *barrier = NULL;
  DLManagedTensor* g = NULL;
  int done = 0;
  int spins;

  OK(weft_comm_allreduce_nonblocking(&req, &in, &out, 0, "c.nb.allreduce"));
  OK(weft_comm_allgather_nonblocking(&gather, &in, "c.nb.allgather"));
  OK(weft_comm_barrier_nonblocking(&barrier));
  OK(weft_request_poll(&done, req));
  CHECK(done == 0 || done == 1);
  OK(weft_request_wait(req));
  OK(weft_request_poll(&done, req));
  CHECK(done == 1);
  OK(weft_request_wait(req)); /* the same status again */
  CHECK(NEAR(y[0], size));
  FAILS(weft_request_take_output(&g, req), WEFT_ERR_INVALID_ARGUMENT, "only allgather");
  OK(weft_request_wait(gather));
  OK(weft_request_take_output(&g, gather));
  CHECK(g->dl_tensor.shape[0] == 4 * size);
  g->deleter(g);
  FAILS(weft_request_take_output(&g, gather), WEFT_ERR_FAILED_PRECONDITION, "already taken");
  OK(weft_request_wait(barrier));
  weft_request_free(req);
  weft_request_free(gather);
  weft_request_free(barrier);
  weft_request_free(NULL);

  /* Freed before completion: the owner is released once the op is done. */
  g_released = 0;
  OK(weft_comm_allreduce_nonblocking(&req, &in, &out, 1, "c.nb.dropped"));
  OK(weft_request_keep_alive(req, &g_released, Release));
  CHECK(__atomic_load_n(&g_released, __ATOMIC_SEQ_CST) == 0);
  weft_request_free(req);
  OK(weft_comm_barrier());
  for (spins = 0; spins < 5000 && __atomic_load_n(&g_released, __ATOMIC_SEQ_CST) == 0; ++spins) {
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  CHECK(__atomic_load_n(&g_released, __ATOMIC_SEQ_CST) == 1);
  FAILS(weft_request_wait(NULL), WEFT_ERR_INVALID_ARGUMENT, "request is NULL");
  FAILS(weft_comm_allreduce_nonblocking(NULL, &in, &out, 1, NULL), WEFT_ERR_INVALID_ARGUMENT,
        "request is NULL");
  (void)rank;
}

static void TestErrors(int rank, int size) {
  float x[4] = {0}, y[5];
  uint16_t h[4];
  int64_t shape4[1] = {4}, shape5[1] = {5};
  DLTensor in = Tensor(x, kDLFloat, 32, 1, shape4), wrong = Tensor(y, kDLFloat, 32, 1, shape5);
  DLTensor uint16 = Tensor(h, kDLUInt, 16, 1, shape4); /* no uint16 in weft */
  DLTensor cuda = Tensor(x, kDLFloat, 32, 1, shape4);
  weft_neighbor_allreduce_options o = WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_INIT;
  int dup[2] = {0, 0};
  double dup_w[2] = {0.25, 0.25};
  weft_status st;

  cuda.device.device_type = kDLCUDA;
  if (size > 1) {
    /* A tensor one rank's C ABI refuses fails that unnamed op on every rank, at once, and
     * the unnamed ops after it still pair with the right ones. */
    float a[4] = {1, 1, 1, 1};
    DLTensor ta = Tensor(a, kDLFloat, 32, 1, shape4);
    DLTensor* mine = rank == size - 1 ? &uint16 : &ta;
    st = weft_comm_allreduce(mine, mine, 0, NULL);
    CHECK(st == WEFT_ERR_UNIMPLEMENTED);
    if (rank != size - 1) CHECK(strstr(weft_last_error(), "which refused it") != NULL);
    for (int v = 2; v <= 4; v += 2) {
      for (int i = 0; i < 4; ++i) a[i] = (float)v;
      OK(weft_comm_allreduce(&ta, &ta, 0, NULL));
      CHECK(a[0] == (float)(v * size) && a[3] == (float)(v * size));
    }
    /* A program (or binding) that rejects an op's arguments itself takes the op's place with
     * weft_comm_refuse: the same as a refusal inside weft. */
    if (rank == size - 1) {
      FAILS(weft_comm_refuse(WEFT_OP_ALLREDUCE, NULL, NULL, 0, -1, WEFT_ERR_OUT_OF_RANGE,
                             "my own check"),
            WEFT_ERR_OUT_OF_RANGE, "my own check");
    } else {
      FAILS(weft_comm_allreduce(&ta, &ta, 0, NULL), WEFT_ERR_OUT_OF_RANGE, "my own check");
    }
    for (int i = 0; i < 4; ++i) a[i] = 1.0f;
    OK(weft_comm_allreduce(&ta, &ta, 0, NULL));
    CHECK(a[0] == (float)size);
    /* A window one rank's C ABI refuses is created nowhere, and no rank waits. */
    FAILS(weft_win_create(rank == size - 1 ? NULL : &ta, "c.refused.win", NULL),
          WEFT_ERR_INVALID_ARGUMENT, "x is NULL");
    FAILS(weft_win_free("c.refused.win"), WEFT_ERR_NOT_FOUND, "no window named");
  }
  /* A refusal that could not stand for any op is refused itself, taking no place. */
  FAILS(weft_comm_refuse(WEFT_OP_ALLREDUCE, NULL, NULL, 0, -1, WEFT_OK, "ok?"),
        WEFT_ERR_INVALID_ARGUMENT, "not WEFT_OK");
  FAILS(weft_comm_refuse((weft_op)42, NULL, NULL, 0, -1, WEFT_ERR_INTERNAL, "?"),
        WEFT_ERR_INVALID_ARGUMENT, "not a weft_op");
  FAILS(weft_comm_refuse(WEFT_OP_ALLREDUCE, NULL, NULL, 2, -1, WEFT_ERR_INTERNAL, "?"),
        WEFT_ERR_INVALID_ARGUMENT, "ranks is NULL");
  FAILS(weft_comm_allreduce(&in, &wrong, 1, NULL), WEFT_ERR_INVALID_ARGUMENT,
        "the output must have the input's dtype and shape");
  FAILS(weft_comm_allreduce(NULL, &in, 1, NULL), WEFT_ERR_INVALID_ARGUMENT, "in is NULL");
  {
    /* A shape whose byte count overflows int64 is refused, not wrapped. */
    int64_t huge[2] = {(int64_t)1 << 62, 4};
    DLTensor overflow = Tensor(x, kDLFloat, 32, 2, huge);
    DLManagedTensor* gathered = NULL;
    FAILS(weft_comm_allreduce(&overflow, &overflow, 1, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "2^63 bytes");
    FAILS(weft_comm_allgather(&gathered, &overflow, NULL), WEFT_ERR_INVALID_ARGUMENT, "2^63 bytes");
    CHECK(gathered == NULL);
  }
  FAILS(weft_comm_allreduce(&uint16, &uint16, 1, NULL), WEFT_ERR_UNIMPLEMENTED,
        "in: unsupported dtype");
  CHECK(weft_comm_allreduce(&cuda, &cuda, 1, NULL) != WEFT_OK);
  FAILS(weft_comm_broadcast(&in, &in, size, NULL), WEFT_ERR_INVALID_ARGUMENT, "root_rank");
  o.version = 0;
  FAILS(weft_comm_neighbor_allreduce(&in, &in, &o, NULL), WEFT_ERR_INVALID_ARGUMENT,
        "WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_INIT");
  o.version = WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_VERSION;
  o.has_weights = 1;
  o.self_weight = 0.5;
  o.num_src = 2;
  o.src_ranks = dup;
  o.src_weights = dup_w;
  FAILS(weft_comm_neighbor_allreduce(&in, &in, &o, NULL), WEFT_ERR_INVALID_ARGUMENT, "twice");
  FAILS(weft_comm_pair_gossip(&in, &in, rank, 0.5, 0.5, NULL), WEFT_ERR_INVALID_ARGUMENT,
        "itself");

  /* Point to point and process sets: refused before anything is sent. */
  {
    int self = rank, far[2], dup_set[2];
    weft_request* req = NULL;
    DLManagedTensor* got = NULL;
    far[0] = rank;
    far[1] = size;
    dup_set[0] = rank;
    dup_set[1] = rank;
    FAILS(weft_comm_send(&in, rank, "c.err.self"), WEFT_ERR_INVALID_ARGUMENT, "itself");
    FAILS(weft_comm_send(&in, -1, "c.err.neg"), WEFT_ERR_INVALID_ARGUMENT, "out of range");
    FAILS(weft_comm_recv(&in, size, "c.err.far"), WEFT_ERR_INVALID_ARGUMENT, "src");
    FAILS(weft_comm_recv_any(&got, size, "c.err.far"), WEFT_ERR_INVALID_ARGUMENT, "src");
    CHECK(got == NULL);
    FAILS(weft_comm_recv_any(NULL, 0, NULL), WEFT_ERR_INVALID_ARGUMENT, "out is NULL");
    FAILS(weft_comm_recv_any_nonblocking(NULL, 0, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "request is NULL");
    FAILS(weft_comm_send_nonblocking(&req, &in, rank, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "itself");
    CHECK(req == NULL);
    FAILS(weft_comm_recv_nonblocking(NULL, &in, 0, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "request is NULL");
    FAILS(weft_comm_send(NULL, 0, NULL), WEFT_ERR_INVALID_ARGUMENT, "in is NULL");
    FAILS(weft_comm_allreduce_ranks(&in, &in, 1, NULL, 2, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "ranks is NULL");
    FAILS(weft_comm_allreduce_ranks(&in, &in, 1, dup_set, 2, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "twice");
    FAILS(weft_comm_allreduce_ranks(&in, &in, 1, far, 2, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "out of range");
    if (size > 1) {
      int other = (rank + 1) % size;
      FAILS(weft_comm_allreduce_ranks(&in, &in, 1, &other, 1, "c.err.without"),
            WEFT_ERR_INVALID_ARGUMENT, "not in `ranks`");
      FAILS(weft_comm_allreduce_ranks_nonblocking(&req, &in, &in, 1, &other, 1, NULL),
            WEFT_ERR_INVALID_ARGUMENT, "not in `ranks`");
      CHECK(req == NULL);
      FAILS(weft_comm_broadcast_ranks(&in, &in, other, &self, 1, "c.err.root"),
            WEFT_ERR_INVALID_ARGUMENT, "root_rank");
      FAILS(weft_comm_broadcast_ranks_nonblocking(&req, &in, &in, rank, &other, 1, NULL),
            WEFT_ERR_INVALID_ARGUMENT, "not in `ranks`");
    }
  }

  /* A name whose shape differs across ranks: an error on every rank, not a hang. */
  if (size > 1) {
    st = weft_comm_allreduce(rank == 0 ? &wrong : &in, rank == 0 ? &wrong : &in, 1,
                             "c.mismatch");
    CHECK(st == WEFT_ERR_INVALID_ARGUMENT);
    CHECK(strstr(weft_last_error(), "shape differs across ranks") != NULL);
  }
  /* The engine still works afterwards. */
  OK(weft_comm_allreduce(&in, &in, 1, "c.after.errors"));
}

static void TestProcessTopology(int rank, int size) {
  weft_topology *ring = NULL, *loaded = NULL, *other = NULL;
  int ranks[8];
  size_t count = 0;
  int flag = 0;

  OK(weft_topology_ring(&ring, size, 0));
  OK(weft_comm_set_topology(ring, 1));
  CHECK(weft_comm_is_topo_weighted() == 1);
  OK(weft_comm_load_topology(&loaded));
  OK(weft_topology_is_equivalent(&flag, ring, loaded));
  CHECK(flag == 1);
  OK(weft_comm_out_neighbor_ranks(ranks, 8, &count));
  CHECK(count == (size_t)(size > 2 ? 2 : size - 1));
  /* Different graphs on different ranks: refused on every rank, nothing changes. */
  if (size > 2) {
    OK(weft_topology_ring(&other, size, rank == 0 ? 1 : 2));
    FAILS(weft_comm_set_topology(other, 0), WEFT_ERR_INVALID_ARGUMENT, "");
    CHECK(weft_comm_is_topo_weighted() == 1);
    weft_topology_destroy(other);
  }
  FAILS(weft_comm_set_topology(NULL, 0), WEFT_ERR_INVALID_ARGUMENT, "topo is NULL");
  weft_topology_destroy(loaded);
  OK(weft_comm_load_machine_topology(&loaded));
  CHECK(weft_topology_size(loaded) == weft_machine_size());
  OK(weft_comm_set_machine_topology(loaded, 0));
  weft_topology_destroy(loaded);
  weft_topology_destroy(ring);
}

static void TestConfigAndTimeline(int rank) {
  const char* value = NULL;
  const char* dir = getenv("TEST_TMPDIR");
  char path[512], file[512];
  FILE* f;
  char text[4096];
  size_t n;
  float x[1] = {1};
  int64_t shape1[1] = {1};
  DLTensor t = Tensor(x, kDLFloat, 32, 1, shape1);

  OK(weft_config_get(&value, "WEFT_FUSION_THRESHOLD_BYTES"));
  CHECK(value != NULL && strlen(value) > 0);
  OK(weft_config_set("WEFT_FUSION_THRESHOLD_BYTES", "1024"));
  OK(weft_config_get(&value, "WEFT_FUSION_THRESHOLD_BYTES"));
  CHECK(strcmp(value, "1024") == 0);
  OK(weft_config_unset("WEFT_FUSION_THRESHOLD_BYTES"));
  FAILS(weft_config_set("WEFT_FUSION_THRESHOLD_BYTES", "lots"), WEFT_ERR_INVALID_ARGUMENT,
        "an integer");
  FAILS(weft_config_get(&value, "WEFT_NO_SUCH_SETTING"), WEFT_ERR_INVALID_ARGUMENT,
        "not a weft setting");
  FAILS(weft_config_unset("WEFT_NO_SUCH_SETTING"), WEFT_ERR_INVALID_ARGUMENT,
        "not a weft setting");
  CHECK(strstr(weft_config_describe(), "WEFT_TIMELINE") != NULL);

  snprintf(path, sizeof(path), "%s/c_api_trace.%%r.json", dir ? dir : "/tmp");
  snprintf(file, sizeof(file), "%s/c_api_trace.%d.json", dir ? dir : "/tmp", rank);
  FAILS(weft_timeline_end_activity("nothing"), WEFT_ERR_FAILED_PRECONDITION, "no timeline");
  OK(weft_timeline_start(path));
  FAILS(weft_timeline_start(path), WEFT_ERR_FAILED_PRECONDITION, "already open");
  OK(weft_timeline_start_activity("c.trace", "user.compute"));
  OK(weft_timeline_end_activity("c.trace"));
  FAILS(weft_timeline_end_activity("c.trace"), WEFT_ERR_FAILED_PRECONDITION, "start_activity");
  OK(weft_comm_allreduce(&t, &t, 1, "c.trace"));
  OK(weft_timeline_stop());
  OK(weft_timeline_stop());
  f = fopen(file, "r");
  CHECK(f != NULL);
  n = fread(text, 1, sizeof(text) - 1, f);
  text[n] = '\0';
  fclose(f);
  CHECK(strstr(text, "user.compute") != NULL);
  CHECK(strstr(text, "\"c.trace\"") != NULL);
  CHECK(strstr(text, "communicate") != NULL || strstr(text, "negotiate") != NULL);
}

static void TestWindows(int rank, int size) {
  double x[3], wrong_data[4];
  int32_t acc[2];
  int64_t shape3[1] = {3}, shape4[1] = {4}, shape2[1] = {2};
  DLTensor t = Tensor(x, kDLFloat, 64, 1, shape3);
  DLTensor wrong = Tensor(wrong_data, kDLFloat, 64, 1, shape4);
  DLTensor ta = Tensor(acc, kDLInt, 32, 1, shape2);
  int in_ranks[8], version_ranks[8];
  int64_t versions[8];
  size_t n_in = 0, nv = 0, k;
  double p = 0, expected;
  int i;
  weft_request* req = NULL;
  weft_topology* ring = NULL;
  weft_win_put_options put = WEFT_WIN_PUT_OPTIONS_INIT;
  weft_win_update_options update = WEFT_WIN_UPDATE_OPTIONS_INIT;

  for (i = 0; i < 3; ++i) x[i] = (rank + 1.0) * (i + 1);
  FAILS(weft_win_put(&t, "c.none", NULL), WEFT_ERR_NOT_FOUND, "no window named 'c.none'");
  OK(weft_win_create(&t, "c.win", NULL));
  OK(weft_comm_in_neighbor_ranks(in_ranks, 8, &n_in));
  OK(weft_comm_barrier());
  OK(weft_win_put(&t, "c.win", NULL));
  OK(weft_comm_barrier()); /* every put has landed */
  OK(weft_win_version(version_ranks, versions, 8, &nv, "c.win"));
  CHECK(nv == n_in);
  for (k = 0; k < nv; ++k) CHECK(version_ranks[k] == in_ranks[k] && versions[k] == 1);
  OK(weft_win_update("c.win", NULL)); /* the uniform average */
  for (i = 0; i < 3; ++i) {
    expected = rank + 1.0;
    for (k = 0; k < n_in; ++k) expected += in_ranks[k] + 1.0;
    CHECK(NEAR(x[i], expected * (i + 1) / (double)(n_in + 1)));
  }
  OK(weft_win_associated_p(&p, "c.win"));
  CHECK(NEAR(p, 1.0));

  /* Nonblocking get with weights, then an update that reads only the buffers. */
  {
    weft_win_get_options get = WEFT_WIN_GET_OPTIONS_INIT;
    double w2[8], nw[8];
    for (k = 0; k < n_in; ++k) {
      w2[k] = 2.0;
      nw[k] = 0.5 / (double)n_in;
    }
    OK(weft_comm_barrier());
    for (i = 0; i < 3; ++i) x[i] = rank + 1.0; /* every rank's x is now rank + 1 */
    OK(weft_comm_barrier());
    get.has_src = 1;
    get.num_src = n_in;
    get.src_ranks = in_ranks;
    get.src_weights = w2;
    OK(weft_win_get_nonblocking(&req, "c.win", &get));
    OK(weft_request_wait(req));
    weft_request_free(req);
    OK(weft_comm_barrier());
    update.has_weights = 1;
    update.self_weight = 0.0;
    update.num_neighbors = n_in;
    update.neighbor_ranks = in_ranks;
    update.neighbor_weights = nw;
    OK(weft_win_update("c.win", &update));
    expected = 0;
    for (k = 0; k < n_in; ++k) expected += nw[k] * 2.0 * (in_ranks[k] + 1.0);
    CHECK(NEAR(x[0], expected));
  }

  /* Errors: a wrong shape, a bad struct, set_topology while windows exist. */
  FAILS(weft_win_put(&wrong, "c.win", NULL), WEFT_ERR_INVALID_ARGUMENT, "the window holds");
  put.version = 0;
  FAILS(weft_win_put(&t, "c.win", &put), WEFT_ERR_INVALID_ARGUMENT,
        "WEFT_WIN_PUT_OPTIONS_INIT");
  put.version = WEFT_WIN_PUT_OPTIONS_VERSION;
  OK(weft_topology_ring(&ring, size, 0));
  FAILS(weft_comm_set_topology(ring, 0), WEFT_ERR_FAILED_PRECONDITION, "windows exist");
  OK(weft_win_mutex_acquire("c.win", NULL, 0));
  OK(weft_win_mutex_release("c.win", NULL, 0));

  /* An int32 window: accumulate twice, collect the sum. */
  acc[0] = rank;
  acc[1] = 10 * rank;
  {
    weft_win_create_options create = WEFT_WIN_CREATE_OPTIONS_INIT;
    create.zero_init = 1;
    create.transport = "bogus";
    FAILS(weft_win_create(&ta, "c.acc", &create), WEFT_ERR_INVALID_ARGUMENT, "not one of mpi, ucx");
    create.transport = "mpi";
    OK(weft_win_create(&ta, "c.acc", &create));
  }
  OK(weft_win_accumulate(&ta, "c.acc", NULL));
  OK(weft_win_accumulate_nonblocking(&req, &ta, "c.acc", NULL));
  OK(weft_request_wait(req));
  weft_request_free(req);
  OK(weft_comm_barrier());
  OK(weft_win_update_then_collect("c.acc", 0));
  expected = rank;
  for (k = 0; k < n_in; ++k) expected += 2.0 * in_ranks[k];
  CHECK(acc[0] == (int32_t)expected && acc[1] == (int32_t)(10 * expected));

  OK(weft_win_free("c.win"));
  FAILS(weft_win_free("c.win"), WEFT_ERR_NOT_FOUND, "no window named 'c.win'");
  OK(weft_win_free(NULL)); /* every window left: c.acc */
  OK(weft_comm_set_topology(ring, 0)); /* allowed again */
  weft_topology_destroy(ring);
  OK(weft_topology_exponential(&ring, size, 2));
  OK(weft_comm_set_topology(ring, 0));
  weft_topology_destroy(ring);
}

int main(void) {
  int rank, size;
  TestVersionAndStatus();
  TestBeforeInit();
  TestOptionsInit();
  TestOutputs();
  TestTopology();
  TestSchedules();
  TestStepCounter();
  TestPipe();

  OK(weft_init());
  FAILS(weft_init(), WEFT_ERR_FAILED_PRECONDITION, "already initialized");
  weft_comm_claim_call_order(); /* the init thread claiming its own order: no change */
  rank = g_rank = weft_rank();
  size = weft_size();
  CHECK(weft_is_initialized() == 1);
  CHECK(rank >= 0 && rank < size);
  CHECK(weft_local_size() >= 1 && weft_machine_size() >= 1);
  CHECK(weft_local_rank() >= 0 && weft_machine_rank() >= 0);
  /* One host (or machines of consecutive ranks under mpirun's default mapping). */
  CHECK(weft_is_homogeneous() == 1);
  CHECK(weft_nccl_built() == 0 || weft_nccl_built() == 1);
  CHECK(weft_timeline_active() == 0);
  CHECK(weft_win_associated_p_ops() == 1);
  weft_win_set_associated_p_ops(0);
  CHECK(weft_win_associated_p_ops() == 0);
  weft_win_set_associated_p_ops(1);
  {
    int unified = -1;
    OK(weft_unified_mpi_window_model(&unified));
    CHECK(unified == 0 || unified == 1);
    FAILS(weft_unified_mpi_window_model(NULL), WEFT_ERR_INVALID_ARGUMENT, "result");
  }

  TestCollectives(rank, size);
  TestNeighborOps(rank, size);
  TestRequests(rank, size);
  TestPointToPoint(rank, size);
  TestProcessSets(rank, size);
  TestErrors(rank, size);
  TestProcessTopology(rank, size);
  TestWindows(rank, size);
  TestConfigAndTimeline(rank);

  OK(weft_shutdown());
  CHECK(weft_is_initialized() == 0 && weft_rank() == -1);
  FAILS(weft_comm_barrier(), WEFT_ERR_FAILED_PRECONDITION, "not initialized");
  /* init after shutdown works. */
  OK(weft_init());
  OK(weft_comm_barrier());
  /* finalize shuts down first, then ends MPI: init cannot come back. */
  OK(weft_finalize());
  CHECK(weft_is_initialized() == 0);
  FAILS(weft_init(), WEFT_ERR_FAILED_PRECONDITION, "already finalized");
  OK(weft_finalize()); /* twice is harmless */
  if (rank == 0) printf("c_api_test: all checks passed on %d ranks\n", size);
  return 0;
}
