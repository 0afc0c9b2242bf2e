/* What the two SWIG modules of the Python package share: weft.lowlevel (weft.h) and
 * weft.trainer_lowlevel (trainer.h, loaded only when a trainer is made). Each module keeps
 * its own error factory (the package registers the same one in both). A module defines
 * WEFT_PY_ON_CALL (a statement run after every call returning a weft_status) before
 * including this file. */

%{
#include <Python.h>
#include <weft/weft.h>

static PyObject* weft_py_error_factory = NULL;

/* Raises the exception for `status` (and the calling thread's last weft error). */
static void weft_py_raise(weft_status status) {
  const char* message = weft_last_error();
  if (weft_py_error_factory != NULL) {
    PyObject* error = PyObject_CallFunction(weft_py_error_factory, "is", (int)status, message);
    if (error != NULL) {
      PyErr_SetObject((PyObject*)Py_TYPE(error), error);
      Py_DECREF(error);
      return;
    }
    return; /* the factory raised */
  }
  PyErr_Format(PyExc_RuntimeError, "weft error %d: %s", (int)status, message);
}

/* A borrowed DLTensor from a DLPack capsule (still named "dltensor": not consumed). */
static DLTensor* weft_py_tensor(PyObject* capsule, const char* argument) {
  DLManagedTensor* managed;
  if (!PyCapsule_IsValid(capsule, "dltensor")) {
    PyErr_Format(PyExc_TypeError,
                 "%s: expected a DLPack capsule named 'dltensor' (from x.__dlpack__()), got %s",
                 argument, Py_TYPE(capsule)->tp_name);
    return NULL;
  }
  managed = (DLManagedTensor*)PyCapsule_GetPointer(capsule, "dltensor");
  return managed == NULL ? NULL : &managed->dl_tensor;
}
%}

/* ---- status: raise on failure ---------------------------------------------------------- */
%typemap(out) weft_status {
  WEFT_PY_ON_CALL;
  if ($1 != WEFT_OK) {
    weft_py_raise($1);
    SWIG_fail;
  }
  $result = Py_None;
  Py_INCREF(Py_None);
}
/* weft_status_string takes the code as an int. */
%typemap(in) weft_status status {
  $1 = (weft_status)PyLong_AsLong($input);
  if (PyErr_Occurred()) SWIG_fail;
}

/* ---- created objects ----------------------------------------------------------------------- */
%define WEFT_OUT_HANDLE(TYPE, NAME)
%typemap(in, numinputs=0) TYPE** NAME (TYPE* temp = NULL) { $1 = &temp; }
%typemap(argout) TYPE** NAME {
  $result = SWIG_Python_AppendOutput($result, SWIG_NewPointerObj(*$1, $*1_descriptor, 0));
}
%enddef

/* A rank's role: (replica, stage), -1 for an idle rank. */
%typemap(in, numinputs=0) int* replica (int temp = -1), int* stage (int temp = -1) {
  $1 = &temp;
}
%typemap(argout) int* replica, int* stage {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromLong((long)*$1));
}

/* The plan's info as a tuple (frozen, k, replicas, micro_batches, world, m0, max_cost). */
%typemap(in, numinputs=0) weft_pipe_plan_info* info (weft_pipe_plan_info temp) {
  memset(&temp, 0, sizeof(temp));
  $1 = &temp;
}
%typemap(argout) weft_pipe_plan_info* info {
  $result = SWIG_Python_AppendOutput(
      $result, Py_BuildValue("(iiiiidd)", $1->frozen, $1->k, $1->replicas, $1->micro_batches,
                             $1->world, $1->m0, $1->max_cost));
}
%ignore weft_pipe_plan_info;

%nothread weft_py_set_error_factory;
%inline %{
/* Registers the callable (status, message) -> exception used for every failed call. */
void weft_py_set_error_factory(PyObject* factory) {
  Py_XINCREF(factory);
  Py_XDECREF(weft_py_error_factory);
  weft_py_error_factory = factory;
}
%}
