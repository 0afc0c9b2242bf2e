/* SWIG interface: the low-level Python module weft.lowlevel over weft's C ABI.
 *
 * Every function of capi/include/weft/weft.h is wrapped as is, with typemaps that make it
 * callable from Python:
 *  - a weft_status other than WEFT_OK raises the exception built by the factory the
 *    package registers (weft.WeftError subclasses), with weft_last_error() as message;
 *  - out-parameters become return values (pointers, ints, doubles, strings, rank lists);
 *  - DLTensor arguments take DLPack capsules ("dltensor"), borrowed for the call; a
 *    blocking op's `out` may be None, and the call returns the output it allocated;
 *  - library-allocated results come back as DLPack capsules that own them;
 *  - option structs are built from plain tuples (the package's functions make them).
 * With -threads, every call releases the GIL while weft runs. */
%module(package="weft") lowlevel

%{
#include <pthread.h>
#include <stdlib.h>

/* How many calls returning a weft_status this thread has made, allocations aside
 * (weft_py_calls). */
static __thread unsigned long weft_py_call_count = 0;
#define WEFT_PY_ON_CALL ++weft_py_call_count
%}
%include "common.i"

%{
/* Capsule destructor for results weft allocated: frees them unless a consumer (NumPy,
 * torch) took ownership, which renames the capsule "used_dltensor". */
static void weft_py_capsule_destructor(PyObject* capsule) {
  DLManagedTensor* managed;
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  managed = (DLManagedTensor*)PyCapsule_GetPointer(capsule, "dltensor");
  if (managed != NULL && managed->deleter != NULL) managed->deleter(managed);
}

/* References released by threads that do not hold the GIL, until a thread that holds it
 * drops them (weft_py_drain). weft's engine thread releases an op's arrays when it drops
 * the op last (the program dropped its handle, or freed it while the engine still held
 * it), and must never wait for the GIL there: it would hold up every rank's ops until
 * Python let the GIL go, up to the interpreter's switch interval (5 ms) each time (100
 * dropped handles on one rank while it ran Python code cost the other rank's matching
 * allreduces 3.8 ms each). */
static pthread_mutex_t weft_py_released_mu = PTHREAD_MUTEX_INITIALIZER;
static PyObject** weft_py_released = NULL;
static size_t weft_py_released_count = 0; /* read unlocked as a hint (__atomic) */
static size_t weft_py_released_capacity = 0;
static int weft_py_drain_pending = 0;

/* Drops the references released without the GIL; the caller holds it. `pending`: called
 * as the pending call weft_py_queue scheduled (a later release schedules another). */
static int weft_py_drain(void* pending) {
  PyObject** owners;
  size_t n, i;
  pthread_mutex_lock(&weft_py_released_mu);
  owners = weft_py_released;
  n = weft_py_released_count;
  weft_py_released = NULL;
  __atomic_store_n(&weft_py_released_count, 0, __ATOMIC_RELAXED);
  weft_py_released_capacity = 0;
  if (pending != NULL) weft_py_drain_pending = 0;
  pthread_mutex_unlock(&weft_py_released_mu);
  for (i = 0; i < n; ++i) Py_DECREF(owners[i]);
  free(owners);
  return 0;
}

/* Release function for weft_request_keep_alive: drops the reference the request held, at
 * once where this thread holds the GIL, otherwise at the next drain: a call Python runs
 * soon in its main thread (Py_AddPendingCall), or the next op started from Python
 * (weft_py_arm), whichever comes first. During interpreter shutdown the reference is left
 * alone (the process is ending). */
static void weft_py_queue(PyObject* owner);

static void weft_py_release(void* owner) {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
  if (PyGILState_Check()) {
    Py_DECREF((PyObject*)owner);
    return;
  }
  weft_py_queue((PyObject*)owner);
}

/* Queues `owner` for the next drain (see above); any thread, with or without the GIL. */
static void weft_py_queue(PyObject* owner) {
  int schedule;
  pthread_mutex_lock(&weft_py_released_mu);
  if (weft_py_released_count == weft_py_released_capacity) {
    size_t capacity = weft_py_released_capacity > 0 ? 2 * weft_py_released_capacity : 64;
    PyObject** grown = (PyObject**)realloc(weft_py_released, capacity * sizeof(PyObject*));
    if (grown == NULL) {
      /* No memory to defer it: wait for the GIL after all. */
      PyGILState_STATE gil;
      pthread_mutex_unlock(&weft_py_released_mu);
      gil = PyGILState_Ensure();
      Py_DECREF((PyObject*)owner);
      PyGILState_Release(gil);
      return;
    }
    weft_py_released = grown;
    weft_py_released_capacity = capacity;
  }
  weft_py_released[weft_py_released_count] = (PyObject*)owner;
  __atomic_store_n(&weft_py_released_count, weft_py_released_count + 1, __ATOMIC_RELAXED);
  schedule = !weft_py_drain_pending;
  weft_py_drain_pending = 1;
  pthread_mutex_unlock(&weft_py_released_mu);
  /* A full queue of pending calls leaves the drain to the next weft_py_arm. */
  if (schedule && Py_AddPendingCall(weft_py_drain, (void*)1) != 0) {
    pthread_mutex_lock(&weft_py_released_mu);
    weft_py_drain_pending = 0;
    pthread_mutex_unlock(&weft_py_released_mu);
  }
}

/* The keep-alive list the Python layer armed (weft_py_arm) for the next request this thread
 * starts; the typemap of weft_request** below ties it to that request. */
static __thread PyObject* weft_py_armed = NULL;

/* Queues the list still armed, if any, for release: its call started nothing. Not dropped
 * here: the drop could run finalizers that start ops of their own. */
static void weft_py_disarm(void) {
  PyObject* stale = weft_py_armed;
  weft_py_armed = NULL;
  if (stale != NULL) weft_py_queue(stale);
}

static int weft_py_int_list(PyObject* list, int** out, size_t* n, const char* what) {
  Py_ssize_t i, len;
  PyObject* seq = PySequence_Fast(list, what);
  if (seq == NULL) return -1;
  len = PySequence_Fast_GET_SIZE(seq);
  *out = (int*)PyMem_Malloc(sizeof(int) * (len > 0 ? (size_t)len : 1));
  *n = (size_t)len;
  for (i = 0; i < len; ++i) {
    long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return -1;
    }
    (*out)[i] = (int)v;
  }
  Py_DECREF(seq);
  return 0;
}

