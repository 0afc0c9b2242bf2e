/* Fuzzes the C ABI's tensor descriptors: thousands of DLTensors built from the values that
 * break descriptor readers (negative, zero, huge and overflowing dims, NULL shape or data,
 * odd dtypes and lanes, strides, byte offsets, other devices) go to allreduce (in place),
 * broadcast and allgather. Every rank draws the same descriptors (one seed), so the calls
 * match across ranks. Each call must return, never crash or hang, and either fail with a
 * message or succeed; a success must come from a descriptor that describes real memory in
 * a dtype weft exchanges, and its result must be right (allreduce: size() times the input;
 * broadcast: rank 0's; allgather: size() copies). Run on 1 and 2 ranks.
 *
 *   descriptor_fuzz_test [ITERATIONS] [SEED]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define BUFFER_BYTES (1 << 16)

static uint64_t g_state;

static uint64_t Next(void) { /* xorshift64* */
  g_state ^= g_state >> 12;
  g_state ^= g_state << 25;
  g_state ^= g_state >> 27;
  return g_state * 2685821657736338717ULL;
}

static int64_t Pick64(const int64_t* values, size_t n) { return values[Next() % n]; }
static int Pick(const int* values, size_t n) { return values[Next() % n]; }
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const int64_t kDims[] = {0, 1, 1, 2, 3, 3, 4, 7, 16, -1, -3, (int64_t)1 << 31,
                                (int64_t)1 << 40, (int64_t)1 << 62, INT64_MAX, INT64_MIN};
static const int kNdims[] = {-1, 0, 1, 1, 2, 2, 3, 4, 8, 40, 1000};
static const int kCodes[] = {kDLInt, kDLUInt, kDLFloat, kDLFloat, kDLBfloat, kDLComplex, 7, 255};
static const int kBits[] = {0, 1, 8, 16, 32, 32, 64, 64, 128, 255};
static const int kLanes[] = {1, 1, 1, 1, 0, 2, 4, 65535};
/* No CUDA: a host pointer claimed as device memory is the caller's lie, not a descriptor
 * weft can check; other devices must be refused. */
static const int kDevices[] = {kDLCPU, kDLCPU, kDLCPU, kDLOpenCL, kDLVulkan, 0, 99};
static const int64_t kOffsets[] = {0, 0, 0, 0, 4, 3, 64, (int64_t)1 << 40};

/* The dtypes weft exchanges (weft.h): float 16/32/64, bfloat16, int 8/16/32/64, uint8. */
static int Exchanged(DLDataType t) {
  if (t.lanes != 1) return 0;
  switch (t.code) {
    case kDLFloat: return t.bits == 16 || t.bits == 32 || t.bits == 64;
    case kDLBfloat: return t.bits == 16;
    case kDLInt: return t.bits == 8 || t.bits == 16 || t.bits == 32 || t.bits == 64;
    case kDLUInt: return t.bits == 8;
    default: return 0;
  }
}

typedef struct {
  DLTensor t;
  int64_t shape[64];
  int64_t strides[64];
  int64_t numel;  /* -1: negative dims, overflow or no shape */
  int64_t nbytes; /* valid when sane */
  int sane;       /* describes `nbytes` of real memory, in a dtype weft exchanges */
} Case;

/* numel of the case, -1 when a dim is negative, the shape is missing or the count or the
 * byte count overflows int64. */
static int64_t Count(const Case* c, int64_t item) {
  int64_t n = 1;
  int d;
  int empty = 0;
  if (c->t.ndim < 0 || (c->t.ndim > 0 && c->t.shape == NULL)) return -1;
  for (d = 0; d < c->t.ndim; ++d) {
    if (c->t.shape[d] < 0) return -1;
    empty |= c->t.shape[d] == 0;
  }
  if (empty) return 0; /* whatever the other dims: no element */
  for (d = 0; d < c->t.ndim; ++d) {
    const int64_t s = c->t.shape[d];
    if (n > INT64_MAX / s) return -1;
    n *= s;
  }
  if (item > 0 && n > INT64_MAX / item) return -1;
  return n;
}

