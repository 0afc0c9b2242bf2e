/* The elastic pipeline trainer of weft's C ABI: the part that runs LibTorch, in its own
 * library. Programs that use it include this header and link -lweft_trainer as well as
 * -lweft (pkg-config weft-trainer); everything else needs only <weft/weft.h> and -lweft,
 * which never loads LibTorch. The conventions of weft.h hold here too. */
#ifndef WEFT_TRAINER_H_
#define WEFT_TRAINER_H_

#include <weft/weft.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- pipe: the elastic pipeline trainer ------------------------------------------------ */

/* PipeTransformer-style training of a TorchScript model (pipe/runtime/trainer.h): AutoFreeze
 * at freeze points, AutoPipe (shorter pipelines) and AutoDP (more replicas) transitions,
 * AutoCache for the frozen prefix, per-epoch metrics. The model file comes from
 * torch.jit.save of a module whose children, in order, are the layers (a scripted
 * torch.nn.Sequential); each child's forward takes and returns one tensor. Every call of
 * this section is collective: every rank of the world calls it, in the same order, after
 * weft_init(). One trainer must not be used by two threads at once. */
typedef struct weft_pipe_trainer weft_pipe_trainer;

typedef enum weft_pipe_optimizer_kind {
  WEFT_PIPE_OPTIMIZER_SGD = 0,  /* lr, momentum, weight_decay */
  WEFT_PIPE_OPTIMIZER_ADAM = 1, /* lr, weight_decay (L2 in the gradient) */
  WEFT_PIPE_OPTIMIZER_ADAMW = 2 /* lr, weight_decay (decoupled) */
} weft_pipe_optimizer_kind;

typedef enum weft_pipe_loss_kind {
  WEFT_PIPE_LOSS_CROSS_ENTROPY = 0, /* outputs [N, C] logits, targets [N] class indices */
  WEFT_PIPE_LOSS_MSE = 1            /* targets shaped like the outputs */
} weft_pipe_loss_kind;

#define WEFT_PIPE_TRAINER_OPTIONS_VERSION 1
typedef struct weft_pipe_trainer_options {
  unsigned int version;
  int k0;                  /* the initial pipeline length; 0: min(world size, layers) */
  int freeze;              /* AutoFreeze at freeze points (default 1) */
  double alpha;            /* the freeze schedule's alpha, in (0, 1] (default 1/3) */
  int gradient_aware;      /* the gradient-aware freeze policy (default 0) */
  int freeze_every_epochs; /* a freeze point every this many epochs (default 1) */
  int autopipe;            /* K halves while the balanced stages fit M0 (default 1) */
  int autodp;              /* freed ranks host more replicas (default 1) */
  int cache;               /* AutoCache of the frozen prefix's output (default 0) */
  const char* cache_dir;   /* the cache's spill directory; NULL or "": none */
  weft_pipe_schedule_kind schedule; /* default WEFT_PIPE_SCHEDULE_GPIPE */
  int micro_batches;       /* per replica mini-batch; 0: 2 K */
  int64_t batch_size;      /* samples per optimizer step over all replicas (default 64) */
  uint64_t seed;           /* the epochs' sample orders (default 1) */
  weft_pipe_optimizer_kind optimizer; /* default WEFT_PIPE_OPTIMIZER_ADAM */
  double lr;               /* default 1e-3 */
  double momentum;         /* SGD only (default 0) */
  double weight_decay;     /* default 0 */
  weft_pipe_loss_kind loss; /* default WEFT_PIPE_LOSS_CROSS_ENTROPY */
  const char* name;        /* op name prefix; NULL or "": "pipe" (two trainers need two) */
  int decentralized;       /* replicas average parameters with one peer replica per step
                              instead of allreducing gradients (default 0; pipe/README.md) */
} weft_pipe_trainer_options;
#define WEFT_PIPE_TRAINER_OPTIONS_INIT                                                     \
  { WEFT_PIPE_TRAINER_OPTIONS_VERSION, 0, 1, 1.0 / 3.0, 0, 1, 1, 1, 0, NULL,              \
    WEFT_PIPE_SCHEDULE_GPIPE, 0, 64, 1, WEFT_PIPE_OPTIMIZER_ADAM, 1e-3, 0.0, 0.0,          \
    WEFT_PIPE_LOSS_CROSS_ENTROPY, NULL, 0 }