/* A sequence of numbers as a C array (PyMem_Malloc'd; NULL and 0 for None when
 * none_ok). On failure nothing stays allocated and a Python error is set. */
static int weft_py_double_list(PyObject* obj, double** out, size_t* n, int none_ok,
                               const char* what) {
  Py_ssize_t i, len;
  PyObject* seq;
  *out = NULL;
  *n = 0;
  if (none_ok && obj == Py_None) return 0;
  seq = PySequence_Fast(obj, what);
  if (seq == NULL) return -1;
  len = PySequence_Fast_GET_SIZE(seq);
  *out = (double*)PyMem_Malloc(sizeof(double) * (len > 0 ? (size_t)len : 1));
  if (*out == NULL) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return -1;
  }
  for (i = 0; i < len; ++i) {
    double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
    if (v == -1.0 && PyErr_Occurred()) {
      Py_DECREF(seq);
      PyMem_Free(*out);
      *out = NULL;
      return -1;
    }
    (*out)[i] = v;
  }
  *n = (size_t)len;
  Py_DECREF(seq);
  return 0;
}

/* A {rank: weight} dict (or a list of ranks, weight 1 each) as two arrays. */
static int weft_py_weight_map(PyObject* obj, int** ranks, double** weights, size_t* n,
                              const char* what) {
  Py_ssize_t pos = 0, i = 0;
  PyObject *key, *value;
  if (!PyDict_Check(obj)) {
    if (weft_py_int_list(obj, ranks, n, what) < 0) return -1;
    *weights = NULL;
    return 0;
  }
  *n = (size_t)PyDict_Size(obj);
  *ranks = (int*)PyMem_Malloc(sizeof(int) * (*n > 0 ? *n : 1));
  *weights = (double*)PyMem_Malloc(sizeof(double) * (*n > 0 ? *n : 1));
  while (PyDict_Next(obj, &pos, &key, &value)) {
    long r = PyLong_AsLong(key);
    double w = PyFloat_AsDouble(value);
    if (PyErr_Occurred()) return -1;
    (*ranks)[i] = (int)r;
    (*weights)[i] = w;
    ++i;
  }
  return 0;
}
%}

%init %{
%}

/* ---- tensors ------------------------------------------------------------------------------ */
/* A blocking op's `out` may be None: the call then allocates the output like its `in`
 * (weft_tensor_empty_like) and returns it as a capsule: one call into weft instead of two
 * (the package's out-of-place ops on torch tensors and large NumPy arrays). A call that
 * starts a request needs its output held by the request (weft_py_arm) before it
 * starts, so there `out` must be a capsule. The `in` typemap tells the `out` one (which
 * runs after it: `in` comes first in every signature) what to allocate like. */
%{
static __thread const DLTensor* weft_py_like = NULL;
static __thread int weft_py_starts_request = 0;
%}
%typemap(in) const DLTensor* in {
  $1 = weft_py_tensor($input, "in");
  if ($1 == NULL) SWIG_fail;
  weft_py_like = weft_py_starts_request ? NULL : $1;
}
%typemap(freearg) const DLTensor* in { weft_py_like = NULL; }
%typemap(in) const DLTensor* like {
  $1 = weft_py_tensor($input, "like");
  if ($1 == NULL) SWIG_fail;
}
%typemap(in) DLTensor* x {
  $1 = weft_py_tensor($input, "x");
  if ($1 == NULL) SWIG_fail;
}
%typemap(in) DLTensor* out (DLManagedTensor* made = NULL) {
  if ($input == Py_None && weft_py_like != NULL) {
    weft_status allocated = weft_tensor_empty_like(&made, weft_py_like);
    if (allocated != WEFT_OK) {
      weft_py_raise(allocated);
      SWIG_fail;
    }
    $1 = &made->dl_tensor;
  } else {
    $1 = weft_py_tensor($input, "out");
    if ($1 == NULL) SWIG_fail;
  }
}
%typemap(argout) DLTensor* out {
  if (made$argnum != NULL) {
    PyObject* capsule = PyCapsule_New(made$argnum, "dltensor", weft_py_capsule_destructor);
    if (capsule == NULL) SWIG_fail;
    made$argnum = NULL; /* the capsule owns it */
    $result = SWIG_Python_AppendOutput($result, capsule);
  }
}
/* A failed call frees the output it allocated. */
%typemap(freearg) DLTensor* out {
  if (made$argnum != NULL) made$argnum->deleter(made$argnum);
}
%typemap(in, numinputs=0) DLManagedTensor** out (DLManagedTensor* temp = NULL) {
  $1 = &temp;
}
%typemap(argout) DLManagedTensor** out {
  PyObject* capsule = PyCapsule_New(*$1, "dltensor", weft_py_capsule_destructor);
  if (capsule == NULL) {
    (*$1)->deleter(*$1);
    SWIG_fail;
  }
  $result = SWIG_Python_AppendOutput($result, capsule);
}

