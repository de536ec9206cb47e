// Pieces shared by the CUDA kernels of fp4quant (codec.cu: entry points, generic and
// pre-pass kernels; fast.cu: the common-case kernel; quantize.cu: the quantize kernels
// specialized at compile time for the presets).  Plain CUDA, no torch headers.  Float
// arithmetic goes through fp4quant.h's mul_rn / add_rn / ... (never contracted, whatever
// --fmad says).
//
// Both kernels work on tiles: a tile is `tile_values` consecutive padded values of one
// row (message), a whole number of segments (lay.block values: docs/format.md's block),
// so a tile never shares a coarse scale, a FWHT block or a row with another tile.  Grids
// are persistent: each block loops over tiles (tile += gridDim.x).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../fp4quant.h"
#include "../kernels.h"
#include "device.cuh"

#define FP4Q_DEV static __device__ __forceinline__

namespace fp4q {
namespace cuda {
namespace detail {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

// What a tile kernel computes.
enum Mode : int {
  kModeQuantize = 0,          // x -> messages
  kModeTransform = 1,         // tensor scale + FWHT pre-pass: x -> normalized, transformed workspace
  kModeDequantize = 2,        // messages -> values
  kModeReduceOut = 3,         // sum of messages -> values
  kModeReduceRequant = 4,     // sum of messages -> one message
  kModeReduceToWorkspace = 5  // tensor scale pre-pass of kModeReduceRequant: sum -> workspace
};

// Everything a kernel needs, from any of the three argument structs of kernels.h.
struct Params {
  Config cfg;
  Layout lay;
  int64_t rows;           // messages produced or decoded (1 for the reduce modes)
  int64_t tiles_per_row;  // ceil(lay.padded / tile_values)
  int32_t tile_values;    // a power of two, a multiple of lay.block
  int32_t log2_tile, log2_block, log2_group, log2_micro;
  // quantize input
  const void* x;
  int32_t x_dtype;
  int64_t x_row_stride;  // elements
  bool x_vec;            // every row start is 16-byte aligned: vector loads allowed
  bool transform;        // quantize: apply the FWHT (QuantizeArgs::transform)
  bool prepared;         // quantize: values come normalized and transformed from the workspace
  // messages in (dequantize: rows of them; reduce: world of them)
  const uint8_t* msgs;
  int64_t world;
  // outputs
  uint8_t* out_msgs;  // quantize: rows x nbytes; kModeReduceRequant: one message
  void* out;          // dequantize: rows x n; kModeReduceOut: n
  int32_t out_dtype;
  const float* signs;  // FWHT signs (group of them) or nullptr
  float inv_sqrt;      // fp32(1/sqrt(group)), computed on the host as the CPU codec does
  uint32_t key;        // stochastic rounding stream key
  uint64_t offset;     // counter of row 0's first padded value
  float* workspace;    // tensor-scale configs (kernels.h)
  uint32_t* words;     // tensor-scale maxima as float bits: quantize 2 per row (raw, transformed), reduce 1
  float* staging;      // generic kernel: per-block tile buffer in global memory when shared memory is too small
  bool saturate;       // dequantize: values past out_dtype's range saturate (else +-inf)
};

// ---- host side ----

// fast.cu: whether the common-case kernel handles (mode, config), and its launch.
bool fast_supported(const Params& p, int mode);
int launch_fast(const Params& p, int mode, cudaStream_t stream);

// quantize.cu: whether a compile-time specialized quantize kernel covers the config, and its launch.
bool spec_supported(const Params& p);
int launch_spec(const Params& p, cudaStream_t stream);

// ---- device helpers ----

static __host__ __device__ __forceinline__ int64_t value_bytes(int32_t dtype) { return dtype == kF32 ? 4 : 2; }

// A value of a float32 / bfloat16 / float16 array, as float32 (exact).
FP4Q_DEV float load_value(const void* base, int32_t dtype, int64_t i) {
  if (dtype == kF32) return static_cast<const float*>(base)[i];
  const uint16_t h = static_cast<const uint16_t*>(base)[i];
  return dtype == kBF16 ? bf16_value(h) : half_value(h);
}

// Round to the dtype, saturating at its finite range or not, and store (fp4quant.h: out_f32;
// csrc/cpu/codec_generic.h: store_values).
FP4Q_DEV uint16_t out_bits16(int32_t dtype, float v, bool saturate) {
  return dtype == kBF16 ? out_bf16(v, saturate) : out_half(v, saturate);
}

FP4Q_DEV void store_value(void* base, int32_t dtype, int64_t i, float v, bool saturate) {
  if (dtype == kF32) {
    static_cast<float*>(base)[i] = out_f32(v, saturate);
  } else {
    static_cast<uint16_t*>(base)[i] = out_bits16(dtype, v, saturate);
  }
}

// Whether a decoding kernel saturates its output: one message does, a sum of several does not.
FP4Q_DEV bool output_saturates(const Params& p, int mode) {
  return mode == kModeDequantize ? p.saturate : p.world == 1;
}

// Little-endian words at addresses of any alignment (messages are byte strings: a row
// of nbytes bytes need not start at a multiple of 4).
FP4Q_DEV uint32_t load_u32(const uint8_t* p) {
  if ((reinterpret_cast<uintptr_t>(p) & 3u) == 0) return *reinterpret_cast<const uint32_t*>(p);
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

FP4Q_DEV void store_u32(uint8_t* p, uint32_t v) {
  if ((reinterpret_cast<uintptr_t>(p) & 3u) == 0) {
    *reinterpret_cast<uint32_t*>(p) = v;
  } else {
    p[0] = uint8_t(v);
    p[1] = uint8_t(v >> 8);
    p[2] = uint8_t(v >> 16);
    p[3] = uint8_t(v >> 24);
  }
}

FP4Q_DEV uint32_t umax(uint32_t a, uint32_t b) { return a > b ? a : b; }

// Bits of |v| if finite, else 0: non-negative floats order like their bits, so maxima of
// these are exact, order-free and fit atomicMax on 32-bit words.
FP4Q_DEV uint32_t finite_bits(float v) {
  const uint32_t a = f2u(v) & 0x7FFFFFFFu;
  return a < 0x7F800000u ? a : 0u;
}

// Maximum over the whole block (every thread gets it).  Reuses `red` (32 words): the
// leading barrier keeps a previous call's readers safe.
FP4Q_DEV uint32_t block_max(uint32_t v, uint32_t* red) {
  for (int o = 16; o > 0; o >>= 1) v = umax(v, __shfl_xor_sync(kFullMask, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = red[0];
  for (unsigned w = 1; w < (blockDim.x >> 5); ++w) v = umax(v, red[w]);
  return v;
}

// Coarse scale of a message's value v (its group's, or the tensor's); 1 without one.
FP4Q_DEV float coarse_of(const Params& p, const uint8_t* msg, int64_t v) {
  if (p.cfg.coarse == kCoarseGroup) return u2f(load_u32(msg + 4 * (v >> p.log2_group)));
  if (p.cfg.coarse == kCoarseTensor) return u2f(load_u32(msg));
  return 1.0f;
}

// Block exponent of value v's block with a coarse scale: the largest of the `count`
// messages' (codec_generic.h: block_exponent, sum_exponent).
FP4Q_DEV int coarse_exponent(const Params& p, const uint8_t* msgs, int64_t count, int64_t v) {
  int E = normalizing_exponent(coarse_of(p, msgs, v));
  for (int64_t w = 1; w < count; ++w) {
    const int Ew = normalizing_exponent(coarse_of(p, msgs + w * p.lay.nbytes, v));
    E = Ew > E ? Ew : E;
  }
  return E;
}

FP4Q_DEV uint32_t micro_stored(const Layout& lay, const uint8_t* msg, int64_t k) {
  if (lay.micro_bytes == 1) return msg[lay.micro_off + k];
  if (lay.micro_bytes == 2) return uint32_t(msg[lay.micro_off + 2 * k]) | (uint32_t(msg[lay.micro_off + 2 * k + 1]) << 8);
  return 0;
}

// Value v (< padded) of a message in the transformed domain, decoded as
// csrc/cpu/codec_generic.h's decode_span: code * m * (c * 2**-E) where decode_normalizes.
FP4Q_DEV float decode_value(const Params& p, const uint8_t* msg, int64_t v, int E) {
  const Config& cfg = p.cfg;
  const Layout& lay = p.lay;
  float f = coarse_of(p, msg, v);
  if (decode_normalizes(cfg)) f = mul_rn(f, pow2(-E));
  const float s = decode_micro(cfg, micro_stored(lay, msg, v >> p.log2_micro), f);
  uint32_t code;
  if (element_bits(cfg.element) == 4) {
    code = (msg[lay.codes_off + (v >> 1)] >> (4 * (v & 1))) & 0xFu;
  } else {
    code = msg[lay.codes_off + v];
  }
  return mul_rn(element_value(cfg.element, code), s);
}

// The tensor-scale normalization exponent and coarse scale of a row from its maxima
// (csrc/cpu/codec_generic.h: quantize_impl, dequantize_reduce_impl).
struct TensorScale {
  int e;
  float c;
};

FP4Q_DEV TensorScale tensor_scale(const Config& cfg, const uint32_t* words, bool transformed) {
  const float amax = u2f(words[0]);
  TensorScale t;
  t.e = normalizing_exponent(amax);
  t.c = transformed ? div_rn(u2f(words[1]), coarse_divisor(cfg)) : div_rn(mul_rn(amax, pow2(-t.e)), coarse_divisor(cfg));
  return t;
}

}  // namespace detail
}  // namespace cuda
}  // namespace fp4q