/* Writes the defaults (the _INIT macro's; alpha, lambda and the rest as the C++ trainer's
 * TrainerOptions has them) for a struct of `version` (WEFT_PIPE_TRAINER_OPTIONS_VERSION). */
WEFT_API weft_status weft_pipe_trainer_options_init(weft_pipe_trainer_options* options,
                                                    unsigned int version);

/* One epoch's metrics (EpochMetrics): the configuration it trained with, its throughput,
 * and the transition at its end. The caller sets version (WEFT_PIPE_EPOCH_METRICS_INIT);
 * weft fills the fields that version has. The per-stage layers and costs and the newly
 * active ranks are in weft_pipe_trainer_last_line. */
#define WEFT_PIPE_EPOCH_METRICS_VERSION 1
typedef struct weft_pipe_epoch_metrics {
  unsigned int version;
  int epoch; /* 0-based */
  int frozen;
  int k;
  int replicas;
  int micro_batches;
  double bubble_fraction;    /* (K - 1) / (M + K - 1) */
  double train_seconds;      /* training only: first step to last */
  int64_t samples;
  double samples_per_second;
  double loss;               /* mean over the epoch's steps */
  double syncs_per_second;   /* data-parallel gradient synchronizations */
  double cache_hit_rate;
  int transitioned;          /* 0: no transition ran; the next_* and transition_* are 0 */
  int next_frozen;
  int next_k;
  int next_replicas;
  double transition_seconds;
  int64_t transition_bytes;  /* weights and optimizer state moved, on all ranks */
} weft_pipe_epoch_metrics;
#define WEFT_PIPE_EPOCH_METRICS_INIT \
  { WEFT_PIPE_EPOCH_METRICS_VERSION, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }

/* Collective: loads the TorchScript file on every rank (errors name the path; a rank that
 * fails makes every rank fail), checks the options against the model and the world,
 * starts every rank from rank 0's parameters and makes the first plan. NULL options: the
 * defaults. Needs weft_init(). */
WEFT_API weft_status weft_pipe_trainer_create(weft_pipe_trainer** out,
                                              const char* torchscript_path,
                                              const weft_pipe_trainer_options* options);
WEFT_API void weft_pipe_trainer_destroy(weft_pipe_trainer* trainer);
/* Collective: one epoch over the training set, then the freeze point's transition.
 * inputs and targets are the whole training set on every rank: CPU tensors, sample i is
 * inputs[i] and targets[i] (dim 0), borrowed for the call (not copied, unless inputs are of
 * another floating type than the model's parameters, or targets are int32). inputs
 * float32 or float64; targets int64 or int32 class indices for cross-entropy, floating for
 * MSE. metrics may be NULL. */
WEFT_API weft_status weft_pipe_trainer_train_epoch(weft_pipe_epoch_metrics* metrics,
                                                   weft_pipe_trainer* trainer,
                                                   const DLTensor* inputs, const DLTensor* targets);
/* EpochMetrics::ToLine() of the last epoch ("PIPE epoch=0 frozen=0 k=2 ...", with the
 * per-stage layers and costs and the newly active ranks); "" before the first epoch.
 * *needed is always set to its length plus the terminating NUL; (NULL, 0) only asks for
 * it; a buffer of fewer than *needed bytes is WEFT_ERR_OUT_OF_RANGE, nothing written. */
WEFT_API weft_status weft_pipe_trainer_last_line(char* buf, size_t cap, size_t* needed,
                                                 const weft_pipe_trainer* trainer);
/* Collective: the fraction of the samples whose argmax output equals the target (int64 or
 * int32 class indices; a cross-entropy trainer), forward only through the current
 * pipelines, the replicas splitting the samples. */
WEFT_API weft_status weft_pipe_trainer_evaluate(double* accuracy, weft_pipe_trainer* trainer,
                                                const DLTensor* inputs, const DLTensor* targets);
/* This rank's role in the current plan: replica and stage, both -1 for an idle rank. */
WEFT_API weft_status weft_pipe_trainer_role(int* replica, int* stage,
                                            const weft_pipe_trainer* trainer);
/* The current plan's summary (what the next epoch trains with); the caller sets
 * info->version (WEFT_PIPE_PLAN_INFO_INIT). */
WEFT_API weft_status weft_pipe_trainer_get_plan_info(weft_pipe_plan_info* info,
                                                     const weft_pipe_trainer* trainer);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WEFT_TRAINER_H_ */