/* ---- created objects ----------------------------------------------------------------------- */
WEFT_OUT_HANDLE(weft_topology, out)
WEFT_OUT_HANDLE(weft_schedule, out)
/* A started request takes the list armed for it before the call returns to Python, where
 * an exception arriving first (a KeyboardInterrupt) would otherwise leave the op running
 * with nothing keeping its arrays alive. */
%typemap(in, numinputs=0) weft_request** request (weft_request* temp = NULL) {
  $1 = &temp;
  weft_py_starts_request = 1;
}
%typemap(argout) weft_request** request {
  if (*$1 != NULL && weft_py_armed != NULL) {
    PyObject* keep = weft_py_armed;
    weft_py_armed = NULL;
    if (weft_request_keep_alive(*$1, keep, weft_py_release) != WEFT_OK) Py_DECREF(keep);
  }
  $result = SWIG_Python_AppendOutput($result, SWIG_NewPointerObj(*$1, $*1_descriptor, 0));
}
/* A call that failed started nothing: its list is not left armed for another request. */
%typemap(freearg) weft_request** request {
  weft_py_disarm();
  weft_py_starts_request = 0;
}
WEFT_OUT_HANDLE(weft_step_counter, counter)
WEFT_OUT_HANDLE(weft_pipe_plan, plan)

/* ---- scalar out-parameters ---------------------------------------------------------------- */
%typemap(in, numinputs=0) int* done (int temp = 0), int* result (int temp = 0) { $1 = &temp; }
%typemap(argout) int* done, int* result {
  $result = SWIG_Python_AppendOutput($result, PyBool_FromLong(*$1));
}
%typemap(in, numinputs=0) double* weight (double temp = 0) { $1 = &temp; }
%typemap(argout) double* weight {
  $result = SWIG_Python_AppendOutput($result, PyFloat_FromDouble(*$1));
}
%typemap(in, numinputs=0) const char** value (const char* temp = NULL) { $1 = ($1_ltype)&temp; }
%typemap(argout) const char** value {
  $result = SWIG_Python_AppendOutput($result, PyUnicode_FromString(*$1));
}

/* ---- arrays: Python passes the capacity, gets a list ------------------------------------ */
%typemap(in) (int* ranks, size_t capacity, size_t* count) (size_t n = 0) {
  $2 = (size_t)PyLong_AsSize_t($input);
  if (PyErr_Occurred()) SWIG_fail;
  $1 = (int*)PyMem_Malloc(sizeof(int) * ($2 > 0 ? $2 : 1));
  $3 = &n;
}
%typemap(argout) (int* ranks, size_t capacity, size_t* count) {
  size_t i;
  PyObject* list = PyList_New((Py_ssize_t)*$3);
  for (i = 0; i < *$3; ++i) PyList_SET_ITEM(list, (Py_ssize_t)i, PyLong_FromLong($1[i]));
  $result = SWIG_Python_AppendOutput($result, list);
}
%typemap(freearg) (int* ranks, size_t capacity, size_t* count) { PyMem_Free($1); }

%typemap(in) (double* weights, size_t capacity, size_t* count) (size_t n = 0) {
  $2 = (size_t)PyLong_AsSize_t($input);
  if (PyErr_Occurred()) SWIG_fail;
  $1 = (double*)PyMem_Malloc(sizeof(double) * ($2 > 0 ? $2 : 1));
  $3 = &n;
}
%typemap(argout) (double* weights, size_t capacity, size_t* count) {
  size_t i;
  PyObject* list = PyList_New((Py_ssize_t)*$3);
  for (i = 0; i < *$3; ++i) PyList_SET_ITEM(list, (Py_ssize_t)i, PyFloat_FromDouble($1[i]));
  $result = SWIG_Python_AppendOutput($result, list);
}
%typemap(freearg) (double* weights, size_t capacity, size_t* count) { PyMem_Free($1); }

