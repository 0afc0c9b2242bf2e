/* The elastic pipeline trainer through the C ABI (weft_pipe_trainer_*), from a C99 program
 * under mpirun: a TorchScript model file (argv[1], written by make_trainer_model.py) trained
 * for 2 epochs on Gaussian clusters that every rank generates alike; the metrics, the
 * transition at the freeze point, the accuracy, and the error paths. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <weft/trainer.h>

#include "tests/capi/check.h"

enum { kSamples = 512, kFeatures = 6, kClasses = 4 };

/* A deterministic generator (the same samples on every rank). */
static unsigned long long g_state = 88172645463325252ULL;
static double Uniform(void) {
  g_state ^= g_state << 13;
  g_state ^= g_state >> 7;
  g_state ^= g_state << 17;
  return ((double)(g_state >> 11) + 0.5) / 9007199254740992.0;
}
static double Normal(void) {
  return sqrt(-2.0 * log(Uniform())) * cos(6.283185307179586 * Uniform());
}

static float g_x[kSamples][kFeatures];
static double g_x64[kSamples][kFeatures];
static int64_t g_y[kSamples];
static float g_onehot[kSamples][kClasses];

static void MakeData(void) {
  double centers[kClasses][kFeatures];
  int c, f, i;
  for (c = 0; c < kClasses; ++c) {
    for (f = 0; f < kFeatures; ++f) centers[c][f] = 3.0 * Normal();
  }
  for (i = 0; i < kSamples; ++i) {
    g_y[i] = i % kClasses;
    for (f = 0; f < kFeatures; ++f) {
      g_x64[i][f] = centers[g_y[i]][f] + Normal();
      g_x[i][f] = (float)g_x64[i][f];
    }
    for (c = 0; c < kClasses; ++c) g_onehot[i][c] = c == g_y[i] ? 1.0f : 0.0f;
  }
}

static void TestBeforeInit(const char* path) {
  weft_pipe_trainer* t = (weft_pipe_trainer*)&g_state; /* must be reset to NULL */
  FAILS(weft_pipe_trainer_create(&t, path, NULL), WEFT_ERR_FAILED_PRECONDITION, "weft_init");
  CHECK(t == NULL);
  weft_pipe_trainer_destroy(NULL);
}

/* The library's defaults: the C++ trainer's, and the _INIT macro's for the rest. */
static void TestOptionsInit(void) {
  weft_pipe_trainer_options o;
  weft_pipe_trainer_options macro = WEFT_PIPE_TRAINER_OPTIONS_INIT;
  memset(&o, 0x5A, sizeof o);
  OK(weft_pipe_trainer_options_init(&o, WEFT_PIPE_TRAINER_OPTIONS_VERSION));
  CHECK(o.version == 1 && o.k0 == macro.k0 && o.freeze == 1 && o.alpha == 1.0 / 3.0 &&
        o.gradient_aware == 0 && o.freeze_every_epochs == 1 && o.autopipe == 1 && o.autodp == 1 &&
        o.cache == 0 && o.cache_dir == NULL && o.schedule == WEFT_PIPE_SCHEDULE_GPIPE &&
        o.micro_batches == 0 && o.batch_size == 64 && o.seed == 1 &&
        o.optimizer == WEFT_PIPE_OPTIMIZER_ADAM && o.lr == 1e-3 && o.momentum == 0 &&
        o.weight_decay == 0 && o.loss == WEFT_PIPE_LOSS_CROSS_ENTROPY && o.name == NULL &&
        o.decentralized == 0);
  FAILS(weft_pipe_trainer_options_init(&o, 2), WEFT_ERR_INVALID_ARGUMENT, "version is 2");
}

