// Pieces shared by the CUDA kernels of fp4quant (codec.cu: entry points, generic and
// pre-pass kernels; fast.cu: the common-case kernel).  Plain CUDA, no torch headers.
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
};

// ---- host side (codec.cu) ----

struct DeviceInfo {
  int sms;             // multiprocessors
  int smem_optin;      // largest dynamic shared memory a block may opt in to (bytes)
  bool mem_pools;      // cudaMallocAsync works
};

// The current device's properties, read once per device.
int device_info(DeviceInfo* info);

// Persistent grid of `kernel` (a device function address): as many blocks as are
// resident on the device at once (occupancy cached per device, kernel, block and shared
// memory size), at most `tiles`.
int persistent_grid(const void* kernel, int threads, size_t smem, int64_t tiles, int* grid);

// fast.cu: whether the common-case kernel handles (mode, config), and its launch.
bool fast_supported(const Params& p, int mode);
int launch_fast(const Params& p, int mode, cudaStream_t stream);

// ---- device helpers ----

static __host__ __device__ __forceinline__ int64_t value_bytes(int32_t dtype) { return dtype == kF32 ? 4 : 2; }

// A value of a float32 / bfloat16 / float16 array, as float32 (exact).
FP4Q_DEV float load_value(const void* base, int32_t dtype, int64_t i) {
  if (dtype == kF32) return static_cast<const float*>(base)[i];
  const uint16_t h = static_cast<const uint16_t*>(base)[i];
  return dtype == kBF16 ? bf16_value(h) : half_value(h);
}

// Saturate to the dtype's finite range (NaN stays NaN), round to it and store
// (csrc/cpu/codec_generic.h: store_values).
FP4Q_DEV float saturate_f32(float v) {
  return max_keep_nan(min_keep_nan(v, 3.4028234663852886e38f), -3.4028234663852886e38f);
}
FP4Q_DEV uint16_t to_bf16_bits(float v) {
  return float_to_bf16_rne(max_keep_nan(min_keep_nan(v, 3.3895313892515355e38f), -3.3895313892515355e38f));
}
FP4Q_DEV uint16_t to_half_bits(float v) {
  return float_to_half_rne(max_keep_nan(min_keep_nan(v, 65504.0f), -65504.0f));
}

FP4Q_DEV void store_value(void* base, int32_t dtype, int64_t i, float v) {
  if (dtype == kF32) {
    static_cast<float*>(base)[i] = saturate_f32(v);
  } else {
    static_cast<uint16_t*>(base)[i] = dtype == kBF16 ? to_bf16_bits(v) : to_half_bits(v);
  }
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

// Coarse scale of a message's value v (its group's, or the tensor's); 0 without one.
FP4Q_DEV float coarse_of(const Params& p, const uint8_t* msg, int64_t v) {
  if (p.cfg.coarse == kCoarseGroup) return u2f(load_u32(msg + 4 * (v >> p.log2_group)));
  if (p.cfg.coarse == kCoarseTensor) return u2f(load_u32(msg));
  return 0.0f;
}

// Value v (< padded) of a message, decoded as csrc/cpu/codec_generic.h's decode_segment:
// code * m * c, where c is first divided by 2**E when `normalize` (inverse FWHT follows).
FP4Q_DEV float decode_value(const Params& p, const uint8_t* msg, int64_t v, bool normalize) {
  const Config& cfg = p.cfg;
  const Layout& lay = p.lay;
  float c = coarse_of(p, msg, v);
  if (normalize) c = c * pow2(-normalizing_exponent(c));
  const int64_t k = v >> p.log2_micro;  // micro-group
  uint32_t stored = 0;
  if (lay.micro_bytes == 1) stored = msg[lay.micro_off + k];
  if (lay.micro_bytes == 2) {
    stored = uint32_t(msg[lay.micro_off + 2 * k]) | (uint32_t(msg[lay.micro_off + 2 * k + 1]) << 8);
  }
  const float s = decode_micro(cfg, stored, c);
  uint32_t code;
  if (element_bits(cfg.element) == 4) {
    code = (msg[lay.codes_off + (v >> 1)] >> (4 * (v & 1))) & 0xFu;
  } else {
    code = msg[lay.codes_off + v];
  }
  return element_value(cfg.element, code) * s;
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
  t.c = transformed ? u2f(words[1]) / coarse_divisor(cfg) : (amax * pow2(-t.e)) / coarse_divisor(cfg);
  return t;
}

}  // namespace detail
}  // namespace cuda
}  // namespace fp4q