/* recv/send weights: capacity in, (self_weight, {rank: weight}) out. */
%typemap(in) (double* self_weight, int* ranks, double* weights, size_t capacity,
              size_t* count) (double self = 0, size_t n = 0) {
  $4 = (size_t)PyLong_AsSize_t($input);
  if (PyErr_Occurred()) SWIG_fail;
  $1 = &self;
  $2 = (int*)PyMem_Malloc(sizeof(int) * ($4 > 0 ? $4 : 1));
  $3 = (double*)PyMem_Malloc(sizeof(double) * ($4 > 0 ? $4 : 1));
  $5 = &n;
}
%typemap(argout) (double* self_weight, int* ranks, double* weights, size_t capacity,
                  size_t* count) {
  size_t i;
  PyObject* map = PyDict_New();
  PyObject* pair;
  for (i = 0; i < *$5; ++i) {
    PyObject* k = PyLong_FromLong($2[i]);
    PyObject* v = PyFloat_FromDouble($3[i]);
    PyDict_SetItem(map, k, v);
    Py_DECREF(k);
    Py_DECREF(v);
  }
  pair = Py_BuildValue("(dN)", *$1, map);
  $result = SWIG_Python_AppendOutput($result, pair);
}
%typemap(freearg) (double* self_weight, int* ranks, double* weights, size_t capacity,
                   size_t* count) {
  PyMem_Free($2);
  PyMem_Free($3);
}

/* A dense weight matrix: any C-contiguous float64 buffer (the package checks its shape). */
%typemap(in) const double* weights (Py_buffer view, int have_view = 0) {
  if (PyObject_GetBuffer($input, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) SWIG_fail;
  have_view = 1;
  if (view.format == NULL || strcmp(view.format, "d") != 0) {
    PyErr_SetString(PyExc_TypeError, "weights must be a C-contiguous float64 buffer");
    SWIG_fail;
  }
  $1 = (double*)view.buf;
}
%typemap(freearg) const double* weights {
  if (have_view$argnum) PyBuffer_Release(&view$argnum);
}

/* ---- option structs from tuples (None: the defaults) ------------------------------------ */
/* (self_weight or None, src_weights dict or None, dst_weights dict/list or None,
 *  enable_topo_check) */
%typemap(in) const weft_neighbor_allreduce_options* options
    (weft_neighbor_allreduce_options opts = WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_INIT,
     int* src = NULL, double* src_w = NULL, int* dst = NULL, double* dst_w = NULL) {
  PyObject *self_weight, *src_weights, *dst_weights;
  int topo_check = 1;
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    if (!PyArg_ParseTuple($input, "OOOp", &self_weight, &src_weights, &dst_weights, &topo_check)) SWIG_fail;
    if (self_weight != Py_None || src_weights != Py_None) {
      opts.has_weights = 1;
      opts.self_weight = self_weight == Py_None ? 1.0 : PyFloat_AsDouble(self_weight);
      if (PyErr_Occurred()) SWIG_fail;
      if (src_weights != Py_None &&
          weft_py_weight_map(src_weights, &src, &src_w, &opts.num_src, "src_weights") < 0) SWIG_fail;
      /* A rank list without weights cannot stand for src_weights. */
      if (src_weights != Py_None && src_w == NULL && opts.num_src > 0) {
        PyErr_SetString(PyExc_TypeError, "src_weights must be a dict {rank: weight}");
        SWIG_fail;
      }
      opts.src_ranks = src;
      opts.src_weights = src_w;
      if (src_weights == Py_None) {
        PyErr_SetString(PyExc_ValueError,
                        "neighbor_allreduce: self_weight and src_weights go together: pass both or neither");
        SWIG_fail;
      }
      if (self_weight == Py_None) {
        PyErr_SetString(PyExc_ValueError,
                        "neighbor_allreduce: self_weight and src_weights go together: pass both or neither");
        SWIG_fail;
      }
    }
    if (dst_weights != Py_None) {
      opts.has_dst = 1;
      if (weft_py_weight_map(dst_weights, &dst, &dst_w, &opts.num_dst, "dst_weights") < 0) SWIG_fail;
      opts.dst_ranks = dst;
      opts.dst_weights = dst_w;
    }
    opts.enable_topo_check = topo_check;
    $1 = &opts;
  }
}
%typemap(freearg) const weft_neighbor_allreduce_options* options {
  PyMem_Free(src$argnum);
  PyMem_Free(src_w$argnum);
  PyMem_Free(dst$argnum);
  PyMem_Free(dst_w$argnum);
}

/* (src_ranks, dst_ranks) */
%typemap(in) const weft_neighbor_allgather_options* options
    (weft_neighbor_allgather_options opts = WEFT_NEIGHBOR_ALLGATHER_OPTIONS_INIT,
     int* src = NULL, int* dst = NULL) {
  PyObject *src_ranks, *dst_ranks;
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    if (!PyArg_ParseTuple($input, "OO", &src_ranks, &dst_ranks)) SWIG_fail;
    opts.has_ranks = 1;
    if (weft_py_int_list(src_ranks, &src, &opts.num_src, "src_ranks must be a list of ranks") < 0) SWIG_fail;
    if (weft_py_int_list(dst_ranks, &dst, &opts.num_dst, "dst_ranks must be a list of ranks") < 0) SWIG_fail;
    opts.src_ranks = src;
    opts.dst_ranks = dst;
    $1 = &opts;
  }
}
%typemap(freearg) const weft_neighbor_allgather_options* options {
  PyMem_Free(src$argnum);
  PyMem_Free(dst$argnum);
}