static void Draw(Case* c, unsigned char* buffer) {
  int d, ndim;
  int64_t item;
  uint64_t contiguous = 1; /* wraps for huge shapes, as it may: signed overflow is undefined */
  int compact = 1;
  memset(c, 0, sizeof(*c));
  /* Each field is a plausible value, or (one time in six) one that breaks readers. */
#define ODD() (Next() % 6 == 0)
  ndim = ODD() ? Pick(kNdims, COUNT(kNdims)) : 1 + (int)(Next() % 3);
  c->t.ndim = ndim;
  for (d = 0; d < 64; ++d) {
    /* Mostly small dims (something to exchange), sometimes a breaking one. */
    c->shape[d] = Next() % 12 ? 1 + (int64_t)(Next() % 5) : Pick64(kDims, COUNT(kDims));
  }
  c->t.shape = Next() % 24 == 0 ? NULL : c->shape;
  if (ndim > 64 && c->t.shape != NULL) {
    /* A shape array that long: point at a buffer of ones, large enough. */
    static int64_t ones[1000];
    for (d = 0; d < 1000; ++d) ones[d] = 1;
    c->t.shape = ones;
  }
  if (ODD()) {
    c->t.dtype.code = (uint8_t)Pick(kCodes, COUNT(kCodes));
    c->t.dtype.bits = (uint8_t)Pick(kBits, COUNT(kBits));
  } else {
    static const int good[][2] = {{kDLFloat, 32}, {kDLFloat, 64}, {kDLFloat, 16},
                                  {kDLBfloat, 16}, {kDLInt, 32}, {kDLInt, 64},
                                  {kDLInt, 16}, {kDLInt, 8},    {kDLUInt, 8}};
    const int g = (int)(Next() % COUNT(good));
    c->t.dtype.code = (uint8_t)good[g][0];
    c->t.dtype.bits = (uint8_t)good[g][1];
  }
  c->t.dtype.lanes = (uint16_t)(ODD() ? Pick(kLanes, COUNT(kLanes)) : 1);
  c->t.device.device_type = (DLDeviceType)(ODD() ? Pick(kDevices, COUNT(kDevices)) : kDLCPU);
  c->t.device.device_id = ODD() ? 3 : 0;
  c->t.byte_offset = (uint64_t)(ODD() ? Pick64(kOffsets, COUNT(kOffsets)) : 0);
  item = (int64_t)c->t.dtype.bits / 8 * (c->t.dtype.lanes == 0 ? 1 : c->t.dtype.lanes);
  c->numel = Count(c, item > 0 ? item : 1);
  /* Strides: none (contiguous), the compact ones, or something else. */
  c->t.strides = NULL;
  if (ndim > 0 && ndim <= 64 && c->t.shape == c->shape && Next() % 4 == 0) {
    for (d = ndim - 1; d >= 0; --d) {
      c->strides[d] = (int64_t)contiguous;
      contiguous *= (uint64_t)(c->shape[d] > 0 ? c->shape[d] : 1);
    }
    if (Next() % 2) {
      /* A stride off the compact layout; a dim of size 1 has no stride to keep (as in
       * PyTorch, whose tensors weft takes as they are). */
      const int bent = (int)(Next() % (unsigned)ndim);
      c->strides[bent] = (int64_t)((uint64_t)c->strides[bent] + 1 + Next() % 3);
      compact = c->shape[bent] == 1;
    }
    c->t.strides = c->strides;
  }
  c->nbytes = c->numel >= 0 ? c->numel * (item > 0 ? item : 0) : -1;
  /* Real memory when the descriptor's extent fits the buffer; otherwise NULL data (what it
   * describes does not exist, and weft must not touch it). */
  if (c->nbytes >= 0 && (int64_t)c->t.byte_offset <= BUFFER_BYTES / 2 &&
      c->nbytes <= BUFFER_BYTES / 2 && Next() % 16 != 0) {
    c->t.data = buffer;
  } else {
    c->t.data = c->numel == 0 && Next() % 2 ? buffer : NULL;
  }
  /* Strides do not matter for an empty tensor; an offset from NULL data is no address. */
  c->sane = c->numel >= 0 && c->t.device.device_type == kDLCPU && Exchanged(c->t.dtype) &&
            (compact || c->numel == 0) && (c->t.data != NULL || c->numel == 0) &&
            (c->t.data != NULL || c->t.byte_offset == 0);
}

/* Fills the described bytes with values that stay exact after summing: integers get
 * (i + rank) mod 8 in their lowest (first, little-endian) byte, floats stay 0. */
