"""Framework arrays to DLPack capsules and back, without copies where possible.

NumPy arrays and CPU torch.Tensors are recognized directly (results keep the input's type);
anything else that speaks DLPack is viewed as a NumPy array (no copy), and its results come
back as NumPy arrays. A contiguous input is never copied; a non-contiguous one is made contiguous first
(and, for in-place ops, the result is copied back into it)."""

import sys

from . import _errors
from . import lowlevel as _c

_SUPPORTED = "float32, float64, float16, bfloat16 (torch), int32, int64, int16, int8 and uint8"

NUMPY, TORCH = 0, 1


class _Owned:
    """The base of a NumPy array over memory weft allocated: holds the capsule (whose
    destructor gives the memory back to weft) and describes the memory to NumPy as
    writable, which np.from_dlpack would not."""

    __slots__ = ("_capsule", "__array_interface__")

    def __init__(self, capsule):
        self._capsule = capsule
        self.__array_interface__ = _c.weft_py_array_interface(capsule)


# NumPy outputs of at least this many bytes, and every torch output on the host, come from
# weft (weft_tensor_empty_like), which hands out the memory of freed outputs of 64 KiB and
# more again: fresh pages from the system cost a page fault each, and a loop of
# out-of-place ops on large tensors ran 2-4x slower than in place.
_POOLED_BYTES = 64 << 10


def _torch():
    return sys.modules.get("torch")


# torch's DLPack converters, looked up once (`_to_dlpack or _load_dlpack()[0]`: per call,
# the attribute chain, or a call of a function returning them, costs a tenth of a small
# op's time from Python). A capsule goes straight to the converter that
# torch.utils.dlpack.from_dlpack ends in (which first checks whether its argument is an
# array with __dlpack__): 0.1 us less per output.
_to_dlpack = None
_from_capsule_torch = None


def _load_dlpack():
    global _to_dlpack, _from_capsule_torch
    import torch
    from torch.utils import dlpack
    _to_dlpack = dlpack.to_dlpack
    _from_capsule_torch = getattr(torch._C, "_from_dlpack", None) or dlpack.from_dlpack
    return _to_dlpack, _from_capsule_torch


class _LazyNumpy:
    """NumPy, imported at its first use: `import weft` does not load it (a third of a
    comm-only program's start-up), and no NumPy array can exist before it is loaded. The
    package's modules use `numpy` below in place of the module; each attribute is looked up
    once, then cached here."""

    def __getattr__(self, name):
        import numpy
        value = getattr(numpy, name)
        setattr(self, name, value)
        return value


numpy = _LazyNumpy()


# The dtypes weft exchanges, by name as NumPy and torch spell them; torch adds bfloat16.
_DTYPE_NAMES = ("float32", "float64", "float16", "int32", "int64", "int16", "int8", "uint8")
# The same as NumPy's and torch's dtype objects, made once each library is loaded: a set
# lookup of the array's dtype costs 0.04 us per call, where NumPy's dtype.name (Python
# code) costs 1.3 us, a quarter of a small op's time from Python. NumPy's dtypes are
# those of this machine's byte order (an array in the other order compares unequal).
_numpy_dtypes = None
_torch_dtypes = None


def _load_numpy_dtypes(np):
    global _numpy_dtypes
    _numpy_dtypes = frozenset(np.dtype(name) for name in _DTYPE_NAMES)
    return _numpy_dtypes


def _load_torch_dtypes(torch):
    global _torch_dtypes
    _torch_dtypes = frozenset(getattr(torch, name) for name in _DTYPE_NAMES + ("bfloat16",))
    return _torch_dtypes


def _unsupported(x, what, cause=None):
    why = f" ({cause})" if cause else ""
    return _errors.UnsupportedDTypeError(
        5, f"{what}: weft cannot exchange a {type(x).__name__} of dtype "
        f"{getattr(x, 'dtype', '?')}{why}; it supports {_SUPPORTED}")