/* (self_weight or None, src_machine_weights dict or None, dst_machine_weights or None) */
%typemap(in) const weft_hierarchical_options* options
    (weft_hierarchical_options opts = WEFT_HIERARCHICAL_OPTIONS_INIT,
     int* src = NULL, double* src_w = NULL, int* dst = NULL, double* dst_w = NULL) {
  PyObject *self_weight, *src_weights, *dst_weights;
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    if (!PyArg_ParseTuple($input, "OOO", &self_weight, &src_weights, &dst_weights)) SWIG_fail;
    if ((self_weight == Py_None) != (src_weights == Py_None)) {
      PyErr_SetString(PyExc_ValueError,
                      "hierarchical_neighbor_allreduce: self_weight and src_machine_weights go "
                      "together: pass both or neither");
      SWIG_fail;
    }
    if (self_weight != Py_None) {
      opts.has_weights = 1;
      opts.self_weight = PyFloat_AsDouble(self_weight);
      if (PyErr_Occurred()) SWIG_fail;
      if (weft_py_weight_map(src_weights, &src, &src_w, &opts.num_src, "src_machine_weights") < 0) SWIG_fail;
      if (src_w == NULL && opts.num_src > 0) {
        PyErr_SetString(PyExc_TypeError, "src_machine_weights must be a dict {machine: weight}");
        SWIG_fail;
      }
      opts.src_machines = src;
      opts.src_machine_weights = src_w;
    }
    if (dst_weights != Py_None) {
      opts.has_dst = 1;
      if (weft_py_weight_map(dst_weights, &dst, &dst_w, &opts.num_dst, "dst_machine_weights") < 0) SWIG_fail;
      opts.dst_machines = dst;
      opts.dst_machine_weights = dst_w;
    }
    $1 = &opts;
  }
}
%typemap(freearg) const weft_hierarchical_options* options {
  PyMem_Free(src$argnum);
  PyMem_Free(src_w$argnum);
  PyMem_Free(dst$argnum);
  PyMem_Free(dst_w$argnum);
}

/* (zero_init, transport or None) */
%typemap(in) const weft_win_create_options* options
    (weft_win_create_options opts = WEFT_WIN_CREATE_OPTIONS_INIT) {
  int zero_init = 0;
  const char* transport = NULL;
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    if (!PyArg_ParseTuple($input, "pz", &zero_init, &transport)) SWIG_fail;
    opts.zero_init = zero_init;
    opts.transport = transport;
    $1 = &opts;
  }
}

/* Window options: (self_weight, dst_weights dict/list or None, require_mutex) */
%typemap(in) const weft_win_put_options* options
    (weft_win_put_options opts = WEFT_WIN_PUT_OPTIONS_INIT, int* dst = NULL, double* dst_w = NULL) {
  PyObject *self_weight, *dst_weights;
  int require_mutex = 0;
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    if (!PyArg_ParseTuple($input, "OOp", &self_weight, &dst_weights, &require_mutex)) SWIG_fail;
    if (self_weight != Py_None) {
      opts.self_weight = PyFloat_AsDouble(self_weight);
      if (PyErr_Occurred()) SWIG_fail;
    }
    if (dst_weights != Py_None) {
      opts.has_dst = 1;
      if (weft_py_weight_map(dst_weights, &dst, &dst_w, &opts.num_dst, "dst_weights") < 0) SWIG_fail;
      opts.dst_ranks = dst;
      opts.dst_weights = dst_w;
    }
    opts.require_mutex = require_mutex;
    $1 = &opts;
  }
}
%typemap(freearg) const weft_win_put_options* options {
  PyMem_Free(dst$argnum);
  PyMem_Free(dst_w$argnum);
}

/* (src_weights dict/list or None, require_mutex) */
%typemap(in) const weft_win_get_options* options
    (weft_win_get_options opts = WEFT_WIN_GET_OPTIONS_INIT, int* src = NULL, double* src_w = NULL) {
  PyObject* src_weights;
  int require_mutex = 0;
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    if (!PyArg_ParseTuple($input, "Op", &src_weights, &require_mutex)) SWIG_fail;
    if (src_weights != Py_None) {
      opts.has_src = 1;
      if (weft_py_weight_map(src_weights, &src, &src_w, &opts.num_src, "src_weights") < 0) SWIG_fail;
      opts.src_ranks = src;
      opts.src_weights = src_w;
    }
    opts.require_mutex = require_mutex;
    $1 = &opts;
  }
}
%typemap(freearg) const weft_win_get_options* options {
  PyMem_Free(src$argnum);
  PyMem_Free(src_w$argnum);
}

