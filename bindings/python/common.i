/* What the two SWIG modules of the Python package share: weft.lowlevel (weft.h) and
 * weft.trainer_lowlevel (trainer.h, loaded only when a trainer is made). Each module keeps
 * its own error factory (the package registers the same one in both). A module defines
 * WEFT_PY_ON_CALL (a statement run after every call returning a weft_status) before
 * including this file. */

%{
#include <Python.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
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

/* Option structs cross by keyword: the struct starts from the library's defaults (its
 * weft_*_options_init), and a dict sets the fields it names, through a table of the
 * struct's fields. So Python never repeats a default, and a field added to a struct is one
 * line in its table. Kinds: 'i' int, 'e' an enum (int-sized), 'b' a flag (int, from any
 * truth value), 'd' double, 'L' int64_t, 'K' uint64_t, 'I' unsigned int, 'z' const char*
 * (None: NULL; the str must outlive the call, which the dict's reference sees to). */
typedef struct weft_py_option {
  const char* name;
  char kind;
  size_t offset;
} weft_py_option;

static int weft_py_set_option(char* base, const weft_py_option* f, PyObject* value,
                              const char* what) {
  char* at = base + f->offset;
  switch (f->kind) {
    case 'b': {
      int flag = PyObject_IsTrue(value);
      if (flag < 0) return -1;
      memcpy(at, &flag, sizeof(int));
      return 0;
    }
    case 'i':
    case 'e': {
      long v = PyLong_AsLong(value);
      if (v == -1 && PyErr_Occurred()) return -1;
      if (v < INT_MIN || v > INT_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s: %s = %ld does not fit an int", what, f->name, v);
        return -1;
      }
      int i = (int)v;
      memcpy(at, &i, sizeof(int));
      return 0;
    }
    case 'I': {
      unsigned long v = PyLong_AsUnsignedLong(value);
      if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
      if (v > UINT_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s: %s = %lu does not fit an unsigned int", what,
                     f->name, v);
        return -1;
      }
      unsigned int u = (unsigned int)v;
      memcpy(at, &u, sizeof(u));
      return 0;
    }
    case 'd': {
      double d = PyFloat_AsDouble(value);
      if (d == -1.0 && PyErr_Occurred()) return -1;
      memcpy(at, &d, sizeof(d));
      return 0;
    }
    case 'L': {
      long long v = PyLong_AsLongLong(value);
      if (v == -1 && PyErr_Occurred()) return -1;
      int64_t i = (int64_t)v;
      memcpy(at, &i, sizeof(i));
      return 0;
    }
    case 'K': {
      unsigned long long v = PyLong_AsUnsignedLongLong(value);
      if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
      uint64_t u = (uint64_t)v;
      memcpy(at, &u, sizeof(u));
      return 0;
    }
    case 'z': {
      const char* text = NULL;
      if (value != Py_None) {
        text = PyUnicode_AsUTF8(value);
        if (text == NULL) return -1;
      }
      memcpy(at, &text, sizeof(text));
      return 0;
    }
  }
  PyErr_Format(PyExc_SystemError, "%s: option %s has an unknown kind", what, f->name);
  return -1;
}

/* Sets the fields `given` (a dict, or None for none) names; an unknown name is a
 * TypeError naming it. -1 with a Python error set on failure. */
static int weft_py_set_options(PyObject* given, void* options, const weft_py_option* fields,
                               size_t count, const char* what) {
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  if (given == Py_None) return 0;
  if (!PyDict_Check(given)) {
    PyErr_Format(PyExc_TypeError, "%s: options must be a dict, got %s", what,
                 Py_TYPE(given)->tp_name);
    return -1;
  }
  while (PyDict_Next(given, &pos, &key, &value)) {
    const char* name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
    size_t k;
    if (name == NULL) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "%s: option names are strings", what);
      return -1;
    }
    for (k = 0; k < count && strcmp(fields[k].name, name) != 0; ++k) {
    }
    if (k == count) {
      PyErr_Format(PyExc_TypeError, "%s: unknown option '%s'", what, name);
      return -1;
    }
    if (weft_py_set_option((char*)options, &fields[k], value, what) != 0) return -1;
  }
  return 0;
}

/* The struct's fields as a dict (enums as ints, strings as str or None). */
static PyObject* weft_py_get_options(const void* options, const weft_py_option* fields,
                                     size_t count) {
  PyObject* out = PyDict_New();
  size_t k;
  if (out == NULL) return NULL;
  for (k = 0; k < count; ++k) {
    const char* at = (const char*)options + fields[k].offset;
    PyObject* value = NULL;
    int i;
    unsigned int u;
    double d;
    int64_t l;
    uint64_t q;
    const char* text;
    switch (fields[k].kind) {
      case 'b': memcpy(&i, at, sizeof(i)); value = PyBool_FromLong(i); break;
      case 'i':
      case 'e': memcpy(&i, at, sizeof(i)); value = PyLong_FromLong(i); break;
      case 'I': memcpy(&u, at, sizeof(u)); value = PyLong_FromUnsignedLong(u); break;
      case 'd': memcpy(&d, at, sizeof(d)); value = PyFloat_FromDouble(d); break;
      case 'L': memcpy(&l, at, sizeof(l)); value = PyLong_FromLongLong(l); break;
      case 'K': memcpy(&q, at, sizeof(q)); value = PyLong_FromUnsignedLongLong(q); break;
      case 'z':
        memcpy(&text, at, sizeof(text));
        if (text == NULL) {
          Py_INCREF(Py_None);
          value = Py_None;
        } else {
          value = PyUnicode_FromString(text);
        }
        break;
    }
    if (value == NULL || PyDict_SetItemString(out, fields[k].name, value) != 0) {
      Py_XDECREF(value);
      Py_DECREF(out);
      return NULL;
    }
    Py_DECREF(value);
  }
  return out;
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
  temp.version = WEFT_PIPE_PLAN_INFO_VERSION;
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