static void TestCreateErrors(const char* path) {
  weft_pipe_trainer* t = NULL;
  weft_pipe_trainer_options o = WEFT_PIPE_TRAINER_OPTIONS_INIT;
  FAILS(weft_pipe_trainer_create(NULL, path, NULL), WEFT_ERR_INVALID_ARGUMENT,
        "weft_pipe_trainer_create: out");
  FAILS(weft_pipe_trainer_create(&t, NULL, NULL), WEFT_ERR_INVALID_ARGUMENT,
        "torchscript_path");
  FAILS(weft_pipe_trainer_create(&t, "/nonexistent/weft-model.pt", NULL), WEFT_ERR_NOT_FOUND,
        "/nonexistent/weft-model.pt");
  CHECK(strstr(weft_last_error(), "weft_pipe_trainer_create") == weft_last_error());
  CHECK(t == NULL);
  o.version = 0;
  FAILS(weft_pipe_trainer_create(&t, path, &o), WEFT_ERR_INVALID_ARGUMENT,
        "WEFT_PIPE_TRAINER_OPTIONS_INIT");
  o.version = WEFT_PIPE_TRAINER_OPTIONS_VERSION;
  o.alpha = 0.0;
  FAILS(weft_pipe_trainer_create(&t, path, &o), WEFT_ERR_INVALID_ARGUMENT, "alpha");
  o.alpha = 0.5;
  o.optimizer = (weft_pipe_optimizer_kind)7;
  FAILS(weft_pipe_trainer_create(&t, path, &o), WEFT_ERR_INVALID_ARGUMENT, "optimizer");
  o.optimizer = WEFT_PIPE_OPTIMIZER_SGD;
  o.decentralized = 2;
  FAILS(weft_pipe_trainer_create(&t, path, &o), WEFT_ERR_INVALID_ARGUMENT, "decentralized");
  o.decentralized = 0;
  o.loss = (weft_pipe_loss_kind)3;
  FAILS(weft_pipe_trainer_create(&t, path, &o), WEFT_ERR_INVALID_ARGUMENT, "loss");
  o.loss = WEFT_PIPE_LOSS_CROSS_ENTROPY;
  o.lr = -1.0;
  FAILS(weft_pipe_trainer_create(&t, path, &o), WEFT_ERR_INVALID_ARGUMENT, "lr");
  o.lr = 0.1;
  o.batch_size = 0;
  FAILS(weft_pipe_trainer_create(&t, path, &o), WEFT_ERR_INVALID_ARGUMENT, "batch_size");
  o.batch_size = 32;
  o.k0 = weft_size() + 1; /* more stages than ranks */
  FAILS(weft_pipe_trainer_create(&t, path, &o), WEFT_ERR_INVALID_ARGUMENT, "k0");
  CHECK(t == NULL);
  /* NULL handles. */
  {
    int replica = 0, stage = 0;
    size_t needed = 0;
    double accuracy = 0;
    weft_pipe_plan_info info = WEFT_PIPE_PLAN_INFO_INIT;
    FAILS(weft_pipe_trainer_role(&replica, &stage, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "weft_pipe_trainer_role: trainer");
    FAILS(weft_pipe_trainer_get_plan_info(&info, NULL), WEFT_ERR_INVALID_ARGUMENT, "trainer");
    FAILS(weft_pipe_trainer_last_line(NULL, 0, &needed, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "trainer");
    FAILS(weft_pipe_trainer_train_epoch(NULL, NULL, NULL, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "trainer");
    FAILS(weft_pipe_trainer_evaluate(&accuracy, NULL, NULL, NULL), WEFT_ERR_INVALID_ARGUMENT,
          "trainer");
  }
}

static void TestTrain(const char* path) {
  const int world = weft_size();
  const int k0 = world < 7 ? world : 7; /* min(world, layers) */
  weft_pipe_trainer* t = NULL;
  weft_pipe_trainer_options o = WEFT_PIPE_TRAINER_OPTIONS_INIT;
  weft_pipe_epoch_metrics m[2] = {WEFT_PIPE_EPOCH_METRICS_INIT, WEFT_PIPE_EPOCH_METRICS_INIT};
  weft_pipe_plan_info info = WEFT_PIPE_PLAN_INFO_INIT;
  int64_t xshape[2] = {kSamples, kFeatures}, yshape[1] = {kSamples};
  int64_t bad_shape[2] = {kSamples, kFeatures - 1};
  int64_t huge_shape[3] = {(int64_t)1 << 32, (int64_t)1 << 32, 0};
  int64_t huge_strides[2] = {(int64_t)1 << 61, 1};
  DLTensor huge;
  DLTensor x = Tensor(g_x, kDLFloat, 32, 2, xshape);
  DLTensor x64 = Tensor(g_x64, kDLFloat, 64, 2, xshape);
  DLTensor y = Tensor(g_y, kDLInt, 64, 1, yshape);
  DLTensor yf = Tensor(g_x, kDLFloat, 32, 1, yshape);
  DLTensor narrow = Tensor(g_x, kDLFloat, 32, 2, bad_shape);
  double accuracy = 0;
  char line[1024], tiny[4];
  size_t needed = 0;
  int replica = -2, stage = -2, e;

  o.alpha = 0.5;
  o.batch_size = 32;
  o.micro_batches = 2;
  o.lr = 1e-2;
  o.name = "ctrain";
  OK(weft_pipe_trainer_create(&t, path, &o));
  CHECK(t != NULL);
  OK(weft_pipe_trainer_get_plan_info(&info, t));
  CHECK(info.frozen == 0 && info.k == k0 && info.world == world);
  CHECK(info.k * info.replicas <= world);
  OK(weft_pipe_trainer_last_line(NULL, 0, &needed, t));
  CHECK(needed == 1); /* "" before the first epoch */

  /* Data errors, the same on every rank (no communication happens). */
  FAILS(weft_pipe_trainer_train_epoch(NULL, t, &x, &yf), WEFT_ERR_INVALID_ARGUMENT,
        "class indices");
  FAILS(weft_pipe_trainer_train_epoch(NULL, t, &narrow, &y), WEFT_ERR_INVALID_ARGUMENT,
        "does not fit");
  yshape[0] = kSamples - 1;
  FAILS(weft_pipe_trainer_train_epoch(NULL, t, &x, &y), WEFT_ERR_INVALID_ARGUMENT, "targets");
  yshape[0] = kSamples;
  /* Shapes no tensor can have: a negative dim, and dims whose product passes int64. */
  xshape[1] = -1;
  FAILS(weft_pipe_trainer_train_epoch(NULL, t, &x, &y), WEFT_ERR_INVALID_ARGUMENT,
        "negative dimension");
  xshape[1] = (int64_t)1 << 62;
  FAILS(weft_pipe_trainer_train_epoch(NULL, t, &x, &y), WEFT_ERR_INVALID_ARGUMENT,
        "more than 2^63 bytes");
  xshape[1] = kFeatures;
  /* LibTorch multiplies dims in order: a zero after an overflowing product does not help. */
  huge = Tensor(g_x, kDLFloat, 32, 3, huge_shape);
  FAILS(weft_pipe_trainer_train_epoch(NULL, t, &huge, &y), WEFT_ERR_INVALID_ARGUMENT,
        "more elements or bytes than an int64 counts");
  /* 2^62 elements fit an int64, their bytes do not; nor does a stride's span. */
  huge = Tensor(g_x, kDLFloat, 32, 1, &huge_shape[2]);
  huge_shape[2] = (int64_t)1 << 62;
  FAILS(weft_pipe_trainer_train_epoch(NULL, t, &huge, &y), WEFT_ERR_INVALID_ARGUMENT,
        "more than 2^63 bytes");
  x.strides = huge_strides;
  FAILS(weft_pipe_trainer_train_epoch(NULL, t, &x, &y), WEFT_ERR_INVALID_ARGUMENT,
        "spans more than 2^63 bytes");
  /* Two elements 2^61 - 1 apart: the distance fits in int64 bytes, LibTorch's storage, which
   * counts the last element's bytes too, does not. */
  huge_shape[2] = 2;
  huge.strides = &huge_strides[1];
  huge_strides[1] = ((int64_t)1 << 61) - 1;
  FAILS(weft_pipe_trainer_train_epoch(NULL, t, &huge, &y), WEFT_ERR_INVALID_ARGUMENT,
        "more elements or bytes than an int64 counts");
  huge_strides[1] = 1;
  huge_strides[0] = -1;
  FAILS(weft_pipe_trainer_train_epoch(NULL, t, &x, &y), WEFT_ERR_INVALID_ARGUMENT,
        "negative stride");
  x.strides = NULL;
  FAILS(weft_pipe_trainer_train_epoch(NULL, t, NULL, &y), WEFT_ERR_INVALID_ARGUMENT, "inputs");
  m[0].version = 0;
  FAILS(weft_pipe_trainer_train_epoch(&m[0], t, &x, &y), WEFT_ERR_INVALID_ARGUMENT,
        "WEFT_PIPE_EPOCH_METRICS_INIT");
  m[0].version = WEFT_PIPE_EPOCH_METRICS_VERSION;

  for (e = 0; e < 2; ++e) {
    /* float64 inputs the second time: converted to the model's float32. */
    OK(weft_pipe_trainer_train_epoch(&m[e], t, e == 0 ? &x : &x64, &y));
    CHECK(m[e].epoch == e);
    CHECK(m[e].samples == kSamples);
    CHECK(m[e].train_seconds > 0 && m[e].samples_per_second > 0);
    CHECK(m[e].loss > 0 && isfinite(m[e].loss));
    CHECK(m[e].k >= 1 && m[e].k * m[e].replicas <= world);
    CHECK(m[e].micro_batches == 2);
    CHECK(fabs(m[e].bubble_fraction - (double)(m[e].k - 1) / (m[e].micro_batches + m[e].k - 1)) <
          1e-9);
    CHECK(m[e].cache_hit_rate == 0);
    CHECK(m[e].transitioned == 1); /* a freeze point after every epoch */
    CHECK(m[e].next_frozen >= m[e].frozen && m[e].next_k <= m[e].k);
    CHECK(m[e].next_k * m[e].next_replicas <= world);
    CHECK(m[e].transition_seconds >= 0 && m[e].transition_bytes >= 0);
  }
  CHECK(m[0].frozen == 0 && m[0].k == k0);
  CHECK(m[1].frozen == m[0].next_frozen && m[1].k == m[0].next_k &&
        m[1].replicas == m[0].next_replicas);
  /* The freeze schedule (alpha 1/2 over 7 layers) freezes 4 at the first point; K shrinks
   * or frozen grows. */
  CHECK(m[1].frozen == 4);
  CHECK(m[1].k < m[0].k || m[1].frozen > m[0].frozen);
  CHECK(m[1].loss < m[0].loss);
  if (world == 1) CHECK(m[1].syncs_per_second == 0);

  OK(weft_pipe_trainer_get_plan_info(&info, t));
  CHECK(info.frozen == m[1].next_frozen && info.k == m[1].next_k &&
        info.replicas == m[1].next_replicas);
  OK(weft_pipe_trainer_role(&replica, &stage, t));
  CHECK(replica >= -1 && replica < info.replicas && stage >= -1 && stage < info.k);
  CHECK((replica == -1) == (stage == -1));
  if (world == 1) CHECK(replica == 0 && stage == 0);

  OK(weft_pipe_trainer_last_line(NULL, 0, &needed, t));
  CHECK(needed > 20 && needed <= sizeof(line));
  FAILS(weft_pipe_trainer_last_line(tiny, sizeof(tiny), &needed, t), WEFT_ERR_OUT_OF_RANGE,
        "weft_pipe_trainer_last_line");
  OK(weft_pipe_trainer_last_line(line, sizeof(line), &needed, t));
  CHECK(strlen(line) + 1 == needed);
  CHECK(strncmp(line, "PIPE epoch=1 frozen=4 ", 22) == 0);
  CHECK(strstr(line, "stage_layers=") != NULL && strstr(line, "newly_active=") != NULL);
  if (g_rank == 0) printf("%s\n", line);

  OK(weft_pipe_trainer_evaluate(&accuracy, t, &x, &y));
  CHECK(accuracy > 0.6); /* chance is 0.25 */
  if (g_rank == 0) printf("accuracy %.3f on %d ranks\n", accuracy, world);
  FAILS(weft_pipe_trainer_evaluate(NULL, t, &x, &y), WEFT_ERR_INVALID_ARGUMENT, "accuracy");
  weft_pipe_trainer_destroy(t);
}

/* An MSE trainer (one-hot targets), SGD with momentum, the 1F1B schedule, no freezing. */
static void TestMse(const char* path) {
  weft_pipe_trainer* t = NULL;
  weft_pipe_trainer_options o = WEFT_PIPE_TRAINER_OPTIONS_INIT;
  weft_pipe_epoch_metrics m = WEFT_PIPE_EPOCH_METRICS_INIT;
  int64_t xshape[2] = {64, kFeatures}, yshape[2] = {64, kClasses};
  DLTensor x = Tensor(g_x, kDLFloat, 32, 2, xshape);
  DLTensor y = Tensor(g_onehot, kDLFloat, 32, 2, yshape);
  DLTensor yi = Tensor(g_y, kDLInt, 64, 1, yshape);
  double accuracy = 0;
  o.loss = WEFT_PIPE_LOSS_MSE;
  o.optimizer = WEFT_PIPE_OPTIMIZER_SGD;
  o.momentum = 0.9;
  o.lr = 0.05;
  o.freeze = 0;
  o.schedule = WEFT_PIPE_SCHEDULE_1F1B;
  o.batch_size = 16;
  o.name = "cmse";
  OK(weft_pipe_trainer_create(&t, path, &o));
  FAILS(weft_pipe_trainer_train_epoch(&m, t, &x, &yi), WEFT_ERR_INVALID_ARGUMENT, "MSE");
  OK(weft_pipe_trainer_train_epoch(&m, t, &x, &y));
  CHECK(m.epoch == 0 && m.samples == 64 && m.loss > 0 && isfinite(m.loss));
  CHECK(m.transitioned == 0 && m.next_k == 0 && m.frozen == 0);
  FAILS(weft_pipe_trainer_evaluate(&accuracy, t, &x, &yi), WEFT_ERR_FAILED_PRECONDITION, "MSE");
  weft_pipe_trainer_destroy(t);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s MODEL.pt\n", argv[0]);
    return 2;
  }
  MakeData();
  TestBeforeInit(argv[1]);
  TestOptionsInit();
  OK(weft_init());
  g_rank = weft_rank();
  TestCreateErrors(argv[1]);
  TestTrain(argv[1]);
  TestMse(argv[1]);
  OK(weft_shutdown());
  if (g_rank == 0) printf("c_api_trainer_test: PASS\n");
  return 0;
}