/* (self_weight or None, neighbor_weights dict or None, reset, require_mutex) */
%typemap(in) const weft_win_update_options* options
    (weft_win_update_options opts = WEFT_WIN_UPDATE_OPTIONS_INIT, int* nbr = NULL, double* nbr_w = NULL) {
  PyObject *self_weight, *neighbor_weights;
  int reset = 0, require_mutex = 0;
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    if (!PyArg_ParseTuple($input, "OOpp", &self_weight, &neighbor_weights, &reset, &require_mutex)) SWIG_fail;
    if ((self_weight == Py_None) != (neighbor_weights == Py_None)) {
      PyErr_SetString(PyExc_ValueError,
                      "win_update: self_weight and neighbor_weights go together: pass both or neither");
      SWIG_fail;
    }
    if (self_weight != Py_None) {
      opts.has_weights = 1;
      opts.self_weight = PyFloat_AsDouble(self_weight);
      if (PyErr_Occurred()) SWIG_fail;
      if (weft_py_weight_map(neighbor_weights, &nbr, &nbr_w, &opts.num_neighbors, "neighbor_weights") < 0) SWIG_fail;
      if (nbr_w == NULL && opts.num_neighbors > 0) {
        PyErr_SetString(PyExc_TypeError, "neighbor_weights must be a dict {rank: weight}");
        SWIG_fail;
      }
      opts.neighbor_ranks = nbr;
      opts.neighbor_weights = nbr_w;
    }
    opts.reset = reset;
    opts.require_mutex = require_mutex;
    $1 = &opts;
  }
}
%typemap(freearg) const weft_win_update_options* options {
  PyMem_Free(nbr$argnum);
  PyMem_Free(nbr_w$argnum);
}

/* win_version: capacity in, {rank: version} out. */
%typemap(in) (int* ranks, int64_t* versions, size_t capacity, size_t* count) (size_t n = 0) {
  $3 = (size_t)PyLong_AsSize_t($input);
  if (PyErr_Occurred()) SWIG_fail;
  $1 = (int*)PyMem_Malloc(sizeof(int) * ($3 > 0 ? $3 : 1));
  $2 = (int64_t*)PyMem_Malloc(sizeof(int64_t) * ($3 > 0 ? $3 : 1));
  $4 = &n;
}
%typemap(argout) (int* ranks, int64_t* versions, size_t capacity, size_t* count) {
  size_t i;
  PyObject* map = PyDict_New();
  for (i = 0; i < *$4; ++i) {
    PyObject* k = PyLong_FromLong($1[i]);
    PyObject* v = PyLong_FromLongLong((long long)$2[i]);
    PyDict_SetItem(map, k, v);
    Py_DECREF(k);
    Py_DECREF(v);
  }
  $result = SWIG_Python_AppendOutput($result, map);
}
%typemap(freearg) (int* ranks, int64_t* versions, size_t capacity, size_t* count) {
  PyMem_Free($1);
  PyMem_Free($2);
}

/* ---- the step counter ----------------------------------------------------------------- */
/* The event as its int value (weft_computation_event); *communicate as a bool. */
%typemap(in, numinputs=0) weft_computation_event* event (weft_computation_event temp = WEFT_COMPUTATION_IGNORED) {
  $1 = &temp;
}
%typemap(argout) weft_computation_event* event {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromLong((long)*$1));
}
%typemap(in, numinputs=0) int* communicate (int temp = 0) { $1 = &temp; }
%typemap(argout) int* communicate {
  $result = SWIG_Python_AppendOutput($result, PyBool_FromLong(*$1));
}
/* J as a Python int (weft.i does not pull in stdint.i: int64_t is spelled out here). */
%typemap(in) int64_t steps_per_communication {
  $1 = (int64_t)PyLong_AsLongLong($input);
  if (PyErr_Occurred()) SWIG_fail;
}
%typemap(typecheck, precedence=SWIG_TYPECHECK_INT64) int64_t steps_per_communication {
  $1 = PyLong_Check($input) ? 1 : 0;
}
/* int64 out-parameters of the counter; computations gives [total, since_communication]. */
%typemap(in, numinputs=0) int64_t* steps_per_communication (int64_t temp = 0),
                          int64_t* countdown (int64_t temp = 0),
                          int64_t* total (int64_t temp = 0),
                          int64_t* since_communication (int64_t temp = 0) { $1 = &temp; }
%typemap(argout) int64_t* steps_per_communication, int64_t* countdown, int64_t* total,
                 int64_t* since_communication {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromLongLong((long long)*$1));
}

%typemap(in, numinputs=0) double* p (double temp = 0) { $1 = &temp; }
%typemap(argout) double* p {
  $result = SWIG_Python_AppendOutput($result, PyFloat_FromDouble(*$1));
}

/* Rank lists: window mutexes (empty: this rank's own) and process sets (empty: every
 * rank). */
%typemap(in) (const int* ranks, size_t num_ranks) {
  int* rank_array = NULL;
  if (weft_py_int_list($input, &rank_array, &$2, "ranks must be a sequence of ranks") < 0) SWIG_fail;
  $1 = rank_array;
}
%typemap(freearg) (const int* ranks, size_t num_ranks) { PyMem_Free((void*)$1); }

