/* SWIG interface: weft.trainer_lowlevel, the Python module over weft/trainer.h (the elastic
 * pipeline trainer, in libweft_trainer.so). weft.pipe.Trainer imports it the first time a
 * trainer is made, so that `import weft` never loads LibTorch. The typemaps follow
 * weft.i's. */
%module(package="weft") trainer_lowlevel

%{
#define WEFT_PY_ON_CALL (void)0
#include <weft/trainer.h>
%}
%include "common.i"

/* ---- pipe: the elastic pipeline trainer ------------------------------------------------- */
/* The training set: DLPack capsules, borrowed for the call. */
%typemap(in) const DLTensor* inputs {
  $1 = weft_py_tensor($input, "inputs");
  if ($1 == NULL) SWIG_fail;
}
%typemap(in) const DLTensor* targets {
  $1 = weft_py_tensor($input, "targets");
  if ($1 == NULL) SWIG_fail;
}
/* (k0, freeze, alpha, gradient_aware, freeze_every_epochs, autopipe, autodp, cache,
 *  cache_dir or None, schedule, micro_batches, batch_size, seed, optimizer, lr, momentum,
 *  weight_decay, loss, name or None, decentralized[, version]); None: the defaults. */
%typemap(in) const weft_pipe_trainer_options* options
    (weft_pipe_trainer_options opts = WEFT_PIPE_TRAINER_OPTIONS_INIT) {
  int schedule = 0, optimizer = 0, loss = 0;
  long long batch_size = 0;
  unsigned long long seed = 0;
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    if (!PyArg_ParseTuple($input, "iidiiiiiziiLKidddizi|I", &opts.k0, &opts.freeze, &opts.alpha,
                          &opts.gradient_aware, &opts.freeze_every_epochs, &opts.autopipe,
                          &opts.autodp, &opts.cache, &opts.cache_dir, &schedule,
                          &opts.micro_batches, &batch_size, &seed, &optimizer, &opts.lr,
                          &opts.momentum, &opts.weight_decay, &loss, &opts.name,
                          &opts.decentralized, &opts.version)) SWIG_fail;
    opts.schedule = (weft_pipe_schedule_kind)schedule;
    opts.batch_size = (int64_t)batch_size;
    opts.seed = (uint64_t)seed;
    opts.optimizer = (weft_pipe_optimizer_kind)optimizer;
    opts.loss = (weft_pipe_loss_kind)loss;
    $1 = &opts;
  }
}
/* The epoch's metrics as a tuple in the struct's field order (epoch .. transition_bytes). */
%typemap(in, numinputs=0) weft_pipe_epoch_metrics* metrics (weft_pipe_epoch_metrics temp) {
  memset(&temp, 0, sizeof(temp));
  temp.version = WEFT_PIPE_EPOCH_METRICS_VERSION;
  $1 = &temp;
}
%typemap(argout) weft_pipe_epoch_metrics* metrics {
  $result = SWIG_Python_AppendOutput(
      $result,
      Py_BuildValue("(iiiiiddLddddiiiidL)", $1->epoch, $1->frozen, $1->k, $1->replicas,
                    $1->micro_batches, $1->bubble_fraction, $1->train_seconds,
                    (long long)$1->samples, $1->samples_per_second, $1->loss,
                    $1->syncs_per_second, $1->cache_hit_rate, $1->transitioned,
                    $1->next_frozen, $1->next_k, $1->next_replicas, $1->transition_seconds,
                    (long long)$1->transition_bytes));
}
%typemap(in, numinputs=0) double* accuracy (double temp = 0) { $1 = &temp; }
%typemap(argout) double* accuracy {
  $result = SWIG_Python_AppendOutput($result, PyFloat_FromDouble(*$1));
}
/* The last line: Python passes the capacity; 0 gives the size needed (an int), more the
 * text (a str). */
%typemap(in) (char* buf, size_t cap, size_t* needed) (size_t n = 0) {
  $2 = (size_t)PyLong_AsSize_t($input);
  if (PyErr_Occurred()) SWIG_fail;
  $1 = $2 > 0 ? (char*)PyMem_Malloc($2) : NULL;
  if ($2 > 0 && $1 == NULL) {
    PyErr_NoMemory();
    SWIG_fail;
  }
  $3 = &n;
}
%typemap(argout) (char* buf, size_t cap, size_t* needed) {
  $result = SWIG_Python_AppendOutput(
      $result, $1 == NULL ? PyLong_FromSize_t(*$3) : PyUnicode_FromString($1));
}
%typemap(freearg) (char* buf, size_t cap, size_t* needed) { PyMem_Free($1); }

%ignore weft_pipe_trainer_options;
%ignore weft_pipe_epoch_metrics;
WEFT_OUT_HANDLE(weft_pipe_trainer, out)

/* weft.h's types, not its functions (weft.lowlevel wraps those). */
%import "weft/weft.h"
%include "weft/trainer.h"