static void Fill(const Case* c, int rank) {
  unsigned char* p = (unsigned char*)c->t.data + c->t.byte_offset;
  const int64_t item = c->t.dtype.bits / 8;
  int64_t i;
  memset(p, 0, (size_t)c->nbytes);
  if (c->t.dtype.code != kDLInt && c->t.dtype.code != kDLUInt) return;
  for (i = 0; i < c->numel; ++i) p[i * item] = (unsigned char)((i + rank) & 7);
}

static int CheckAllreduce(const Case* c, int size) {
  const unsigned char* p = (const unsigned char*)c->t.data + c->t.byte_offset;
  const int64_t item = c->t.dtype.bits / 8;
  int64_t i;
  for (i = 0; i < c->numel; ++i) {
    if (c->t.dtype.code == kDLInt || c->t.dtype.code == kDLUInt) {
      /* sum over ranks r of ((i + r) & 7) */
      int want = 0, r;
      for (r = 0; r < size; ++r) want += (int)((i + r) & 7);
      if (p[i * item] != (unsigned char)want) return 0;
    } else if (p[i * item] != 0) {
      return 0;
    }
  }
  return 1;
}

int main(int argc, char** argv) {
  const long iterations = argc > 1 ? atol(argv[1]) : 3000;
  unsigned char* buffer = NULL;
  long k, accepted = 0, refused = 0;
  int size;
  g_state = argc > 2 ? strtoull(argv[2], NULL, 10) : 0x9e3779b97f4a7c15ULL;
  if (g_state == 0) g_state = 1;
  if (posix_memalign((void**)&buffer, 64, BUFFER_BYTES) != 0) return 1;
  OK(weft_init());
  g_rank = weft_rank();
  size = weft_size();
  for (k = 0; k < iterations; ++k) {
    Case c;
    weft_status s;
    const int op = (int)(Next() % 3);
    Draw(&c, buffer);
    if (c.sane && c.numel > 0) Fill(&c, g_rank);
    if (op == 0) {
      s = weft_comm_allreduce(&c.t, &c.t, 0, NULL);
    } else if (op == 1) {
      s = weft_comm_broadcast(&c.t, &c.t, 0, NULL);
    } else {
      DLManagedTensor* out = NULL;
      s = weft_comm_allgather(&out, &c.t, NULL);
      if (s == WEFT_OK) {
        CHECK(out != NULL);
        CHECK(out->dl_tensor.ndim == (c.t.ndim == 0 ? 1 : c.t.ndim) || c.t.ndim == 0);
        out->deleter(out);
      } else {
        CHECK(out == NULL);
      }
    }
    if (s == WEFT_OK) {
      ++accepted;
      if (!c.sane) {
        fprintf(stderr, "rank %d: iteration %ld: op %d accepted a descriptor that is not sane: "
                "ndim %d, dtype (%d, %d, %d), device %d, offset %llu, numel %lld, data %s, "
                "strides %s\n", g_rank, k, op, c.t.ndim, c.t.dtype.code, c.t.dtype.bits,
                c.t.dtype.lanes, (int)c.t.device.device_type,
                (unsigned long long)c.t.byte_offset, (long long)c.numel,
                c.t.data ? "set" : "NULL", c.t.strides ? "given" : "NULL");
        return 1;
      }
      if (op == 0 && c.numel > 0) CHECK(CheckAllreduce(&c, size));
    } else {
      ++refused;
      CHECK(s > WEFT_OK && s <= WEFT_ERR_UNKNOWN);
      CHECK(strlen(weft_last_error()) > 0);
      /* What weft refuses it refuses for a reason it can see: never a sane descriptor, except
       * for what the engine's own limits say (a scalar allgather, which has no dim 0). */
      if (c.sane && !(op == 2 && c.t.ndim == 0)) {
        fprintf(stderr, "rank %d: iteration %ld: op %d refused a sane descriptor (ndim %d, "
                "numel %lld): %s\n", g_rank, k, op, c.t.ndim, (long long)c.numel,
                weft_last_error());
        return 1;
      }
    }
  }
  /* The engine still works, and the ranks still agree on the call order. */
  {
    float x[4] = {1, 1, 1, 1};
    int64_t shape[1] = {4};
    DLTensor t = Tensor(x, kDLFloat, 32, 1, shape);
    OK(weft_comm_allreduce(&t, &t, 0, NULL));
    CHECK(x[0] == (float)size && x[3] == (float)size);
  }
  printf("rank %d: %ld descriptors, %ld accepted, %ld refused, no crash\n", g_rank, iterations,
         accepted, refused);
  free(buffer);
  weft_finalize();
  return 0;
}