/* ---- pipe: freezing, partitioning, plans ------------------------------------------------ */
/* Scalar results: frozen counts, cycles, a rank's (replica, stage), max cost, bubble. */
%typemap(in, numinputs=0) int* frozen (int temp = 0), int* cycles (int temp = 0) {
  $1 = &temp;
}
%typemap(argout) int* frozen, int* cycles {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromLong((long)*$1));
}
%typemap(in, numinputs=0) double* max_cost (double temp = 0), double* bubble (double temp = 0) {
  $1 = &temp;
}
%typemap(argout) double* bubble {
  $result = SWIG_Python_AppendOutput($result, PyFloat_FromDouble(*$1));
}
/* weft_pipe_partition: its boundaries list is already the result, and AppendOutput would
 * add max_cost to that list; the result is the pair (boundaries, max_cost) instead. */
%typemap(argout) double* max_cost {
  PyObject* pair = Py_BuildValue("(Od)", $result, *$1);
  if (pair == NULL) SWIG_fail;
  Py_DECREF($result);
  $result = pair;
}
/* Arrays out: Python passes the capacity and gets a list, as for ranks and weights. */
%apply (int* ranks, size_t capacity, size_t* count) { (int* boundaries, size_t capacity, size_t* count) };
%apply (double* weights, size_t capacity, size_t* count) { (double* costs, size_t capacity, size_t* count) };
/* Arrays in: any sequence of numbers (grad_norms may be None: NULL, 0). */
%typemap(in) (const double* sizes, size_t num_layers) (double* values = NULL) {
  if (weft_py_double_list($input, &values, &$2, 0, "sizes must be a sequence of numbers") < 0) SWIG_fail;
  $1 = values;
}
%typemap(in) (const double* costs, size_t num_layers) (double* values = NULL) {
  if (weft_py_double_list($input, &values, &$2, 0, "costs must be a sequence of numbers") < 0) SWIG_fail;
  $1 = values;
}
%typemap(in) (const double* grad_norms, size_t num_norms) (double* values = NULL) {
  if (weft_py_double_list($input, &values, &$2, 1, "grad_norms must be a sequence of numbers or None") < 0) SWIG_fail;
  $1 = values;
}
%typemap(freearg) (const double* sizes, size_t num_layers), (const double* costs, size_t num_layers),
                  (const double* grad_norms, size_t num_norms) {
  PyMem_Free((void*)$1);
}
%{
static const weft_py_option weft_py_freeze_fields[] = {
    {"version", 'I', offsetof(weft_pipe_freeze_options, version)},
    {"alpha", 'd', offsetof(weft_pipe_freeze_options, alpha)},
    {"gradient_aware", 'b', offsetof(weft_pipe_freeze_options, gradient_aware)},
    {"freeze_last", 'b', offsetof(weft_pipe_freeze_options, freeze_last)},
};
static const weft_py_option weft_py_plan_fields[] = {
    {"version", 'I', offsetof(weft_pipe_plan_options, version)},
    {"machines", 'i', offsetof(weft_pipe_plan_options, machines)},
    {"devices_per_machine", 'i', offsetof(weft_pipe_plan_options, devices_per_machine)},
    {"k0", 'i', offsetof(weft_pipe_plan_options, k0)},
    {"lambda", 'd', offsetof(weft_pipe_plan_options, lambda)},
    {"strategy", 'e', offsetof(weft_pipe_plan_options, strategy)},
    {"micro_batches", 'i', offsetof(weft_pipe_plan_options, micro_batches)},
};
#define WEFT_PY_COUNT(table) (sizeof(table) / sizeof((table)[0]))
%}
/* Dicts of the options to set by name; the others keep the library's defaults
 * (weft_pipe_*_options_init). None: all defaults. A "version" entry is there only so that
 * the tests can check that a wrong one is refused. */
%typemap(in) const weft_pipe_freeze_options* options (weft_pipe_freeze_options opts) {
  weft_status init = weft_pipe_freeze_options_init(&opts, WEFT_PIPE_FREEZE_OPTIONS_VERSION);
  if (init != WEFT_OK) {
    weft_py_raise(init);
    SWIG_fail;
  }
  if (weft_py_set_options($input, &opts, weft_py_freeze_fields,
                          WEFT_PY_COUNT(weft_py_freeze_fields), "next_frozen") != 0) SWIG_fail;
  $1 = &opts;
}
%typemap(in) const weft_pipe_plan_options* options (weft_pipe_plan_options opts) {
  weft_status init = weft_pipe_plan_options_init(&opts, WEFT_PIPE_PLAN_OPTIONS_VERSION);
  if (init != WEFT_OK) {
    weft_py_raise(init);
    SWIG_fail;
  }
  if (weft_py_set_options($input, &opts, weft_py_plan_fields,
                          WEFT_PY_COUNT(weft_py_plan_fields), "make_plan") != 0) SWIG_fail;
  $1 = &opts;
}
/* They build Python objects: they keep the GIL. */
%nothread weft_py_freeze_defaults;
%nothread weft_py_plan_defaults;
%inline %{
/* The library's default freeze and plan options, as dicts (enums as their ints). */
PyObject* weft_py_freeze_defaults(void) {
  weft_pipe_freeze_options opts;
  weft_status status = weft_pipe_freeze_options_init(&opts, WEFT_PIPE_FREEZE_OPTIONS_VERSION);
  if (status != WEFT_OK) {
    weft_py_raise(status);
    return NULL;
  }
  return weft_py_get_options(&opts, weft_py_freeze_fields, WEFT_PY_COUNT(weft_py_freeze_fields));
}
PyObject* weft_py_plan_defaults(void) {
  weft_pipe_plan_options opts;
  weft_status status = weft_pipe_plan_options_init(&opts, WEFT_PIPE_PLAN_OPTIONS_VERSION);
  if (status != WEFT_OK) {
    weft_py_raise(status);
    return NULL;
  }
  return weft_py_get_options(&opts, weft_py_plan_fields, WEFT_PY_COUNT(weft_py_plan_fields));
}
%}
/* Function pointers do not cross into Python: weft_py_arm below replaces it. */
%ignore weft_request_keep_alive;
/* The option structs themselves are built by the typemaps above. */
%ignore weft_neighbor_allreduce_options;
%ignore weft_neighbor_allgather_options;
%ignore weft_hierarchical_options;
%ignore weft_win_create_options;
%ignore weft_win_put_options;
%ignore weft_win_get_options;
%ignore weft_win_update_options;
%ignore weft_pipe_freeze_options;
%ignore weft_pipe_plan_options;

