/* What the two SWIG interfaces of the Go binding share (weft.i for package cweft,
 * trainer.i for package cwefttrainer): the typemaps for int64_t, scalar out-parameters,
 * tensor data and shapes, and weftgo_tensor, which builds a DLTensor on the C stack from
 * those. weft.i says which cgo rule each typemap keeps. */

%{
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
%}

/* SWIG does not know int64_t without stdint.i (whose typedef differs by platform): give it
 * long long's typemaps, a Go int64. */
%apply long long { int64_t };

/* Scalar out-parameters: a pointer to a Go variable of exactly the C width. */
%define WEFTGO_SCALAR_OUT(CTYPE, GOTYPE)
%typemap(gotype) CTYPE* WEFTGO_OUT "*GOTYPE"
%typemap(in) CTYPE* WEFTGO_OUT %{ $1 = ($1_ltype)$input; %}
%enddef
WEFTGO_SCALAR_OUT(int, int32)
WEFTGO_SCALAR_OUT(double, float64)
WEFTGO_SCALAR_OUT(size_t, uint64)
WEFTGO_SCALAR_OUT(int64_t, int64)

/* Tensor data: a Go or C pointer passed as a real pointer argument (cgo checks it), or
 * C memory coming back from weftgo_alloc / weftgo_managed_data. */
%typemap(gotype) void* "unsafe.Pointer"
%typemap(in) void* %{ $1 = $input; %}
%typemap(out) void* %{ $result = $1; %}

/* A shape, lent for the call. */
%typemap(gotype) (const int64_t* shape, size_t ndim) "[]int64"
%typemap(in) (const int64_t* shape, size_t ndim) %{
  $1 = ($1_ltype)$input.array;
  $2 = (size_t)$input.len;
%}
%apply (const int64_t* shape, size_t ndim) { (const int64_t* target_shape, size_t target_ndim) };
