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
%{
#define WEFT_PY_FIELD(name, kind) {#name, kind, offsetof(weft_pipe_trainer_options, name)}
static const weft_py_option weft_py_trainer_fields[] = {
    WEFT_PY_FIELD(version, 'I'),        WEFT_PY_FIELD(k0, 'i'),
    WEFT_PY_FIELD(freeze, 'b'),         WEFT_PY_FIELD(alpha, 'd'),
    WEFT_PY_FIELD(gradient_aware, 'b'), WEFT_PY_FIELD(freeze_every_epochs, 'i'),
    WEFT_PY_FIELD(autopipe, 'b'),       WEFT_PY_FIELD(autodp, 'b'),
    WEFT_PY_FIELD(cache, 'b'),          WEFT_PY_FIELD(cache_dir, 'z'),
    WEFT_PY_FIELD(schedule, 'e'),       WEFT_PY_FIELD(micro_batches, 'i'),
    WEFT_PY_FIELD(batch_size, 'L'),     WEFT_PY_FIELD(seed, 'K'),
    WEFT_PY_FIELD(optimizer, 'e'),      WEFT_PY_FIELD(lr, 'd'),
    WEFT_PY_FIELD(momentum, 'd'),       WEFT_PY_FIELD(weight_decay, 'd'),
    WEFT_PY_FIELD(loss, 'e'),           WEFT_PY_FIELD(name, 'z'),
    WEFT_PY_FIELD(decentralized, 'b'),
};
#undef WEFT_PY_FIELD
#define WEFT_PY_TRAINER_FIELDS (sizeof(weft_py_trainer_fields) / sizeof(weft_py_trainer_fields[0]))
%}
/* A dict of the options to set by name ({"alpha": 0.5}); the others keep the library's
 * defaults (weft_pipe_trainer_options_init). None: all defaults. */
%typemap(in) const weft_pipe_trainer_options* options (weft_pipe_trainer_options opts) {
  weft_status init = weft_pipe_trainer_options_init(&opts, WEFT_PIPE_TRAINER_OPTIONS_VERSION);
  if (init != WEFT_OK) {
    weft_py_raise(init);
    SWIG_fail;
  }
  if (weft_py_set_options($input, &opts, weft_py_trainer_fields, WEFT_PY_TRAINER_FIELDS,
                          "Trainer") != 0) SWIG_fail;
  $1 = &opts;
}
%nothread weft_py_trainer_defaults; /* it builds Python objects: it keeps the GIL */
%inline %{
/* The library's default trainer options, as a dict (enums as their ints). */
PyObject* weft_py_trainer_defaults(void) {
  weft_pipe_trainer_options opts;
  weft_status status = weft_pipe_trainer_options_init(&opts, WEFT_PIPE_TRAINER_OPTIONS_VERSION);
  if (status != WEFT_OK) {
    weft_py_raise(status);
    return NULL;
  }
  return weft_py_get_options(&opts, weft_py_trainer_fields, WEFT_PY_TRAINER_FIELDS);
}
%}
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