/* The process model is exposed as is (weft.rank is weft_rank): its docstrings. */
%feature("docstring") weft_rank "This process's rank among all ranks, 0 .. size() - 1; -1 before init().";
%feature("docstring") weft_size "The number of ranks in the job; -1 before init().";
%feature("docstring") weft_local_rank
  "This rank's index among the ranks of its machine; -1 before init().";
%feature("docstring") weft_local_size "The number of ranks on this machine; -1 before init().";
%feature("docstring") weft_machine_rank
  "The index of this rank's machine, machines ordered by their lowest rank; -1 before init().";
%feature("docstring") weft_machine_size "The number of machines in the job; -1 before init().";

/* Allocating an output places no op: it does not count as a call weft saw (weft_py_calls),
 * so an argument error after it is still refused in the op's place. */
%typemap(out) weft_status weft_tensor_empty_like {
  if ($1 != WEFT_OK) {
    weft_py_raise($1);
    SWIG_fail;
  }
  $result = Py_None;
  Py_INCREF(Py_None);
}

%include "weft/weft.h"

/* These touch Python objects: they must keep the GIL (every other call releases it). */
%nothread weft_py_arm;
/* Freeing a request drops the arrays it kept while this thread holds the GIL anyway. */
%nothread weft_request_free;
%nothread weft_py_calls;
%nothread weft_py_array_interface;

%inline %{
/* How many calls returning a weft_status this thread has made, except allocations
 * (weft_tensor_empty_like): a function that sees it unchanged after an exception knows
 * that weft never saw the op. */
unsigned long weft_py_calls(void) { return weft_py_call_count; }

/* NumPy's __array_interface__ for a host tensor in a capsule weft allocated (not yet
 * consumed): a writable view of its memory. np.from_dlpack would make the array read-only
 * (DLPack before 1.0 cannot say that memory may be written). */
PyObject* weft_py_array_interface(PyObject* capsule) {
  DLManagedTensor* managed;
  const DLTensor* t;
  PyObject* shape;
  char typestr[8];
  char kind;
  int32_t i;
  if (!PyCapsule_IsValid(capsule, "dltensor")) {
    PyErr_SetString(PyExc_TypeError, "expected an unconsumed DLPack capsule from weft");
    return NULL;
  }
  managed = (DLManagedTensor*)PyCapsule_GetPointer(capsule, "dltensor");
  t = &managed->dl_tensor;
  switch (t->dtype.code) {
    case kDLInt: kind = 'i'; break;
    case kDLUInt: kind = 'u'; break;
    case kDLFloat: kind = 'f'; break;
    default:
      PyErr_Format(PyExc_TypeError, "NumPy has no dtype for DLPack type code %d",
                   (int)t->dtype.code);
      return NULL;
  }
  PyOS_snprintf(typestr, sizeof typestr, "%c%c%d", t->dtype.bits == 8 ? '|' : '<', kind,
                t->dtype.bits / 8);
  shape = PyTuple_New(t->ndim);
  if (shape == NULL) return NULL;
  for (i = 0; i < t->ndim; ++i) {
    PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong((long long)t->shape[i]));
  }
  return Py_BuildValue("{s:(N,O),s:N,s:s,s:i}", "data",
                       PyLong_FromVoidPtr((char*)t->data + t->byte_offset), Py_False, "shape",
                       shape, "typestr", typestr, "version", 3);
}

/* Arms `keep` (the op's arrays and capsules) for the next request this thread starts: it
 * lives until that op completes and the request is freed. None disarms (before a request
 * that keeps nothing). A list still armed (its call never reached weft) is queued for
 * release (weft_py_disarm). */
void weft_py_arm(PyObject* keep) {
  if (__atomic_load_n(&weft_py_released_count, __ATOMIC_RELAXED) > 0) weft_py_drain(NULL);
  weft_py_disarm();
  if (keep != Py_None) {
    Py_INCREF(keep);
    weft_py_armed = keep;
  }
}
%}