def prepare(x, what="tensor"):
    """(array, capsule, kind): `array` is x or its contiguous copy; `capsule` borrows it."""
    np = sys.modules.get("numpy")
    if np is not None and type(x) is np.ndarray:
        if x.dtype not in (_numpy_dtypes or _load_numpy_dtypes(np)):
            raise _unsupported(x, what, None if x.dtype.isnative else
                               "not in this machine's byte order: convert it with astype first")
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        try:
            return x, x.__dlpack__(), NUMPY
        except BufferError as e:
            if x.flags.writeable:
                raise _unsupported(x, what, e) from None
            # DLPack (before 1.0) cannot mark memory read-only, so NumPy refuses to export
            # read-only arrays; weft only reads its input, but has to copy it here.
            x = x.copy()
            return x, x.__dlpack__(), NUMPY
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        if x.dtype not in (_torch_dtypes or _load_torch_dtypes(torch)):
            raise _unsupported(x, what)
        if x.requires_grad:
            x = x.detach()
        if not x.is_contiguous():
            x = x.contiguous()
        try:
            return x, (_to_dlpack or _load_dlpack()[0])(x), TORCH
        except (RuntimeError, BufferError) as e:
            raise _unsupported(x, what, e) from None
    if hasattr(x, "__dlpack__"):
        # Another DLPack producer (JAX, CuPy on the host, ...): a zero-copy NumPy view of
        # its memory, so that results (and in-place writes) follow NumPy's path.
        return prepare(numpy.from_dlpack(x), what)
    if isinstance(x, (list, tuple, int, float)) or (np is not None and isinstance(x, np.generic)):
        return prepare(numpy.asarray(x), what)
    raise TypeError(
        f"{what}: expected a NumPy array, a torch.Tensor or an object with __dlpack__, got "
        f"{type(x).__name__}")


def empty_like(x, cx, kind):
    """For an op that starts a request (which must hold its output's capsule before it
    starts): an uninitialized output with x's type, dtype and shape, and its capsule; cx is
    x's capsule. Where output() leaves the allocation to the op's call, weft allocates it
    here (weft_tensor_empty_like; large ones from its cache of freed outputs); the output is
    then None for a torch.Tensor, which result() wraps once the op has started (which needs
    the capsule unconsumed), at half the cost of torch's empty_like and to_dlpack."""
    y, cy = output(x, kind)
    if cy is not None:
        return y, cy
    capsule = _c.weft_tensor_empty_like(cx)
    return (None if kind == TORCH else numpy.asarray(_Owned(capsule))), capsule


def output(x, kind):
    """For a blocking op: an output with x's type, dtype and shape and its capsule, or
    (None, None) where the op's own C call allocates it (an `out` of None: a torch.Tensor on
    the host, a NumPy array of _POOLED_BYTES or more) and returns its capsule, for result()
    to wrap: one call into weft instead of two (about 0.1 us less)."""
    if kind == TORCH:
        if x.is_cpu:
            return None, None
        torch = _torch()
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        return out, (_to_dlpack or _load_dlpack()[0])(out)
    if x.nbytes >= _POOLED_BYTES:
        return None, None
    # x is a contiguous numpy.ndarray (prepare): numpy.empty gives the same layout at a
    # fifth of empty_like's cost (0.11 against 0.51 us).
    out = numpy.empty(x.shape, x.dtype)
    return out, out.__dlpack__()


def result(y, cy, kind):
    """The output of an op that has started: y, or else the array over cy's memory (the
    capsule of empty_like's output, or the one the op's call returned for output's)."""
    if y is not None:
        return y
    if kind == TORCH:
        return (_from_capsule_torch or _load_dlpack()[1])(cy)
    return numpy.asarray(_Owned(cy))


def from_capsule(capsule, kind):
    """Wraps a capsule weft allocated (no copy) as the input kind's array type (a NumPy
    array is writable)."""
    return result(None, capsule, kind)


def copy_back(target, result):
    """For in-place ops on non-contiguous inputs: writes the contiguous result back."""
    if result is target:
        return target
    if isinstance(target, numpy.ndarray):
        target[...] = result
    else:
        target.copy_(result)
    return target
